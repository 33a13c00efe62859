"""Rebuilds that make a tensor of their full size before they view the storage: a quantized
tensor (`_empty_affine_quantized(size)`) and a device copy (`data.to(dtype)` of an expanded
view). A divergence hunt: 1 KB files made torch allocate 35 TB (and fail) while the scan said
`safe` and loadable. Past what the file stores plus 1 GiB, torch's answer is the loader's
memory's to give: Unmodelled (suspicious), with the size; below it, modelled as before
(answered by torch.load in a fresh process, tests/core/torch_rules/oracle.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from tests.builders.torchlayout import torch_layout
from tests.core.torch_rules.oracle import run_oracle

pytestmark = pytest.mark.torch
ENGINES = ("auto", "general", "exact")


def _int(n: int) -> bytes:
    return b"\x8a\x08" + struct.pack("<q", n)   # LONG1 of 8 bytes: any int64


def _text(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def _g(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _storage(cls: str) -> bytes:
    return b"(" + _text("storage") + _g("torch", cls) + _text("0") + _text("cpu") + _int(4) + b"tQ"


def _qtensor(n: int) -> bytes:
    return (_g("torch._utils", "_rebuild_qtensor") + b"(" + _storage("QInt8Storage") + _int(0)
            + b"(" + _int(n) + b"t(" + _int(0) + b"t(" + _g("torch", "per_tensor_affine")
            + b"G" + struct.pack(">d", 0.1) + _int(0) + b"t\x89" + _g("collections", "OrderedDict")
            + b")RtR")


def _device_copy(n: int) -> bytes:
    view = (_g("torch._utils", "_rebuild_tensor_v2") + b"(" + _storage("FloatStorage") + _int(0)
            + b"(" + _int(n) + b"t(" + _int(0) + b"t\x89" + _g("collections", "OrderedDict") + b")RtR")
    return (_g("torch._utils", "_rebuild_device_tensor_from_cpu_tensor") + b"(" + view
            + _g("torch", "float64") + _text("cpu") + b"\x89tR")


def _file(tmp_path: Path, name: str, tensor: bytes, storage: bytes) -> Path:
    path = tmp_path / f"{name}.pt"
    path.write_bytes(torch_layout("archive", b"\x80\x02}" + _text("w") + tensor + b"s.",
                                  [("0", storage)]))
    return path


@pytest.mark.parametrize("build", [_qtensor, _device_copy], ids=["quantized", "device copy"])
@pytest.mark.parametrize("engine", ENGINES)
def test_an_allocation_past_the_file_is_the_loaders_memorys_to_answer(
        tmp_path: Path, build: object, engine: str) -> None:
    path = _file(tmp_path, "huge", build(2**45),  # type: ignore[operator]
                 bytes(4 if build is _qtensor else 16))   # 4 elements of the storage's dtype
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    wo = report.weights_only
    assert report.verdict == "suspicious" and wo.error_type == "Unmodelled"
    assert "allocates" in (wo.error or "") and not wo.loadable


def test_a_small_expanded_rebuild_is_still_modelled(tmp_path: Path) -> None:
    paths = [_file(tmp_path, "q", _qtensor(1000), bytes(4)),
             _file(tmp_path, "d", _device_copy(1000), bytes(16))]
    for path, want in zip(paths, run_oracle([{"path": str(p), "mode": "load"} for p in paths],
                                            tmp_path), strict=True):
        for engine in ENGINES:
            wo = scan_path(path, options=ScanOptions(engine=engine)).weights_only  # type: ignore[arg-type]
            assert wo.loadable == want["ok"], (path.name, engine, wo, want)
