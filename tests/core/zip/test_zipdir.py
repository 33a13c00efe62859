"""core.zip.directory: our zip reader against zipfile, torch 2.13 and hand-built archives."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from ckptguard.core import records
from ckptguard.core.errors import CkptError, Code, FormatError, LimitExceeded
from ckptguard.core.io.source import BytesSource, FileSource
from ckptguard.core.limits import Limits
from ckptguard.core.zip.directory import (
    ZipDirectory,
    ZipEntry,
    decode_name,
    parse_local_header,
    read_directory,
    read_local_headers,
    read_record,
)
from tests.core.zip.conftest import TorchFile
from tests.core.zip.zipbuild import Member, build_zip


def _src(data: bytes) -> BytesSource:
    return BytesSource(data)


def _err(data: bytes, limits: Limits | None = None) -> CkptError:
    with pytest.raises(CkptError) as exc:
        read_directory(_src(data), limits) if limits else read_directory(_src(data))
    return exc.value


def _members(n: int = 3) -> list[Member]:
    return [Member(f"arch/r{i}", bytes([i]) * (i + 1)) for i in range(n)]


# --- agreement with zipfile ------------------------------------------------------------------

def _same_as_zipfile(data: bytes) -> ZipDirectory:
    d = read_directory(_src(data))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        theirs = [(i.filename, i.header_offset, i.compress_size, i.file_size, i.CRC, i.compress_type,
                   i.flag_bits) for i in z.infolist()]
        assert z.comment == d.comment
    ours = [(e.name, e.header_offset, e.compressed_size, e.uncompressed_size, e.crc32, e.method, e.flags)
            for e in d.entries]
    assert ours == theirs
    return d


@pytest.mark.torch
def test_agrees_with_zipfile_on_torch_files(torch_files: list[TorchFile]) -> None:
    for tf in torch_files:
        data = tf.path.read_bytes()
        d = _same_as_zipfile(data)
        assert d.zip64 and d.archive_end == d.size == len(data)
        assert d.prefix() == tf.prefix
        src = FileSource(tf.path)
        locs = read_local_headers(src, d.entries)
        with zipfile.ZipFile(tf.path) as z:
            for e in d.entries:
                assert read_record(src, d, e.name) == z.read(e.name)
                assert locs[e.index].name_bytes == e.name_bytes


def test_agrees_with_zipfile_on_python_written_zip() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("p/a.txt", b"hello" * 100, compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("p/b", b"")
        z.writestr("p/ü", b"x")      # utf-8 flag
        z.comment = b"a comment"
    d = _same_as_zipfile(buf.getvalue())
    assert read_record(_src(buf.getvalue()), d, "p/a.txt") == b"hello" * 100
    assert d.comment == b"a comment" and not d.zip64


def test_zip64_fields_forced_on_small_records() -> None:
    ms = _members()
    for m in ms:
        m.zip64_central = True
    data = build_zip(ms, zip64_eocd=True)
    d = _same_as_zipfile(data)
    assert d.zip64 and d.zip64_eocd_offset is not None
    assert [read_record(_src(data), d, e.name) for e in d.entries] == [m.data for m in ms]


def test_zip64_record_found_through_the_locator() -> None:
    """miniz: EOCD64 right before the locator, else where the locator points."""
    data = build_zip(_members(), zip64_eocd=True)
    z64 = data.index(b"PK\x06\x06")
    loc = data.index(b"PK\x06\x07")
    moved = data[:loc] + b"JUNKJUNK" + data[loc:]
    d = read_directory(_src(moved))
    assert d.zip64_eocd_offset == z64 and len(d.entries) == 3
    # a locator pointing past the end / at no record
    bad = bytearray(moved)
    struct.pack_into("<Q", bad, loc + 8 + 8, len(bad))
    assert _err(bytes(bad)).code is Code.ZIP_BAD_EOCD
    # a locator pointing at no record: miniz (torch loads such a file, tests/differential/
    # test_refusals_vs_torch.py) reads the archive from its zip32 end record, whose
    # 0xFFFFFFFF sentinels here overrun the file
    struct.pack_into("<Q", bad, loc + 8 + 8, 0)
    assert _err(bytes(bad)).code is Code.ZIP_BAD_EOCD


def test_zip64_record_checks() -> None:
    data = bytearray(build_zip(_members(), zip64_eocd=True))
    z64 = data.index(b"PK\x06\x06")
    loc = data.index(b"PK\x06\x07")
    small = bytearray(data)
    struct.pack_into("<Q", small, z64 + 4, 10)            # record size < 44
    assert _err(bytes(small)).code is Code.ZIP_BAD_EOCD
    disks = bytearray(data)
    struct.pack_into("<I", disks, loc + 16, 2)             # total disks != 1
    assert _err(bytes(disks)).code is Code.ZIP_MULTIPLE_DISKS


# --- EOCD and central directory errors ----------------------------------------------------------

def test_no_eocd_short_and_garbage() -> None:
    assert _err(b"").code is Code.ZIP_NO_EOCD
    assert _err(b"PK\x03\x04" + b"\0" * 40).code is Code.ZIP_NO_EOCD
    assert isinstance(_err(b"x" * 100), FormatError)


def test_eocd_is_the_last_signature_that_fits() -> None:
    data = build_zip(_members(), comment=b"PK\x05\x06")  # too short to be a record: skipped
    assert len(read_directory(_src(data)).entries) == 3
    fake = build_zip(_members(), comment=b"PK\x05\x06" + b"\xff" * 18)
    assert _err(fake).code in (Code.ZIP_BAD_EOCD, Code.ZIP_MULTIPLE_DISKS)


@pytest.mark.parametrize(("overrides", "code"), [
    ({"n": 5, "n_disk": 5}, Code.ZIP_BAD_EOCD),                 # 5 records can't fit
    ({"n": 2}, Code.ZIP_MULTIPLE_DISKS),                         # total != on this disk
    ({"disk": 1, "cd_disk": 0}, Code.ZIP_MULTIPLE_DISKS),
    ({"cd_offset": 10_000}, Code.ZIP_BAD_EOCD),                  # past the end
    ({"cd_size": 1000}, Code.ZIP_BAD_EOCD),                       # overruns the EOCD
    ({"cd_offset": 1}, Code.ZIP_BAD_CENTRAL_DIR),                 # no central signature there
])
def test_eocd_inconsistencies(overrides: dict[str, int], code: Code) -> None:
    assert _err(build_zip(_members(), eocd_overrides=overrides)).code is code


def test_disk_one_one_is_accepted_like_miniz() -> None:
    """torch 2.13: EOCD disk 1/1 with entries on disk 0 -> "unsupported multidisk archive";
    with the entries on disk 1 too, it opens (checked with PyTorchFileReader)."""
    data = bytearray(build_zip(_members(), eocd_overrides={"disk": 1, "cd_disk": 1}))
    assert _err(bytes(data)).code is Code.ZIP_MULTIPLE_DISKS
    pos = 0
    while (pos := data.find(b"PK\x01\x02", pos)) >= 0:
        struct.pack_into("<H", data, pos + 34, 1)
        pos += 4
    assert len(read_directory(_src(bytes(data))).entries) == 3


def test_limits_fail_closed() -> None:
    data = build_zip(_members(4))
    err = _err(data, Limits(max_zip_entries=3))
    assert isinstance(err, LimitExceeded) and err.code is Code.LIMIT_ENTRIES
    err = _err(data, Limits(max_central_dir_bytes=50))
    assert isinstance(err, LimitExceeded) and err.code is Code.LIMIT_ENTRIES
    assert len(read_directory(_src(data), Limits(max_zip_entries=4)).entries) == 4


@pytest.mark.parametrize("mutate", ["stored_sizes", "past_end", "z64_no_extra", "z64_short_extra",
                                    "name_overrun"])
def test_central_records_miniz_rejects(mutate: str) -> None:
    ms = _members()
    data = bytearray(build_zip(ms))
    cd = data.index(b"PK\x01\x02")
    if mutate == "stored_sizes":
        struct.pack_into("<I", data, cd + 20, 2)               # csize 2 != usize 1, stored
    elif mutate == "past_end":
        struct.pack_into("<I", data, cd + 42, len(data))       # header offset past the end
    elif mutate == "z64_no_extra":
        struct.pack_into("<I", data, cd + 42, 0xFFFFFFFF)
    elif mutate == "z64_short_extra":
        ms[0].zip64_central = True
        data = bytearray(build_zip(ms, zip64_eocd=True))
        cd = data.index(b"PK\x01\x02")
        struct.pack_into("<H", data, cd + 46 + 6 + 2, 8)       # zip64 field now holds one u64
    elif mutate == "name_overrun":
        struct.pack_into("<H", data, cd + 28, 5000)
    assert _err(bytes(data)).code is Code.ZIP_BAD_CENTRAL_DIR


# --- names and torch's lookup --------------------------------------------------------------------

def test_entries_are_real_frozen_zip_entries() -> None:
    d = read_directory(_src(build_zip(_members())))
    e = d.entries[1]
    assert type(e) is ZipEntry
    assert e == ZipEntry(**{f.name: getattr(e, f.name) for f in records.fields(ZipEntry)})
    with pytest.raises(records.FrozenRecordError):
        e.name = "x"  # type: ignore[misc]
    assert hash(e) == hash(records.replace(e))


def test_prefix_and_case_insensitive_find() -> None:
    d = read_directory(_src(build_zip([Member("Arch/Data.PKL", b"x"), Member("Arch/version", b"3")])))
    assert d.prefix() == "Arch"
    assert d.find("arch/data.pkl") is d.entries[0] and "arch/data.pkl" not in d.by_name
    assert d.find("Arch/version") is d.entries[1]
    assert d.find("arch/nothing") is None
    assert read_directory(_src(build_zip([Member("flat", b"")]))).prefix() == ""
    assert ZipDirectory(0, [], {}, 0, 0, 0, 0, False, b"").prefix() == ""


def test_duplicate_lookup_follows_miniz_not_first_or_last() -> None:
    """Which duplicate torch reads depends on miniz's heap sort (verified vs torch in test_zip_torch)."""
    names = ["ex/data.pkl", "ex/.format_version", "ex/.storage_alignment", "ex/byteorder",
             "ex/data/0", "ex/data/1", "ex/version", "ex/.data/serialization_id"]
    picks = set()
    for pos in range(len(names) + 1):
        ms = [Member(n, b"orig") for n in names]
        ms.insert(pos, Member("ex/data/0", b"dup!"))
        d = read_directory(_src(build_zip(ms)))
        picks.add(d.by_name["ex/data/0"].index == pos)
    assert picks == {True, False}


def test_decode_name() -> None:
    assert decode_name(b"a\x81", 0) == "aü"                  # cp437
    assert decode_name("aü".encode(), 0x800) == "aü"
    assert decode_name(b"a\xff", 0x800) == "a\udcff"          # kept, flagged by zipcheck


def test_100k_entries_parse() -> None:
    """Correctness at scale (timing is measured in the report, not asserted)."""
    ms = [Member(f"archive/data/{i}", b"") for i in range(100_000)]
    d = read_directory(_src(build_zip(ms, zip64_eocd=True)))
    assert len(d.entries) == len(d.by_name) == 100_000
    assert d.entries[-1].name == "archive/data/99999" and d.entries[-1].index == 99_999


# --- local headers and records -------------------------------------------------------------------

class _Recorder(BytesSource):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.batches: list[int] = []

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        self.batches.append(len(spans))
        return super().read_many(spans)


def test_local_headers_batched_with_retry_for_long_extras() -> None:
    ms = _members(5)
    ms[2].local_extra = b"\x99\x99" + struct.pack("<H", 1000) + b"\0" * 1000
    src = _Recorder(build_zip(ms))
    d = read_directory(src)
    locs = read_local_headers(src, d.entries)
    assert src.batches == [5, 1]
    assert locs[2].extra == ms[2].local_extra
    for e in d.entries:
        assert locs[e.index].data_offset == e.header_offset + 30 + len(e.name_bytes) + len(
            ms[e.index].local_extra)


def test_bad_local_headers_are_left_out_and_reported() -> None:
    ms = _members(3)
    data = bytearray(build_zip(ms))
    d = read_directory(_src(bytes(data)))
    data[d.entries[1].header_offset] = ord("X")
    src = _src(bytes(data))
    fake = records.replace(d.entries[0], index=7, header_offset=len(data) + 5)
    errors: list[CkptError] = []
    locs = read_local_headers(src, [*d.entries, fake], errors=errors)
    assert set(locs) == {0, 2}
    assert {e.code for e in errors} == {Code.ZIP_BAD_LOCAL_HEADER} and len(errors) == 2
    with pytest.raises(FormatError) as exc:
        read_record(src, read_directory(src), "arch/r1")
    assert exc.value.code is Code.ZIP_BAD_LOCAL_HEADER and exc.value.record == "arch/r1"


def test_parse_local_header_truncations() -> None:
    with pytest.raises(FormatError):
        parse_local_header(b"PK\x03\x04", 0)
    hdr = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, 0, 0, 0, 0, 0, 0, 0, 10, 0) + b"abc"
    with pytest.raises(FormatError, match="truncated"):
        parse_local_header(hdr, 0)


def test_read_record_methods_and_caps() -> None:
    payload = b"tensor bytes " * 50
    ms = [Member("a/stored", payload), Member("a/deflated", payload, method=8),
          Member("a/bzip2", payload, method=12), Member("a/enc", payload, flags=0x801),
          Member("a/bomb", b"\0" * 10, method=8,
                 payload=zlib.compress(b"\0" * 100_000)[2:-4])]
    data = build_zip(ms)
    src = _src(data)
    d = read_directory(src)
    assert read_record(src, d, "a/stored") == payload
    assert read_record(src, d, "a/deflated") == payload
    with pytest.raises(FormatError) as exc:
        read_record(src, d, "a/bzip2")
    assert exc.value.code is Code.ZIP_UNSUPPORTED_METHOD
    with pytest.raises(FormatError) as exc:
        read_record(src, d, "a/enc")
    assert exc.value.code is Code.ZIP_ENCRYPTED_ENTRY
    with pytest.raises(FormatError, match="inflates to 11") as exc:   # stopped at usize + 1
        read_record(src, d, "a/bomb")
    assert exc.value.code is Code.ZIP_BAD_RECORD_DATA
    with pytest.raises(FormatError) as exc:
        read_record(src, d, "a/missing")
    assert exc.value.code is Code.TORCH_MISSING_RECORD
    assert exc.value.message == "PytorchStreamReader failed locating file a/missing: file not found"
    with pytest.raises(LimitExceeded) as lim:
        read_record(src, d, "a/stored", max_nbytes=10)
    assert lim.value.code is Code.LIMIT_BYTES_READ


def test_read_record_bad_deflate_and_short_data() -> None:
    data = build_zip([Member("a/x", b"abc" * 10, method=8, payload=b"\xff" * 12)])
    src = _src(data)
    with pytest.raises(FormatError, match="bad deflate"):
        read_record(src, read_directory(src), "a/x")
    # the data starts after the LOCAL name and extra (as in miniz), whatever the central says
    ms = [Member("a/y", b"z" * 10, local_name=b"a/" + b"y" * 60, local_extra=b"FB\x02\x00ZZ")]
    src = _src(build_zip(ms))
    d = read_directory(src)
    assert read_record(src, d, "a/y") == b"z" * 10
    assert read_local_headers(src, d.entries)[0].data_offset == 30 + 62 + 6


def test_path_and_file_sources_agree(tmp_path: Path) -> None:
    data = build_zip(_members(), comment=b"c")
    p = tmp_path / "z.zip"
    p.write_bytes(data)
    with FileSource(p) as fs:
        assert read_directory(fs).entries == read_directory(_src(data)).entries


def test_entry_disk_numbers_like_miniz() -> None:
    data = bytearray(build_zip(_members()))
    cd = data.index(b"PK\x01\x02")
    struct.pack_into("<H", data, cd + 34, 1)     # disk 1: miniz tolerates it
    assert len(read_directory(_src(bytes(data))).entries) == 3
    struct.pack_into("<H", data, cd + 34, 5)
    assert _err(bytes(data)).code is Code.ZIP_MULTIPLE_DISKS


def test_tail_read_is_bounded_by_miniz_window() -> None:
    from ckptguard.core.zip.endrecord import eocd_search_start

    assert eocd_search_start(100) == 0
    assert eocd_search_start(4096) == 0
    size = 10 * 2**20
    start = eocd_search_start(size)
    assert 65_557 <= size - start < 65_557 + 4093
    src = _src(build_zip(_members(), append=b"\0" * 300_000))
    with pytest.raises(FormatError):
        read_directory(src)
    assert src.stats.bytes_read < 70_000
