"""Empty storages against torch.load: torch caches a loaded storage by its key only when it
has a data pointer (serialization.py's `load_tensor`: `if typed_storage._data_ptr() != 0`),
so every persistent id of an empty storage is loaded anew, with its own storage type.

torch.save writes one key with two storage types for an empty tensor and a dtype view of it
(`x.view(torch.uint8)`: the save-time check that refuses such views skips empty storages).
The manifest must give each tensor torch's dtype, and no finding that torch "keeps the
first" declaration.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptguard.core.scan import scan_path
from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.differential.torch_answer import torch_answer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _views(shape: tuple[int, ...], dtype: Any, *others: Any) -> dict[str, Any]:
    base = torch.zeros(shape, dtype=dtype)
    return {"base": base, **{f"as_{str(d).removeprefix('torch.')}": base.view(d) for d in others}}


CASES: dict[str, Callable[[], Any]] = {
    "int64-as-float64": lambda: _views((0,), torch.int64, torch.float64),
    "int64-as-uint8": lambda: _views((0,), torch.int64, torch.uint8),
    "float32-2d-as-int32-and-bfloat16": lambda: _views((3, 0), torch.float32, torch.int32,
                                                       torch.bfloat16),
    "in-a-list-with-data": lambda: [torch.arange(3.0), *_views((0,), torch.float16,
                                                             torch.int16).values()],
}


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in _flat(val, f"{prefix}{i}.").items()}
    return {prefix[:-1]: obj}


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_declaration_of_an_empty_storage_keeps_its_dtype(case: str, zipfile: bool,
                                                              tmp_path: Path) -> None:
    path = tmp_path / "empty.pt"
    buf = io.BytesIO()
    torch.save(CASES[case](), buf, _use_new_zipfile_serialization=zipfile)
    path.write_bytes(buf.getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = _flat(torch.load(path, weights_only=True))
    report = scan_path(path)
    assert report.weights_only.loadable is torch_answer(path)[0] is True
    assert {t.name: t.dtype for t in report.tensors} == {
        name: str(t.dtype).removeprefix("torch.") for name, t in loaded.items()}
    assert not [f for f in report.findings if f.code == "TORCH_BAD_TENSOR_ARGS"], report.findings


def test_an_empty_storage_declared_again_with_elements_is_read_again(tmp_path: Path) -> None:
    """Key "0" declared empty, then with 2 floats: torch loads the record again for the
    second and refuses its 0 bytes; so does the report, with the size finding."""
    path = tmp_path / "again.pt"
    pkl = state_dict(("a", v2("0", numel=0, size=(0,))), ("b", v2("0", numel=2)))
    path.write_bytes(torch_layout("archive", pkl, [("0", b"")]))
    loadable, _, line = torch_answer(path)
    report = scan_path(path)
    assert (report.weights_only.loadable, report.weights_only.error) == (loadable, line)
    assert not loadable and "record size" in str(line)
    assert [f.code for f in report.findings if f.code.startswith("TORCH_RECORD")] == [
        "TORCH_RECORD_SIZE_MISMATCH"]
