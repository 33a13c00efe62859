"""`Tensor.set_`'s argument parser against torch's own, over every triple of argument kinds.

core.torch.rules.set_args models which overload torch's parser matches (by type, looking
at an int array's first element only), how it names mismatched arguments, and how it
unpacks stride before size; the answer must be torch's word for word, or "Unmodelled".
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ckptguard.core.torch.rules import Fail, set_args

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

KINDS: dict[str, Any] = {
    "int": 0, "int2": 2, "float": 1.5, "str": "a", "bytes": b"a", "none": None, "bool": True,
    "dict": {}, "set": set(), "empty": (), "emptylist": [], "tuple": (2,), "list": [2, 1],
    "pair": (2, 3), "floats": (1.5,), "strs": ("a",), "bools": (True,), "int-then-bool": (2, True),
    "int-then-str": (2, "a"), "int-then-none": [2, None], "int-then-tuple": (2, (3,)),
    "nested": ((2,),), "huge": (2, 1 << 70), "negative": (-1,), "mixed": (2, 2.5, "a", None),
}


def _torch_answer(offset: Any, size: Any, stride: Any) -> tuple[str, str] | None:
    t = torch.empty((0,), dtype=torch.uint8)
    try:
        t.set_(torch.UntypedStorage(1 << 12), offset, size, stride)
    except Exception as exc:   # the parser's refusal is the oracle's answer
        return type(exc).__name__, str(exc)
    return None


@pytest.mark.parametrize("offset", ["int", "int2", "float", "str", "none", "bool", "tuple", "huge"])
def test_set_args_answers_as_torchs_parser(offset: str) -> None:
    unmodelled = []
    for size, stride in itertools.product(KINDS, ["none", *KINDS]):
        args = (KINDS[offset] if offset != "huge" else 1 << 70, KINDS[size], KINDS[stride])
        want = _torch_answer(*args)
        try:
            set_args(*args)
        except Fail as exc:
            if exc.type == "Unmodelled":
                unmodelled.append(args)
                continue
            assert want is not None, (args, exc)
            # torch appends where in its C++ source an overflow was raised: not ours to predict
            assert (exc.type, exc.message) == (want[0], want[1][:len(exc.message)]), args
            assert exc.message == want[1] or "Overflow" in exc.message, args
            continue
        # accepted by the parser: whatever torch says next is about the view, not the arguments
        refused = want is not None and ("received an invalid combination" in want[1]
                                        or "failed to unpack" in want[1])
        assert not refused, (args, want)
    assert unmodelled == []   # every kind here is plain: the model covers them all
