"""A red team's 5.4 KB torch.save zip (torch.load: 19 tensors in 3 ms) whose tensors hang from
each other's python attributes, `T_k.a = T_k.b = T_(k-1)`, listed 524,287 tensors (2**19 - 1)
in a 182 MB report from 1.15 GB, `safe`; a 2.3 KB nested-tensor DAG (each level's components
the level below) listed 535,300. A tensor met again is listed again at its new path (tied
weights), but its attributes and components are walked once, as a shared container is: rows
grow with the references, not the paths. Every engine."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from tests.builders.torchlayout import torch_layout

ENGINES = ("auto", "general", "exact")
DEPTH = 18


def _text(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _memo(i: int, put: bool) -> bytes:
    return (b"r" if put else b"j") + struct.pack("<I", i)


_STORAGE = b"(" + _text("storage") + _global("torch", "FloatStorage") + _text("0") + _text("cpu") \
    + b"J\x01\x00\x00\x00tQ"
_TENSOR = _global("torch._utils", "_rebuild_tensor_v2") + b"(" + _STORAGE \
    + b"J\x00\x00\x00\x00(J\x01\x00\x00\x00t(J\x01\x00\x00\x00t\x89" \
    + _global("collections", "OrderedDict") + b")RtR"


def _attribute_dag(depth: int) -> bytes:
    p = b"\x80\x02" + _TENSOR + _memo(0, True)
    for k in range(1, depth + 1):
        inner = (b"(" + _STORAGE + b"J\x00\x00\x00\x00(J\x01\x00\x00\x00t(J\x01\x00\x00\x00t\x89"
                 + _global("collections", "OrderedDict") + b")Rt")
        p += (_global("torch._tensor", "_rebuild_from_type_v2") + b"("
              + _global("torch._utils", "_rebuild_tensor_v2") + _global("torch", "Tensor") + inner
              + b"}(" + _text("a") + _memo(k - 1, False) + _text("b") + _memo(k - 1, False)
              + b"utR" + _memo(k, True))
    return torch_layout("dag", p + b".", [("0", bytes(4))])


def _nested_dag(depth: int) -> bytes:
    p = b"\x80\x02" + _TENSOR + _memo(0, True)
    for k in range(1, depth + 1):
        prev = _memo(k - 1, False)
        p += (_global("torch._utils", "_rebuild_nested_tensor") + b"(" + _memo(0, False)
              + prev + prev + prev + b"tR" + _memo(k, True))
    return torch_layout("dag", p + b".", [("0", bytes(4))])


@pytest.mark.parametrize("build", [_attribute_dag, _nested_dag], ids=["attributes", "nested"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_dag_of_tensors_lists_rows_per_reference(build: object, engine: str) -> None:
    data = build(DEPTH)  # type: ignore[operator]
    tracemalloc.start()
    try:
        report = scan_bytes(data, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # each level references the one below at most 4 times: rows grow linearly with the depth
    assert len(report.tensors) <= 4 * DEPTH + 1, len(report.tensors)
    assert peak < 50 * 2**20, peak   # 1.15 GB on the old code
    names = [t.name for t in report.tensors]
    assert names[:3] == ["", "a", "a.a"] if build is _attribute_dag else names[:3] == ["", "buffer", "sizes"]
