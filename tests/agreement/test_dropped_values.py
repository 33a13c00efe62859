"""Values the loaded object drops: every engine gives one report, and it is torch's.

torch.load calls `persistent_load` for every storage reference it unpickles, so a tensor
the result then drops still has its storage loaded: a dict key set twice (SETITEM(S) on a
dict or an OrderedDict), an OrderedDict attribute set twice by BUILD, a tensor popped
(POP, POP_MARK; weights_only refuses them, the engines must still agree), kept only in
the memo, or left under the result on the stack at STOP.
The report lists the tensors of the loaded object (checked against torch.load) and every
storage torch loads, in the order it first loads them (core.manifest.build).
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agreement import assert_agree
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2

_OD = [("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE"]


class _Case:
    """A state_dict pickle being generated, with the storages its tensors reference."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.numel: dict[str, int] = {}   # storage key -> numel, in first-reference order
        self.memo = 0

    def tensor(self) -> list[object]:
        """A tensor on a new storage, or on one an earlier (dropped or kept) tensor used."""
        draw = self.draw
        if self.numel and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(self.numel)))
        else:
            key = str(len(self.numel))
            self.numel[key] = draw(st.sampled_from([0, 2]))
        n = self.numel[key]
        ops = v2(key, numel=n, size=(n,), stride=(1,))
        how = draw(st.integers(0, 5))
        if how == 0:
            return ["EMPTY_LIST", *ops, "APPEND"]
        if how == 1:
            return ["EMPTY_DICT", ("BINUNICODE", "inner"), *ops, "SETITEM"]
        return ops

    def dropped(self) -> list[object]:
        """Opcodes that build a tensor the result never holds; the stack is as before."""
        how = self.draw(st.sampled_from(["POP", "POP_MARK", "memo"]))
        if how == "POP":
            return [*self.tensor(), "POP"]
        if how == "POP_MARK":
            return ["MARK", *self.tensor(), *self.tensor(), "POP_MARK"]
        self.memo += 1
        return [*self.tensor(), ("BINPUT", 200 + self.memo), "POP"]

    def records(self) -> list[tuple[str, bytes]]:
        return [(key, b"\0" * (4 * n)) for key, n in self.numel.items()]


@st.composite
def _state_dicts(draw: st.DrawFn) -> tuple[bytes, list[str]]:
    """(a torch zip, the storage keys its pickle references, in order)."""
    case = _Case(draw)
    ordered = draw(st.booleans())
    body: list[object] = [("PROTO", 2)]
    if draw(st.integers(0, 4)) == 0:   # left under the result at STOP
        body += case.tensor()
    body += _OD if ordered else ["EMPTY_DICT"]
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["item", "item", "items", "dropped", "build"]))
        if what == "dropped":
            body += case.dropped()
        elif what == "build" and ordered:   # attributes, set again by a later BUILD
            name = draw(st.sampled_from(["a", "b"]))
            body += ["EMPTY_DICT", ("BINUNICODE", name), *case.tensor(), "SETITEM", "BUILD"]
        elif what == "items":
            body.append("MARK")
            for _ in range(draw(st.integers(1, 3))):
                body += [("BINUNICODE", draw(st.sampled_from(["w0", "w1"]))), *case.tensor()]
            body.append("SETITEMS")
        else:
            body += [("BINUNICODE", draw(st.sampled_from(["w0", "w1", "w2"]))), *case.tensor(),
                     "SETITEM"]
    data = torch_layout("archive", asm(*body, "STOP"), case.records())
    return data, list(case.numel)


def _torch_names(value: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Tensor names in the object torch.load returns, as the report names them."""
    if isinstance(value, torch.Tensor):
        return [".".join(path)]
    if isinstance(value, dict):
        names = [n for k, v in value.items() for n in _torch_names(v, (*path, str(k)))]
        if isinstance(value, OrderedDict):   # then what BUILD set on it
            names += [n for k, v in vars(value).items() for n in _torch_names(v, (*path, k))]
        return names
    if isinstance(value, list | tuple):
        return [n for i, v in enumerate(value) for n in _torch_names(v, (*path, str(i)))]
    return []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_state_dicts())
def test_engines_agree_on_values_the_result_drops(case: tuple[bytes, list[str]],
                                                  tmp_path_factory: Any) -> None:
    data, referenced = case
    path = tmp_path_factory.mktemp("d") / "x.pt"
    path.write_bytes(data)
    report = assert_agree(path, label="dropped values")
    assert [s["key"] for s in report["storages"]] == referenced
    try:
        loaded = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:   # POP and POP_MARK: weights_only refuses them
        assert report["verdict"] == "suspicious"
        assert not report["weights_only"]["loadable"]
        return
    assert report["verdict"] == "safe", report["findings"]
    assert [t["name"] for t in report["tensors"]] == _torch_names(loaded)


def test_a_storage_only_a_dropped_tensor_uses_is_read_by_torch(tmp_path: Path) -> None:
    """Why such a storage is listed: torch reads its record, so without it the load fails."""
    pkl = asm(("PROTO", 2), "EMPTY_DICT", ("BINUNICODE", "w"), *v2("0"), "SETITEM",
              ("BINUNICODE", "w"), *v2("1"), "SETITEM", "STOP")
    path = tmp_path / "x.pt"
    path.write_bytes(torch_layout("archive", pkl, [("1", b"\0" * 8)]))
    try:
        torch.load(path, weights_only=True)
    except RuntimeError as exc:
        assert "data/0" in str(exc)
    else:
        raise AssertionError("torch loaded a checkpoint without a record it references")
    report = assert_agree(path)
    assert not report["weights_only"]["loadable"]
