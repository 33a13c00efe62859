"""Storages and tensors in a set (red team): the exact walk named a set's members by their
index in the set's iteration order, which for symbolic calls and storages is their memory
address: the same bytes gave 20 different manifests in 30 scans. They are now named in the
order the pickle made them (core.manifest.build._in_pickle_order)."""

from __future__ import annotations

import pytest

from tests.agreement import ENGINES, scan_with
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2

KEYS = ("0", "1", "2", "3")


def _pid(key: str) -> list[object]:
    return ["MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", "FloatStorage"), ("BINUNICODE", key),
            ("BINUNICODE", "cpu"), ("BININT1", 1), "TUPLE", "BINPERSID"]


CASES = {   # storages in a FROZENSET (protocol 4); tensors in an EMPTY_SET + ADDITEMS
    "frozenset of storages": asm(("PROTO", 4), "EMPTY_DICT", ("BINUNICODE", "s"), "MARK",
                                 *[op for k in KEYS for op in _pid(k)], "FROZENSET", "SETITEM", "STOP"),
    "set of tensors": asm(("PROTO", 2), "EMPTY_DICT", ("BINUNICODE", "s"), "EMPTY_SET", "MARK",
                          *[op for k in KEYS for op in v2(k, numel=1, size=(1,))], "ADDITEMS",
                          ("BINUNICODE", "n"), "EMPTY_SET", "MARK", ("BINUNICODE", "x"), ("BININT1", 7),
                          "ADDITEMS", "SETITEM", "SETITEM", "STOP"),
    # members that hold their tensor a few tuples down: ((t,),) (found by a review)
    "set of nested tuples": asm(("PROTO", 2), "EMPTY_DICT", ("BINUNICODE", "s"), "EMPTY_SET", "MARK",
                                *[op for k in KEYS
                                  for op in (*v2(k, numel=1, size=(1,)), "TUPLE1", "TUPLE1")],
                                "ADDITEMS", "SETITEM", "STOP"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_set_members_are_named_in_pickle_order(case: str) -> None:
    data = torch_layout("archive", CASES[case], [(k, b"\0" * 4) for k in KEYS])
    manifests = {tuple((t.name, t.storage) for t in scan_with(data, engine).tensors)
                 for engine in ENGINES for _ in range(5)}
    inside = ".0.0" if "nested" in case else ""
    assert manifests == {tuple((f"s.{i}{inside}", k) for i, k in enumerate(KEYS))}
