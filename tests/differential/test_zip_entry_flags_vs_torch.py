"""Central-record fields torch's zip reader (miniz) acts on, vs the scan, answered by torch.load
in a fresh process (tests/core/torch_rules/oracle.py):
- general-purpose bit 5 ("compressed patched data"): miniz's file_stat fails the record with
  "unsupported feature", after its method and encryption checks, in that order;
- the DOS directory attribute (or a name ending in "/") on an entry with bytes: miniz takes it
  for a directory and extracts nothing, so torch reads an uninitialized buffer (its values
  change from run to run): no oracle can answer that, the scan calls it unsafe."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from tests.core.torch_rules.oracle import run_oracle

pytestmark = pytest.mark.torch

ENGINES = ("auto", "general", "exact")


def _saved() -> bytes:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"w": torch.arange(16.0), "b": torch.arange(4, dtype=torch.int16)}, buf)
    return buf.getvalue()


def _patched(data: bytes, record: str, edit: Callable[[bytearray, int], None]) -> bytes:
    """`data` with `edit(buffer, central record offset)` applied to `record`'s central record."""
    out = bytearray(data)
    pos = out.index(b"PK\x01\x02")
    while out[pos:pos + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack_from("<HHH", out, pos + 28)
        if out[pos + 46:pos + 46 + nlen].endswith(f"/{record}".encode()):
            edit(out, pos)
        pos += 46 + nlen + xlen + clen
    return bytes(out)


def _flags(bits: int) -> Callable[[bytearray, int], None]:
    def edit(out: bytearray, pos: int) -> None:
        struct.pack_into("<H", out, pos + 8, struct.unpack_from("<H", out, pos + 8)[0] | bits)
    return edit


def _method(method: int) -> Callable[[bytearray, int], None]:
    return lambda out, pos: struct.pack_into("<H", out, pos + 10, method)


def _both(*edits: Callable[[bytearray, int], None]) -> Callable[[bytearray, int], None]:
    def edit(out: bytearray, pos: int) -> None:
        for each in edits:
            each(out, pos)
    return edit


FLAG_CASES = {
    "bit 5 on data.pkl": ("data.pkl", _flags(0x20)),
    "bit 5 on data/0": ("data/0", _flags(0x20)),
    "bit 5 on version": ("version", _flags(0x20)),
    "bit 5 on byteorder": ("byteorder", _flags(0x20)),
    "bits 0 and 5 on data/1": ("data/1", _flags(0x21)),
    "method 99 and bit 0 on data/1": ("data/1", _both(_method(99), _flags(0x01))),
    "method 99 and bit 5 on data.pkl": ("data.pkl", _both(_method(99), _flags(0x20))),
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, object]]]:
    tmp = tmp_path_factory.mktemp("flags")
    saved = _saved()
    paths = {}
    for n, (name, (record, edit)) in enumerate(FLAG_CASES.items()):
        paths[name] = tmp / f"case{n}.pt"
        paths[name].write_bytes(_patched(saved, record, edit))
    results = run_oracle([{"path": str(p), "mode": "load"} for p in paths.values()], tmp)
    return {name: (paths[name], res) for name, res in zip(paths, results, strict=True)}


@pytest.mark.parametrize("name", list(FLAG_CASES))
@pytest.mark.parametrize("engine", ENGINES)
def test_flags_miniz_refuses_give_torchs_error(answers: dict[str, tuple[Path, dict[str, object]]],
                                               name: str, engine: str) -> None:
    path, want = answers[name]
    assert not want["ok"], want   # torch refuses each of them
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    wo = report.weights_only
    assert not wo.loadable and report.verdict != "safe", (name, wo)
    assert (wo.error_type, wo.error) == (want["type"], str(want["msg"]).split("\n")[0]), name


@pytest.mark.parametrize("record", ["data.pkl", "data/0", "version", "byteorder"])
@pytest.mark.parametrize("engine", ENGINES)
def test_an_entry_miniz_takes_for_a_directory_is_unsafe(tmp_path: Path, record: str,
                                                        engine: str) -> None:
    path = tmp_path / "dir.pt"
    path.write_bytes(_patched(_saved(), record, lambda out, pos: struct.pack_into("<I", out, pos + 38, 0x10)))
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    assert report.verdict == "unsafe"
    assert [f.record for f in report.findings if f.code is Code.ZIP_DIRECTORY_WITH_DATA] \
        == [f"archive/{record}"]
    assert report.weights_only.error_type == "Unmodelled" and not report.weights_only.loadable


def test_an_empty_directory_entry_is_no_finding(tmp_path: Path) -> None:
    """A real directory entry (no bytes) is what other zip writers add: nothing to read."""
    import zipfile

    src = io.BytesIO(_saved())
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        zout.writestr(zipfile.ZipInfo("archive/"), b"")
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    path = tmp_path / "with_dir.pt"
    path.write_bytes(out.getvalue())
    report = scan_path(path)
    assert Code.ZIP_DIRECTORY_WITH_DATA not in {f.code for f in report.findings}


def _central_entry_twice(data: bytes, record: str) -> bytes:
    """`data` with `record`'s central entry written again at the end of the directory, the
    counts and sizes of both end records (zip64 and classic) fixed."""
    d = bytearray(data)
    pos = d.index(b"PK\x01\x02")
    copy = b""
    while d[pos:pos + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack_from("<HHH", d, pos + 28)
        if d[pos + 46:pos + 46 + nlen].endswith(f"/{record}".encode()):
            copy = bytes(d[pos:pos + 46 + nlen + xlen + clen])
        pos += 46 + nlen + xlen + clen
    d[pos:pos] = copy
    eocd = d.rindex(b"PK\x05\x06")
    for at in (8, 10):
        if (n := struct.unpack_from("<H", d, eocd + at)[0]) != 0xFFFF:
            struct.pack_into("<H", d, eocd + at, n + 1)
    if (n := struct.unpack_from("<I", d, eocd + 12)[0]) != 0xFFFFFFFF:
        struct.pack_into("<I", d, eocd + 12, n + len(copy))
    z64 = d.rfind(b"PK\x06\x06", 0, eocd)
    if z64 >= 0:
        for at in (24, 32):
            struct.pack_into("<Q", d, z64 + at, struct.unpack_from("<Q", d, z64 + at)[0] + 1)
        struct.pack_into("<Q", d, z64 + 40, struct.unpack_from("<Q", d, z64 + 40)[0] + len(copy))
        struct.pack_into("<Q", d, d.rfind(b"PK\x06\x07", 0, eocd) + 8, z64)
    return bytes(d)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_central_entry_written_twice_is_one_record_not_an_overlap(tmp_path: Path,
                                                                    engine: str) -> None:
    """Every reader reads the same bytes for it: a note (ZIP_DUPLICATE_IDENTICAL), not the
    `unsafe` overlap it was (a divergence hunt: torch loads the file)."""
    path = tmp_path / "twice.pt"
    path.write_bytes(_central_entry_twice(_saved(), "version"))
    (want,) = run_oracle([{"path": str(path), "mode": "load"}], tmp_path)
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    codes = {f.code for f in report.findings}
    assert want["ok"] and report.weights_only.loadable and report.verdict == "safe", codes
    assert Code.ZIP_DUPLICATE_IDENTICAL in codes and Code.ZIP_OVERLAPPING_ENTRIES not in codes


def _directory_size_plus(data: bytes, extra: int) -> bytes:
    d = bytearray(data)
    z64 = d.rfind(b"PK\x06\x06")
    struct.pack_into("<Q", d, z64 + 40, struct.unpack_from("<Q", d, z64 + 40)[0] + extra)
    return bytes(d)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_directory_size_that_runs_into_the_end_records_is_read_as_miniz_reads_it(
        tmp_path: Path, engine: str) -> None:
    """miniz checks only that the directory fits in the file: torch loads an archive whose
    zip64 directory size runs 4 bytes into the end records (zipfile does not). The scan read
    nothing of it (`invalid`, no manifest); an os.system in its data.pkl went unreported."""
    from tests.builders.torchlayout import torch_layout

    path = tmp_path / "plus4.pt"
    path.write_bytes(_directory_size_plus(_saved(), 4))
    (want,) = run_oracle([{"path": str(path), "mode": "load"}], tmp_path)
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    assert want["ok"] and report.weights_only.loadable and len(report.tensors) == 2
    assert Code.ZIP_BAD_EOCD in {f.code for f in report.findings}   # zipfile fails on it
    evil = tmp_path / "evil.pt"
    evil.write_bytes(_directory_size_plus(
        torch_layout("archive", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R."), 4))
    assert scan_path(evil, options=ScanOptions(engine=engine)).verdict == "unsafe"  # type: ignore[arg-type]
