"""A torch checkpoint re-zipped by another writer: the manifest points where torch reads.

Python's `zipfile` (or `zip -0`) writes no alignment padding and other extra fields, so the
`calculate_storage_offsets` chain misses every storage after the first. torch (miniz) still
reads each record at its local header, and so does zipfile: the readers people use agree,
so the mismatch is a layout note (TORCH_OFFSET_MISMATCH, low, no verdict effect), never
`unsafe`. Measured on torch 2.13: only `torch.load(mmap=True)` with
`calculate_storage_offsets=True` (and a meta load's `_checkpoint_offset`) follows the chain
and silently reads other bytes; the note names exactly those records. Every tensor's
`data_offset` must be where torch reads, locally and over HTTP ranges, so `read_tensor`
returns torch's values.

7-Zip (`7z a -tzip`, `7z d`) likewise: no local extra fields, folder entries when a folder is
added, and at its default level (-mx=5) deflated records wherever deflate saves bytes. torch.load
inflates those; `torch.load(mmap=True)` reads a deflated storage's compressed bytes as its
values (measured on torch 2.13), which ZIP_COMPRESSED_ENTRY says. -mtc/-mta/-mcu add nothing
to the layout of a torch archive's ASCII names (7-Zip writes its NTFS times in the central
directory only), and -mm=Deflate64/BZip2/LZMA give methods torch refuses (other tests).
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.loader import open_checkpoint
from ckptguard.core.scan import scan_path
from tests.components import missing
from tests.rangeserver import RangeServer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

GUARD = UrlGuard(allowlist=("127.0.0.1",))


PYTHON_REPACKS = ("same-order", "reversed", "with-directories", "extra-fields", "zip64", "streamed")
# 7-Zip 26.02 (p7zip-full): the unpacked prefix folder or its files re-zipped, stored and at
# 7-Zip's default level; and `7z d` rewriting torch's own archive without one record
SEVENZIP_REPACKS = {
    "7z-folder-stored": ["a", "-tzip", "-mx=0"],
    "7z-folder-deflated": ["a", "-tzip", "-mx=5"],
    "7z-files-stored": ["a", "-tzip", "-mx=0"],
    "7z-files-deflated": ["a", "-tzip", "-mx=9"],
    "7z-delete-a-record": ["d", "-tzip"],
}
REPACKS = PYTHON_REPACKS + tuple(SEVENZIP_REPACKS)
# Info-ZIP's local extra fields: extended timestamp (UT) and Unix uid/gid (ux)
_INFOZIP_EXTRA = (b"UT\x09\x00\x03" + (1700000000).to_bytes(4, "little") * 2
                  + b"ux\x0b\x00\x01\x04" + (1000).to_bytes(4, "little") + b"\x04"
                  + (1000).to_bytes(4, "little"))


class _Unseekable:
    """A write-only stream: zipfile then writes data descriptors (bit 3), as `zip - ...` does."""

    def __init__(self, out: object) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        return self.out.write(data)   # type: ignore[attr-defined, no-any-return]

    def flush(self) -> None:
        self.out.flush()   # type: ignore[attr-defined]


def _repack(src: Path, dst: Path, how: str) -> None:
    with zipfile.ZipFile(src) as zin, open(dst, "wb") as raw:
        target = _Unseekable(raw) if how == "streamed" else raw
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zout:   # type: ignore[arg-type]
            names = zin.namelist()
            if how == "reversed":
                names = names[::-1]
            if how == "with-directories":   # what `zip -r` writes
                for folder in sorted({n.rsplit("/", 1)[0] + "/" for n in names}):
                    zout.writestr(folder, b"")
            for name in names:
                info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
                if how == "extra-fields":
                    info.extra = _INFOZIP_EXTRA
                with zout.open(info, "w", force_zip64=how == "zip64") as out:
                    out.write(zin.read(name))


def _sevenzip(src: Path, dst: Path, how: str) -> None:
    command = ["7z", *SEVENZIP_REPACKS[how], str(dst)]
    if how == "7z-delete-a-record":
        shutil.copyfile(src, dst)
        with zipfile.ZipFile(src) as zin:
            [serial] = [n for n in zin.namelist() if n.endswith("/.data/serialization_id")]
        subprocess.run([*command, serial], check=True, capture_output=True, timeout=60)
        return
    unpacked = dst.with_suffix(".d")
    with zipfile.ZipFile(src) as zin:
        zin.extractall(unpacked)
        names = zin.namelist()
    added = [names[0].split("/", 1)[0]] if "folder" in how else names
    subprocess.run([*command, *added], check=True, capture_output=True, timeout=60, cwd=unpacked)


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
        if order in PYTHON_REPACKS:
            _repack(original, path, order)
        elif shutil.which("7z") is not None:
            _sevenzip(original, path, order)
        else:
            continue
        out[order] = (path, torch.load(path, weights_only=True))
    return out


def _repacked(repacked: dict[str, tuple[Path, dict[str, object]]],
              order: str) -> tuple[Path, dict[str, object]]:
    if order not in repacked:
        missing("7-Zip (7z, Debian package p7zip-full) is not installed")
    return repacked[order]


def _deflated(path: Path) -> set[str]:
    """Storage keys whose records the writer deflated."""
    with zipfile.ZipFile(path) as z:
        return {i.filename.rsplit("/", 1)[1] for i in z.infolist()
                if "/data/" in i.filename and i.compress_type == zipfile.ZIP_DEFLATED}


def _check(ckpt: object, loaded: dict[str, object], deflated: set[str]) -> None:
    """Every tensor reads torch's values; one in a deflated record has no offset in the file
    (torch.load inflates the record, and so does read_tensor)."""
    report = ckpt.report   # type: ignore[attr-defined]
    assert report.weights_only.loadable
    assert {t.name for t in report.tensors} == set(loaded)
    for tensor_entry in report.tensors:
        name = tensor_entry.name
        assert (tensor_entry.data_offset is None) is (tensor_entry.storage in deflated), name
        got = ckpt.read_tensor(name)   # type: ignore[attr-defined]
        assert np.array_equal(got, loaded[name].numpy()), name   # type: ignore[attr-defined]


@pytest.mark.parametrize("order", list(REPACKS))
def test_local_repack_reads_torchs_bytes(repacked: dict[str, tuple[Path, dict[str, object]]],
                                          order: str) -> None:
    path, loaded = _repacked(repacked, order)
    report = scan_path(path)
    codes = {f.code for f in report.findings}
    if order in ("same-order", "7z-folder-stored", "7z-files-stored", "7z-delete-a-record"):
        assert "TORCH_OFFSET_MISMATCH" in codes   # the first storage chains; the others do not
    with open_checkpoint(str(path)) as ckpt:
        _check(ckpt, loaded, _deflated(path))


@pytest.mark.parametrize("order", list(REPACKS))
def test_a_repack_torch_loads_is_not_unsafe(repacked: dict[str, tuple[Path, dict[str, object]]],
                                            order: str) -> None:
    """torch.load reads the right bytes (the fixture loaded it): no finding may say `unsafe`;
    apart from the empty folder entries `zip -r` and 7-Zip add, the repack is as clean as the
    original."""
    path, _ = _repacked(repacked, order)
    report = scan_path(path)
    assert [f.code for f in report.findings if f.code.effect == "unsafe"] == []
    with zipfile.ZipFile(path) as z:
        folders = any(name.endswith("/") for name in z.namelist())
    assert folders is (order == "with-directories" or "folder" in order)
    assert report.verdict == ("suspicious" if folders else "safe"), \
        [(f.code, f.message) for f in report.findings]


@pytest.mark.parametrize("order", list(REPACKS))
def test_the_offset_note_names_the_records_the_calculated_path_misreads(
        repacked: dict[str, tuple[Path, dict[str, object]]], order: str) -> None:
    """torch's own calculated offsets (a meta load records them as `_checkpoint_offset`) differ
    from the local header's exactly for the records the scan notes; with mmap=True and
    calculate_storage_offsets=True torch reads those tensors' bytes from there."""
    from torch.utils.serialization import config

    path, loaded = _repacked(repacked, order)
    report = scan_path(path)
    noted = {f.record.rsplit("/", 1)[1] for f in report.findings
             if f.code == "TORCH_OFFSET_MISMATCH" and f.record}
    by_storage = {t.storage: t.name for t in report.tensors}

    def misread(*, calculate: bool) -> set[str]:
        was = config.load.calculate_storage_offsets
        config.load.calculate_storage_offsets = calculate
        try:
            mapped = torch.load(path, weights_only=True, mmap=True)
        finally:
            config.load.calculate_storage_offsets = was
        return {key for key, name in by_storage.items()
                if not torch.equal(mapped[name], loaded[name])}   # type: ignore[call-overload]

    deflated = _deflated(path)
    assert bool(deflated) is order.endswith("-deflated")
    compressed = {f.record.rsplit("/", 1)[1] for f in report.findings
                  if f.code == "ZIP_COMPRESSED_ENTRY" and f.record and "/data/" in f.record}
    assert compressed == deflated
    # mmap=True maps the file: a deflated storage's compressed bytes become its values
    assert misread(calculate=False) == deflated
    if deflated:   # torch chains offsets over compressed records too; the scan does not
        [note] = [f.message for f in report.findings if f.code == "TORCH_OFFSET_UNVERIFIABLE"]
        assert "torch.load(mmap=True) reads their compressed bytes" in note
        assert _named_deflated(note) == {f"data/{key}" for key in deflated}, note
        assert misread(calculate=True) >= deflated
        return
    meta = torch.load(path, weights_only=True, map_location="meta")
    where = {s.key: s.data_offset for s in report.storages}
    calculated = {key: meta[name].untyped_storage()._checkpoint_offset
                  for key, name in by_storage.items()}
    assert noted == {key for key in calculated if calculated[key] != where[key]}
    assert misread(calculate=True) == noted


@pytest.mark.parametrize("order", list(REPACKS))
def test_remote_repack_reads_torchs_bytes(repacked: dict[str, tuple[Path, dict[str, object]]],
                                           order: str) -> None:
    path, loaded = _repacked(repacked, order)
    with RangeServer({"/ckpt.pt": path}) as srv, \
            open_checkpoint(srv.url("/ckpt.pt"), guard=GUARD) as ckpt:
        _check(ckpt, loaded, _deflated(path))


def _named_deflated(note: str) -> set[str]:
    return set(note.rsplit("; ", 1)[1].split(" deflated:")[0].split(" and ")[0].split(", "))


def test_the_mmap_note_counts_what_it_does_not_name(tmp_path: Path) -> None:
    """Ten deflated storages (zipfile.ZIP_DEFLATED): the note names eight and counts the rest,
    torch.load(mmap=True) misreads every one of them, read_tensor reads torch.load's values."""
    original = tmp_path / "original.pt"
    state = {f"t{i}": torch.zeros(64) + i for i in range(10)}
    torch.save(state, original)
    path = tmp_path / "deflated.pt"
    with zipfile.ZipFile(original) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
    mapped = torch.load(path, weights_only=True, mmap=True)
    assert not any(torch.equal(mapped[k], v) for k, v in state.items())
    [note] = [f.message for f in scan_path(path).findings if f.code == "TORCH_OFFSET_UNVERIFIABLE"]
    assert len(_named_deflated(note)) == 8 and " and 2 more deflated:" in note, note
    with open_checkpoint(str(path)) as ckpt:
        _check(ckpt, state, _deflated(path))   # type: ignore[arg-type]


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


def test_a_deflated_record_that_does_not_inflate_is_refused(tmp_path: Path) -> None:
    """read_tensor inflates a deflated storage as torch.load does; a stream that is no deflate
    data is TensorUnreadable with the reason, never an exception from zlib."""
    from ckptguard.core.loader import TensorUnreadable

    original = tmp_path / "original.pt"
    torch.save({"w": torch.zeros(256)}, original)
    path = tmp_path / "broken.pt"
    with zipfile.ZipFile(original) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        [record] = [i for i in zout.infolist() if i.filename.endswith("/data/0")]
    data = bytearray(path.read_bytes())
    start = record.header_offset + 30 + len(record.filename.encode())
    data[start:start + record.compress_size] = b"\xff" * record.compress_size
    path.write_bytes(bytes(data))
    with open_checkpoint(str(path)) as ckpt, pytest.raises(TensorUnreadable, match="deflate"):
        ckpt.read_tensor("w")
