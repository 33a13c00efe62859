"""What torch 2.13 (PyTorchStreamReader over miniz) does with hostile zips, vs what we report.

Each test builds the anomaly by hand, asks real torch, and checks that core.zip.directory reads
what torch reads and core.zip.checks names the anomaly. The docstrings of core/zip/directory.py and
core/zip/checks.py cite these tests.
"""

from __future__ import annotations

import random
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ckptguard.core.errors import CkptError, Code
from ckptguard.core.io.source import FileSource
from ckptguard.core.state import Analysis
from ckptguard.core.zip.checks import check_archive, verify_crcs
from ckptguard.core.zip.directory import read_directory, read_local_headers, read_record
from tests.core.zip.zipbuild import Member, build_zip

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ALT = struct.pack("<6f", *[9.0] * 6)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, bytes]]:
    path = tmp_path_factory.mktemp("rec") / "ex.pt"
    torch.save({"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(5)}, path)
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def _members(records: list[tuple[str, bytes]]) -> list[Member]:
    return [Member(n, d) for n, d in records]


def _write(tmp_path: Path, data: bytes, name: str = "t.pt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path)


def _scan(path: Path) -> tuple[Any, Analysis]:
    src = FileSource(path)
    d = read_directory(src)
    an = Analysis()
    check_archive(d, read_local_headers(src, d.entries), an)
    return d, an


def test_duplicates_torch_reads_what_by_name_says(records: list[tuple[str, bytes]],
                                                  tmp_path: Path) -> None:
    """Not 'the last' (the issue's claim) nor the first: miniz's heap sort decides."""
    picked_first = picked_last = 0
    for pos in range(len(records) + 1):
        ms = _members(records)
        ms.insert(pos, Member("ex/data/0", ALT))
        path = _write(tmp_path, build_zip(ms))
        d, an = _scan(path)
        chosen = d.by_name["ex/data/0"]
        ours = read_record(FileSource(path), d, "ex/data/0")
        loaded = _load(path)["a"].flatten().tolist()
        assert struct.pack("<6f", *loaded) == ours
        assert torch._C.PyTorchFileReader(str(path)).get_record_header_offset("data/0") == \
            chosen.header_offset
        assert an.has(Code.ZIP_DUPLICATE_NAME)
        dups = [e.index for e in d.entries if e.name == "ex/data/0"]
        picked_first += chosen.index == dups[0]
        picked_last += chosen.index == dups[-1]
    assert picked_first and picked_last      # both happen: position-dependent


def test_random_duplicates_and_case_variants_match_torch(records: list[tuple[str, bytes]],
                                                         tmp_path: Path) -> None:
    rng = random.Random(5)
    for trial in range(60):
        ms = _members(records)
        for _ in range(rng.randint(1, 5)):
            name, data = rng.choice(records)
            if rng.random() < 0.4:
                name = "ex/" + "".join(c.upper() if rng.random() < 0.5 else c for c in name[3:])
            ms.insert(rng.randint(0, len(ms)), Member(name, data))
        path = _write(tmp_path, build_zip(ms), f"r{trial}.pt")
        d = read_directory(FileSource(path))
        locs = read_local_headers(FileSource(path), d.entries)
        reader = torch._C.PyTorchFileReader(str(path))
        for e in d.entries:
            if not e.name.startswith("ex/"):
                continue
            hit = d.find(e.name)
            assert hit is not None
            assert reader.get_record_offset(e.name[3:]) == locs[hit.index].data_offset


def test_case_variant_shadows_the_real_name(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    ms = [Member("ex/DATA/0" if n == "ex/data/0" else n, d) for n, d in records]
    path = _write(tmp_path, build_zip(ms))
    assert _load(path)["a"].sum().item() == 15.0          # torch finds data/0 as DATA/0
    d = read_directory(FileSource(path))
    assert "ex/data/0" not in d.by_name and d.find("ex/data/0") is d.by_name["ex/DATA/0"]


def test_prepended_bytes(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    # absolute offsets, file still starts with PK\x03\x04: torch.load reads the zip (polyglot)
    path = _write(tmp_path, build_zip(_members(records), prepend=b"PK\x03\x04" + b"X" * 100))
    assert _load(path)["a"].sum().item() == 15.0
    _, an = _scan(path)
    assert [f.code for f in an.findings] == [Code.ZIP_PREPENDED_DATA]
    # not starting with PK: torch.load takes the legacy path and fails; miniz alone reads it
    path = _write(tmp_path, build_zip(_members(records), prepend=b"MZ" + b"X" * 100))
    with pytest.raises(Exception):  # noqa: B017 - whatever the legacy unpickler trips on
        _load(path)
    assert torch._C.PyTorchFileReader(str(path)).get_record_offset("data/0") > 0
    _, an = _scan(path)
    assert an.has(Code.ZIP_PREPENDED_DATA)
    # offsets that do not count the prefix (`cat stub x.zip`): miniz fails; Python's zipfile
    # shifts every offset by the prefix length, and so do we (issue 18)
    path = _write(tmp_path, build_zip(_members(records), prepend=b"X" * 100, relative_offsets=True))
    with pytest.raises(RuntimeError, match="failed reading zip archive"):
        torch._C.PyTorchFileReader(str(path))
    with zipfile.ZipFile(path) as zf:
        assert {i.header_offset for i in zf.infolist()} == {
            e.header_offset for e in read_directory(FileSource(path)).entries}
    assert read_directory(FileSource(path)).shift == 100


def test_appended_bytes_and_comment_are_ignored(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    path = _write(tmp_path, build_zip(_members(records), append=b"Y" * 100, comment=b"hi"))
    assert _load(path)["b"].sum().item() == 5.0
    _, an = _scan(path)
    assert {f.code for f in an.findings} == {Code.ZIP_APPENDED_DATA, Code.ZIP_COMMENT}


def test_crc_is_not_checked(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    ms = _members(records)
    for m in ms:
        m.crc = 0x12345678
        m.flags = m.local_flags = 0x0808       # keep local CRC out of it (deferred)
        m.local_sizes = (0, 0)
        m.descriptor = True
    path = _write(tmp_path, build_zip(ms))
    assert _load(path)["a"].sum().item() == 15.0
    src = FileSource(path)
    d = read_directory(src)
    an = Analysis()
    verify_crcs(src, d, an)
    assert {f.code for f in an.findings} == {Code.ZIP_CRC_MISMATCH}


@pytest.mark.parametrize(("field", "value", "code"), [
    ("local_name", b"ex/data/9", Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    ("local_sizes", (1, 1), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    ("local_flags", 0x0808, Code.ZIP_LOCAL_CENTRAL_COSMETIC),   # no reader reads other bytes
    ("local_method", 8, Code.ZIP_LOCAL_CENTRAL_MISMATCH)])
def test_local_header_disagreement_is_ignored_by_torch(records: list[tuple[str, bytes]],
                                                       tmp_path: Path, field: str, value: object,
                                                       code: Code) -> None:
    ms = _members(records)
    target = next(m for m in ms if m.raw_name == b"ex/data/0")
    setattr(target, field, value)
    path = _write(tmp_path, build_zip(ms))
    assert _load(path)["a"].sum().item() == 15.0          # central directory wins
    _, an = _scan(path)
    assert [f.code for f in an.findings] == [code]


def test_gap_between_records_is_ignored(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    ms = _members(records)
    ms[3].gap_before = b"G" * 50
    path = _write(tmp_path, build_zip(ms))
    assert _load(path)["a"].sum().item() == 15.0
    _, an = _scan(path)
    assert [f.code for f in an.findings] == [Code.ZIP_UNREFERENCED_DATA]


@pytest.mark.parametrize(("mutate", "torch_msg", "code"), [
    ("encrypted", "unsupported encryption", Code.ZIP_ENCRYPTED_ENTRY),
    ("bzip2", "unsupported method", Code.ZIP_UNSUPPORTED_METHOD),
])
def test_entries_torch_cannot_read(records: list[tuple[str, bytes]], tmp_path: Path,
                                   mutate: str, torch_msg: str, code: Code) -> None:
    ms = _members(records)
    target = next(m for m in ms if m.raw_name == b"ex/data/0")
    if mutate == "encrypted":
        target.flags = 0x0801
    else:
        target.method, target.payload = 12, target.data
    path = _write(tmp_path, build_zip(ms))
    with pytest.raises(RuntimeError, match=torch_msg):
        _load(path)
    d, an = _scan(path)
    assert an.has(code)
    with pytest.raises(CkptError) as exc:
        read_record(FileSource(path), d, "ex/data/0")
    assert exc.value.code is code


def test_deflated_records_load(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    ms = _members(records)
    for m in ms:
        m.method = 8
    path = _write(tmp_path, build_zip(ms))
    assert _load(path)["a"].sum().item() == 15.0
    d, an = _scan(path)
    assert {f.code for f in an.findings} == {Code.ZIP_COMPRESSED_ENTRY}
    assert read_record(FileSource(path), d, "ex/data/0") == dict(records)["ex/data/0"]


@pytest.mark.parametrize("name", ["other/x", "../x"])
def test_outside_prefix_fails_torch_with_the_same_words(records: list[tuple[str, bytes]],
                                                         tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, build_zip([*_members(records), Member(name, b"1")]))
    with pytest.raises(RuntimeError) as exc:
        _load(path)
    _, an = _scan(path)
    [f] = [f for f in an.findings if f.code is Code.ZIP_NAME_OUTSIDE_PREFIX]
    assert str(exc.value).rstrip().endswith(f.message)


def test_archives_miniz_refuses_we_refuse(records: list[tuple[str, bytes]], tmp_path: Path) -> None:
    data = bytearray(build_zip(_members(records)))
    cd = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, cd + 20, 1)          # stored: csize != usize
    path = _write(tmp_path, bytes(data))
    with pytest.raises(RuntimeError, match="failed reading zip archive"):
        torch._C.PyTorchFileReader(str(path))
    with pytest.raises(CkptError) as exc:
        read_directory(FileSource(path))
    assert exc.value.code is Code.ZIP_BAD_CENTRAL_DIR
    # a fake EOCD hidden in the comment is the one miniz (and we) pick: both fail
    path = _write(tmp_path, build_zip(_members(records), comment=b"PK\x05\x06" + b"\xff" * 18))
    with pytest.raises(RuntimeError):
        torch._C.PyTorchFileReader(str(path))
    with pytest.raises(CkptError):
        read_directory(FileSource(path))


@pytest.mark.parametrize("appended", [65_000, 65_535, 67_000, 69_000, 69_560, 69_600, 200_000])
def test_eocd_search_window_matches_miniz(records: list[tuple[str, bytes]], tmp_path: Path,
                                          appended: int) -> None:
    """miniz stops ~64 KiB back, and (int64 - size_t wrap) never reads a block before byte 0."""
    path = _write(tmp_path, build_zip(_members(records), append=b"\0" * appended))
    try:
        torch._C.PyTorchFileReader(str(path))
        torch_ok = True
    except RuntimeError as exc:
        assert "failed finding central directory" in str(exc)
        torch_ok = False
    try:
        d = read_directory(FileSource(path))
        ours_ok = True
        assert d.archive_end == d.size - appended
    except CkptError as exc:
        assert exc.code is Code.ZIP_NO_EOCD
        ours_ok = False
    assert ours_ok == torch_ok
