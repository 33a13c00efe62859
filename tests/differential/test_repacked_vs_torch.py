"""A torch checkpoint re-zipped by another writer: the manifest points where torch reads.

Python's `zipfile` (or `zip -0`) writes no alignment padding, so the `calculate_storage_offsets`
chain misses every storage after the first. torch (miniz) still reads each record at its
local header. The scan reports the mismatch (TORCH_OFFSET_MISMATCH) and every tensor's
`data_offset` must be where torch reads, locally and over HTTP ranges, so `read_tensor`
returns torch's values.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.loader import open_checkpoint
from ckptguard.core.scan import scan_path
from tests.rangeserver import RangeServer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

GUARD = UrlGuard(allowlist=("127.0.0.1",))


REPACKS = ("same-order", "reversed", "with-directories")


def _repack(src: Path, dst: Path, how: str) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        names = zin.namelist()
        if how == "reversed":
            names = names[::-1]
        if how == "with-directories":   # what `zip -r` writes
            for folder in sorted({n.rsplit("/", 1)[0] + "/" for n in names}):
                zout.writestr(folder, b"")
        for name in names:
            zout.writestr(name, zin.read(name))


@pytest.fixture(scope="module")
def repacked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, object]]]:
    tmp = tmp_path_factory.mktemp("repack")
    state = {"a": torch.arange(4.0), "b": torch.arange(5.0) + 10,
             "c": torch.arange(12, dtype=torch.int16).reshape(3, 4).t(),
             "d": torch.arange(6, dtype=torch.float64)[2:]}
    original = tmp / "original.pt"
    torch.save(state, original)
    out = {}
    for order in REPACKS:
        path = tmp / f"{order}.pt"
        _repack(original, path, order)
        out[order] = (path, torch.load(path, weights_only=True))
    return out


def _check(ckpt: object, loaded: dict[str, object]) -> None:
    report = ckpt.report   # type: ignore[attr-defined]
    assert report.weights_only.loadable
    assert {t.name for t in report.tensors} == set(loaded)
    for name, tensor in loaded.items():
        got = ckpt.read_tensor(name)   # type: ignore[attr-defined]
        assert np.array_equal(got, tensor.numpy()), name   # type: ignore[attr-defined]


@pytest.mark.parametrize("order", list(REPACKS))
def test_local_repack_reads_torchs_bytes(repacked: dict[str, tuple[Path, dict[str, object]]],
                                          order: str) -> None:
    path, loaded = repacked[order]
    report = scan_path(path)
    codes = {f.code for f in report.findings}
    if order == "same-order":   # the first storage chains; the others do not
        assert "TORCH_OFFSET_MISMATCH" in codes
    with open_checkpoint(str(path)) as ckpt:
        _check(ckpt, loaded)


@pytest.mark.parametrize("order", list(REPACKS))
def test_remote_repack_reads_torchs_bytes(repacked: dict[str, tuple[Path, dict[str, object]]],
                                           order: str) -> None:
    path, loaded = repacked[order]
    with RangeServer({"/ckpt.pt": path}) as srv, \
            open_checkpoint(srv.url("/ckpt.pt"), guard=GUARD) as ckpt:
        _check(ckpt, loaded)


def test_a_shifted_local_header_is_read_as_torch_reads_it_or_refused(tmp_path: Path) -> None:
    """One record's local extra field grown by 4 bytes: torch (miniz) reads its data 4 bytes
    later than the calculated offset. A local scan reads every local header and serves
    torch's bytes; a remote read checks the record's local header and refuses the tensor
    rather than serve other bytes than torch's."""
    from ckptguard.core.loader import TensorUnreadable

    original = tmp_path / "original.pt"
    torch.save({"a": torch.arange(4.0), "b": torch.arange(100.0, 140.0)}, original)
    data = bytearray(original.read_bytes())
    header = {i.filename: i.header_offset for i in zipfile.ZipFile(original).infolist()}
    at = header["original/data/1"] + 28
    data[at:at + 2] = (int.from_bytes(data[at:at + 2], "little") + 4).to_bytes(2, "little")
    path = tmp_path / "shifted.pt"
    path.write_bytes(bytes(data))
    loaded = torch.load(path, weights_only=True)
    assert loaded["b"][0].item() != 100.0   # torch really reads elsewhere
    with open_checkpoint(str(path)) as ckpt:
        assert np.array_equal(ckpt.read_tensor("b"), loaded["b"].numpy())
    with RangeServer({"/ckpt.pt": path}) as srv, \
            open_checkpoint(srv.url("/ckpt.pt"), guard=GUARD) as ckpt:
        assert np.array_equal(ckpt.read_tensor("a"), loaded["a"].numpy())
        with pytest.raises(TensorUnreadable, match="reads differently"):
            ckpt.read_tensor("b")
