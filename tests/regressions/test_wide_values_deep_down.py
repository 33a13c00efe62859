"""Many values deep down (found by a red-team round): `{'x': ((...([None] * 60_000,)...),)}`
with the list under 9,990 nested tuples is a 71 KB torch zip that torch loads in 0.2 s.
Both walks that name tensors (core.manifest.build, the fast lane's) gave every child a copy
of its parent's path: 600 M path items, 4.6 GB and 6-7 s on every engine (and `invalid`
under the CLI's 2 GB limit). A child's path is now a link to its parent's
(core.manifest.paths), spelled out only for a tensor."""

from __future__ import annotations

import tracemalloc

import pytest

from ckptguard.core.report import NAME_MARK
from tests.agreement import ENGINES, assert_agree, scan_with
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2

DEPTH = 9_990   # under Limits.max_depth
WIDTH = 60_000


def _deep(children: bytes, tensor: bool = False) -> bytes:
    """{'x': ((...(<list of children>,)...),)[, 'w': a tensor at the same depth]}, protocol 2."""
    nested = b"](" + children + b"e" + b"\x85" * DEPTH
    body = b"X\x01\x00\x00\x00x" + nested
    if tensor:   # one tensor as deep as the list: its path is spelled out, 9,990 segments
        body += b"X\x01\x00\x00\x00w" + asm(*v2("0")) + b"\x85" * DEPTH
    return b"\x80\x02}q\x00(" + body + b"u."


CASES = {
    "nones": _deep(b"N" * WIDTH),
    "empty lists": _deep(b"]" * WIDTH),            # each its own container, none memoized
    "nones and a deep tensor": _deep(b"N" * WIDTH, tensor=True),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_wide_list_deep_down_costs_what_the_pickle_holds(case: str, engine: str) -> None:
    tensor = "tensor" in case
    data = torch_layout("archive", CASES[case], [("0", b"\0" * 8)] if tensor else [])
    tracemalloc.start()
    try:
        report = scan_with(data, engine)   # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.verdict == "safe", report.findings
    assert peak < 150 * 2**20, f"{peak / 2**20:.0f} MiB for a {len(data) // 1024} KB file"
    # the deep tensor: its 9,991 segments, bounded in the report (a prefix, then a digest)
    assert [(t.path[0], t.path[1], NAME_MARK in t.path[-1]) for t in report.tensors] \
        == ([("w", 0, True)] if tensor else [])


def test_the_engines_agree_on_them() -> None:
    for case, pickle in CASES.items():
        tensor = "tensor" in case
        assert_agree(torch_layout("archive", pickle, [("0", b"\0" * 8)] if tensor else []), label=case)
