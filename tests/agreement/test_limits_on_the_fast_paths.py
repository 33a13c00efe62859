"""Past a cap of `Limits`, every engine gives one report (helper hunt, fast-path walk).

The exact interpreters (core.pickle.vm, core.torch.weights_only) stop at the interpreter
caps (MARK nesting, stack, opcodes, memo entries, container items, one string) with a
LIMIT_* finding and verdict invalid. The C-speed paths (core.pickle.fast.stubs behind the
general path, core.pickle.fast.column_stubs behind the torch-zip lane) check none of them:
a pickle past a cap is walked and loaded in C, and the report says `safe`. With the default
limits a 20 KB pickle shows it (MARK nesting past max_depth: torch loads it); the other caps
need tens of megabytes by default, so they are shown with smaller limits.
"""

from __future__ import annotations

import pytest

from ckptguard.core import records
from ckptguard.core.judge import SMALL_PICKLE_BYTES
from ckptguard.core.limits import DEFAULT_LIMITS
from tests.agreement import assert_agree
from tests.builders.torchlayout import torch_layout

_WHY = ("the C-speed paths check none of the interpreters' caps (max_depth for MARK nesting, "
        "max_stack, max_opcodes, max_memo_entries, max_container_items, max_str_bytes); the "
        "opcode walk cannot count MARK nesting or opcodes at C speed, so the fix is a design "
        "choice: count them in the walk, or decline past a bound derived from the size")


def _marks(depth: int, pad: int = 0) -> bytes:
    """{'pad': 'x' * pad, 'a': ((...(),...),)} built with `depth` nested MARK ... TUPLE."""
    return (b"\x80\x02}q\x00(X\x03\x00\x00\x00padX" + pad.to_bytes(4, "little") + b"x" * pad
            + b"X\x01\x00\x00\x00a" + b"(" * depth + b"t" * depth + b"u.")


@pytest.mark.xfail(strict=True, reason=_WHY)
@pytest.mark.parametrize("container", ["pickle", "torch-zip"])
def test_mark_nesting_past_max_depth_gets_one_report(container: str) -> None:
    pkl = _marks(DEFAULT_LIMITS.max_depth + 1)
    assert len(pkl) >= SMALL_PICKLE_BYTES   # large enough for the fast paths to run first
    report = assert_agree(pkl if container == "pickle" else torch_layout("archive", pkl))
    assert report["verdict"] == "invalid"


def _flat(count: int) -> bytes:
    return b"\x80\x02]q\x00(" + b"N" * count + b"e."


_N = 2 * SMALL_PICKLE_BYTES
# cap -> (a pickle just past a cap of 1,000, that cap's field)
_PAST_A_CAP = {
    "max_depth": (_marks(1_001, _N), "max_depth"),
    "max_stack": (b"\x80\x02" + b"N" * _N + b".", "max_stack"),
    "max_opcodes": (_flat(_N), "max_opcodes"),
    "max_container_items": (_flat(_N), "max_container_items"),
    "max_memo_entries": (b"\x80\x02]q\x00(" + b"".join(b"Nr" + i.to_bytes(4, "little")
                                                      for i in range(1, 1_500)) + b"e.",
                         "max_memo_entries"),
    "max_str_bytes": (b"\x80\x02X" + _N.to_bytes(4, "little") + b"x" * _N + b".", "max_str_bytes"),
}


@pytest.mark.xfail(strict=True, reason=_WHY)
@pytest.mark.parametrize("cap", sorted(_PAST_A_CAP))
def test_a_pickle_past_any_interpreter_cap_gets_one_report(cap: str) -> None:
    pkl, field = _PAST_A_CAP[cap]
    assert len(pkl) >= SMALL_PICKLE_BYTES
    limits = records.replace(DEFAULT_LIMITS, **{field: 1_000})
    report = assert_agree(pkl, limits=limits)
    assert report["verdict"] == "invalid"
