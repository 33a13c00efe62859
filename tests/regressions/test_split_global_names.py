"""A rebuild function or storage class named with another split of its dotted path (found
by a red-team round).

torch's restricted unpickler looks a GLOBAL up by the joined string `f"{module}.{name}"`,
so `GLOBAL 'torch' '_utils._rebuild_tensor_v2'` is the allowlisted `_rebuild_tensor_v2`
(and `pickle.load` at protocol 4 resolves the dotted name to the same function). ckptguard
judges the call as torch does (a view past its storage is refused, as torch refuses it),
but the manifest recognised rebuild calls by (module, name): the report was `safe` and
loadable with a bare storage row instead of the tensor torch returns, and a storage class
split so (`torch` + `cuda.FloatStorage`) crashed the emulation. Every reader of names now
splits an allowlisted path at its last dot (core.pickle.renames.torch_split)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptguard.core.scan import scan_path
from ckptguard.core.state import Engine, ScanOptions
from tests.builders.torchlayout import state_dict, torch_layout, v2

REBUILD = ("GLOBAL", "torch._utils", "_rebuild_tensor_v2")
SPLIT = ("GLOBAL", "torch", "_utils._rebuild_tensor_v2")


def split_view() -> bytes:
    """`w` = storage[1:3] of a 4-float storage, its rebuild function named by the split."""
    ops: list[Any] = [SPLIT if o == REBUILD else o
                      for o in v2("0", numel=4, offset=1, size=(2,), stride=(1,))]
    return torch_layout("archive", state_dict(("w", ops)),
                        [("0", bytes(range(16)))])


@pytest.mark.torch
@pytest.mark.parametrize("engine", ["auto", "general", "exact"])
def test_split_rebuild_name_is_the_tensor_torch_loads(tmp_path: Path, engine: Engine) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "split.pt"
    path.write_bytes(split_view())
    loaded = torch.load(path, weights_only=True)
    w = loaded["w"]
    assert (list(w.shape), list(w.stride()), w.storage_offset()) == ([2], [1], 1)
    report = scan_path(path, options=ScanOptions(engine=engine))
    rows = {t.name: t for t in report.tensors}
    assert "w" in rows, f"manifest rows: {sorted(rows)}"
    row = rows["w"]
    assert (row.dtype, list(row.shape), list(row.stride), row.storage_offset) == \
        ("float32", [2], [1], 1)
    data = path.read_bytes()
    assert row.data_offset is not None
    assert data[row.data_offset:row.data_offset + row.nbytes] == \
        bytes(w.untyped_storage())[4:12]


STORAGE = ("GLOBAL", "torch", "FloatStorage")
SPLIT_STORAGES = {
    # weights_only.op_persid indexes STORAGE_DTYPE by the bare name: KeyError, INTERNAL_ERROR
    "cuda_float_storage": (("GLOBAL", "torch", "cuda.FloatStorage"), 2),
    # "not a storage class": suspicious, and no manifest row for the tensor torch returns
    "untyped_storage": (("GLOBAL", "torch", "storage.UntypedStorage"), 8),
}


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(SPLIT_STORAGES))
def test_split_storage_class_name(tmp_path: Path, case: str) -> None:
    torch = pytest.importorskip("torch")
    storage_global, numel = SPLIT_STORAGES[case]
    ops = [storage_global if o == STORAGE else o for o in v2("0", numel=numel)]
    path = tmp_path / "split_storage.pt"
    path.write_bytes(torch_layout("archive", state_dict(("w", ops)), [("0", bytes(range(8)))]))
    w = torch.load(path, weights_only=True)["w"]
    report = scan_path(path, options=ScanOptions(engine="exact"))
    assert "INTERNAL_ERROR" not in {f.code for f in report.findings}
    assert report.weights_only is not None and report.weights_only.loadable is True
    rows = {t.name: t for t in report.tensors}
    assert "w" in rows and list(rows["w"].shape) == list(w.shape)
