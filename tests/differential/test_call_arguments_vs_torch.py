"""What a call or a BUILD holds is what its arguments were at that moment (red team): a
memoized list or dict changed by a later APPEND or SETITEM does not change the object torch
built from it (set(list), Counter(dict), OrderedDict(pairs), an OrderedDict BUILD's state,
_rebuild_tensor_v2's metadata bits), and NEWOBJ of OrderedDict drops its arguments. Every
engine's manifest is compared with the tensors torch.load(weights_only=True) returns."""

from __future__ import annotations

import io
from typing import Any

import pytest

from tests.agreement import assert_agree
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2
from tests.builders.torchsave import loaded_tensors

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

OD = [("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE"]
PAD = [("BINUNICODE", "pad"), ("BINUNICODE", "p" * 4200)]   # >= 4096 bytes: 'auto' tries the fast paths


def K(s: str) -> tuple[str, str]:
    return ("BINUNICODE", s)


def t(key: str, meta: list[Any] | None = None) -> list[Any]:
    ops = v2(key, numel=4, size=(4,))
    if meta is None:
        return ops
    return [*ops[:-2], *meta, *ops[-2:]]   # a 7th argument: the metadata dict


CASES: dict[str, list[Any]] = {
    "NEWOBJ OrderedDict(tensor)": [K("x"), ("GLOBAL", "collections", "OrderedDict"), *t("0"), "TUPLE1",
                                    "NEWOBJ", K("y"), *t("1")],
    "OrderedDict BUILD {} then SETITEM": [K("m"), *OD, "EMPTY_DICT", ("BINPUT", 70), "BUILD",
                                          K("late"), ("BINGET", 70), K("w"), *t("0"), "SETITEM"],
    "set(list) then APPEND": [K("s"), ("GLOBAL", "builtins", "set"), "EMPTY_LIST", ("BINPUT", 72), *t("0"),
                              "APPEND", "TUPLE1", "REDUCE", K("h"), ("BINGET", 72), *t("1"), "APPEND"],
    "Counter(dict) then SETITEM": [K("o"), ("GLOBAL", "collections", "Counter"), "EMPTY_DICT", ("BINPUT", 74),
                                   K("x"), ("BININT1", 3), "SETITEM", "TUPLE1", "REDUCE",
                                   K("h"), ("BINGET", 74), K("y"), *t("0"), "SETITEM"],
    "OrderedDict([]) then APPEND": [K("o"), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_LIST",
                                    ("BINPUT", 74), "TUPLE1", "REDUCE",
                                    K("h"), ("BINGET", 74), K("y"), *t("0"), "TUPLE2", "APPEND"],
    "metadata {} then conj": [K("a"), *t("0", ["EMPTY_DICT", ("BINPUT", 51)]),
                              K("h"), ("BINGET", 51), K("conj"), "NEWTRUE", "SETITEM"],
    "metadata {neg} then conj": [K("a"), *t("0", ["EMPTY_DICT", ("BINPUT", 51), K("neg"), "NEWTRUE",
                                                  "SETITEM"]),
                                 K("h"), ("BINGET", 51), K("conj"), "NEWTRUE", "SETITEM"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_calls_hold_their_arguments_as_they_were(case: str) -> None:
    ops = CASES[case]
    pkl = asm(("PROTO", 2), "EMPTY_DICT", "MARK", *PAD, *ops, "SETITEMS", "STOP")
    keys = [k for k in ("0", "1") if ("BINUNICODE", k) in ops]   # the storage keys it names
    data = torch_layout("archive", pkl, [(k, bytes(range(16))) for k in keys])
    loaded = loaded_tensors(torch.load(io.BytesIO(data), weights_only=True))
    view = assert_agree(data, label=case)   # every engine: one report
    assert view["verdict"] == "safe", view["findings"]
    assert len(view["tensors"]) == len(loaded), [row["name"] for row in view["tensors"]]
    flags = sorted(sorted(f for f, on in (("conj", x.is_conj()), ("neg", x.is_neg())) if on) for x in loaded)
    assert sorted(sorted(row["flags"]) for row in view["tensors"]) == flags
    # the storages torch loads are listed, a dropped value's too
    assert [row["key"] for row in view["storages"]] == keys
