"""core.zip.checks: every forensic finding from a hand-built hostile zip."""

from __future__ import annotations

import struct

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.io.source import BytesSource, FileSource
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.state import Analysis
from ckptguard.core.zip.checks import check_archive, verify_crcs
from ckptguard.core.zip.directory import read_directory, read_local_headers
from tests.core.zip.conftest import TorchFile
from tests.core.zip.zipbuild import Member, build_zip


def _findings(data: bytes, *, with_locals: bool = True) -> Analysis:
    src = BytesSource(data)
    d = read_directory(src)
    an = Analysis()
    check_archive(d, read_local_headers(src, d.entries) if with_locals else {}, an)
    return an


def _codes(data: bytes, **kw: bool) -> list[Code]:
    return [f.code for f in _findings(data, **kw).findings]


def _ms() -> list[Member]:
    return [Member("ex/data.pkl", b"\x80\x02N."), Member("ex/data/0", b"\1" * 8),
            Member("ex/version", b"3\n")]


def test_clean_archive_has_no_findings() -> None:
    assert _codes(build_zip(_ms())) == []


@pytest.mark.torch
def test_real_torch_files_have_no_findings(torch_files: list[TorchFile]) -> None:
    for tf in torch_files:
        src = FileSource(tf.path)
        d = read_directory(src)
        an = Analysis()
        check_archive(d, read_local_headers(src, d.entries), an)
        verify_crcs(src, d, an)
        assert an.findings == [], tf.path.name
        # a remote scan reads few local headers: unknown FB padding must not look like gaps
        an = Analysis()
        check_archive(d, {}, an)
        assert an.findings == [], tf.path.name


def test_duplicate_names_exact_and_case_folded() -> None:
    ms = [*_ms(), Member("ex/data/0", b"\2" * 8)]
    an = _findings(build_zip(ms))
    [f] = an.findings
    assert f.code is Code.ZIP_DUPLICATE_NAME and f.record == "ex/data/0"
    assert "central indexes [1, 3]" in f.message and "torch reads index" in f.message
    an = _findings(build_zip([*_ms(), Member("ex/DATA/0", b"\2" * 8)]))
    [f] = an.findings
    assert f.code is Code.ZIP_DUPLICATE_NAME and "differ only in case" in f.message


@pytest.mark.parametrize(("field", "value", "text", "code"), [
    ("local_name", b"ex/data/9", "name", Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    ("local_flags", 0x0801, "flags", Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    ("local_method", 8, "method", Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    ("local_sizes", (1, 1), "sizes 1/1 vs 8/8", Code.ZIP_LOCAL_CENTRAL_MISMATCH),
])
def test_local_central_mismatch(field: str, value: object, text: str, code: Code) -> None:
    ms = _ms()
    setattr(ms[1], field, value)
    an = _findings(build_zip(ms))
    found = [f for f in an.findings if f.code is code]
    assert len(found) == 1 and text in found[0].message and found[0].record == "ex/data/0"
    assert found[0].offset == an.findings[0].offset


def test_local_crc_mismatch_only_checked_without_descriptor_flag() -> None:
    ms = _ms()
    ms[1].crc = 0x1234                       # central CRC differs from the local (real) one
    assert _codes(build_zip(ms)) == [Code.ZIP_LOCAL_CENTRAL_COSMETIC]   # no reader reads by it
    ms = _ms()
    for m in ms:
        m.flags = 0x0808                     # descriptor: local sizes/CRC are deferred
        m.local_sizes = (0, 0)
        m.descriptor = True
    assert _codes(build_zip(ms)) == []


def test_overlapping_entries() -> None:
    ms = _ms()
    data = build_zip(ms)
    # a second central entry pointing at data/0's local header
    ms2 = [*_ms(), Member("ex/alias", b"\1" * 8)]
    ms2[3].header_offset = 0
    built = build_zip(ms2)
    codes = _codes(built, with_locals=False)
    assert Code.ZIP_OVERLAPPING_ENTRIES in codes
    # an entry whose bytes run into the central directory
    d = read_directory(BytesSource(data))
    bad = bytearray(data)
    cd2 = d.entries[2].central_offset
    struct.pack_into("<II", bad, cd2 + 20, 40, 40)      # version: 40 bytes, past the CD start
    an = _findings(bytes(bad), with_locals=False)
    assert any(f.code is Code.ZIP_OVERLAPPING_ENTRIES and "past the central directory" in f.message
               for f in an.findings)


def test_prepended_appended_and_comment() -> None:
    an = _findings(build_zip(_ms(), prepend=b"MZ" + b"\0" * 62, append=b"tail", comment=b"hi"))
    by = {f.code: f for f in an.findings}
    assert set(by) == {Code.ZIP_PREPENDED_DATA, Code.ZIP_APPENDED_DATA, Code.ZIP_COMMENT}
    assert by[Code.ZIP_PREPENDED_DATA].offset == 0 and "64 bytes" in by[Code.ZIP_PREPENDED_DATA].message
    assert by[Code.ZIP_APPENDED_DATA].message.startswith("4 bytes after the end")


def test_unreferenced_gaps() -> None:
    ms = _ms()
    ms[2].gap_before = b"hidden payload"
    an = _findings(build_zip(ms))
    [f] = an.findings
    assert f.code is Code.ZIP_UNREFERENCED_DATA and f.record == "ex/version" and "14 bytes" in f.message
    # bytes between the last record and the central directory
    d = read_directory(BytesSource(build_zip(_ms())))
    data = build_zip(_ms())
    cd = d.cd_offset
    moved = bytearray(data[:cd] + b"X" * 7 + data[cd:])
    eocd = moved.rindex(b"PK\x05\x06")
    struct.pack_into("<I", moved, eocd + 16, cd + 7)
    assert _codes(bytes(moved)) == [Code.ZIP_UNREFERENCED_DATA]


def test_unreferenced_bytes_around_the_end_records() -> None:
    data = build_zip(_ms(), zip64_eocd=True)
    z64 = data.index(b"PK\x06\x06")
    loc = data.index(b"PK\x06\x07")
    # junk between the zip64 record and the locator: the locator still points at it
    moved = data[:loc] + b"JUNK" + data[loc:]
    msgs = [f.message for f in _findings(moved).findings]
    assert any("not right before the locator" in m for m in msgs)
    # junk between the central directory and the zip64 record
    moved = bytearray(data[:z64] + b"JUNK" + data[z64:])
    loc2 = moved.index(b"PK\x06\x07")
    struct.pack_into("<Q", moved, loc2 + 8, z64 + 4)
    an = _findings(bytes(moved))
    assert [f.code for f in an.findings] == [Code.ZIP_UNREFERENCED_DATA]
    assert "between the central directory" in an.findings[0].message


def test_methods_and_encryption() -> None:
    ms = _ms()
    ms[0].method = 8
    ms[1].method, ms[1].payload = 12, ms[1].data
    ms[2].flags = 0x0801
    ms[2].local_flags = 0x0801
    codes = _codes(build_zip(ms))
    assert sorted(codes) == sorted([Code.ZIP_COMPRESSED_ENTRY, Code.ZIP_UNSUPPORTED_METHOD,
                                    Code.ZIP_ENCRYPTED_ENTRY])


@pytest.mark.parametrize(("name", "flags", "problem"), [
    (b"ex/../etc/passwd", 0x800, ".."),
    (b"/ex/abs", 0x800, "absolute"),
    (b"C:\\ex", 0x800, "absolute"),
    (b"ex/\xff\xfe", 0x800, "not valid UTF-8"),
    (b"ex/caf\x82", 0, "lacks the UTF-8 flag"),
    (b"ex/a\x00b", 0x800, "NUL"),
    (b"", 0x800, "empty"),
])
def test_bad_names(name: bytes, flags: int, problem: str) -> None:
    an = _findings(build_zip([*_ms(), Member(name, b"x", flags=flags)]))
    bad = [f for f in an.findings if f.code is Code.ZIP_BAD_NAME]
    assert len(bad) == 1 and problem in bad[0].message


def test_name_outside_prefix_uses_torchs_message() -> None:
    an = _findings(build_zip([*_ms(), Member("other/x", b"1")]))
    [f] = an.findings
    assert f.code is Code.ZIP_NAME_OUTSIDE_PREFIX
    assert f.message == "file in archive is not in a subdirectory ex/: other/x"
    # no prefix at all: every entry is outside
    assert set(_codes(build_zip([Member("flat", b"1")]))) == {Code.ZIP_NAME_OUTSIDE_PREFIX}


def test_crc_mismatch_needs_a_full_read() -> None:
    ms = _ms()
    ms[1].crc = 0xDEADBEEF
    ms[1].local_flags = 0x0808      # keep the local header out of it: descriptor style
    ms[1].local_sizes = (0, 0)
    data = build_zip(ms)
    src = BytesSource(data)
    d = read_directory(src)
    an = Analysis()
    verify_crcs(src, d, an)
    [f] = an.findings
    assert f.code is Code.ZIP_CRC_MISMATCH and f.record == "ex/data/0"
    # CRC 0 (torch's set_crc32_options(False)) is skipped; unreadable records are reported
    ms = _ms()
    ms[1].crc = 0
    ms[2].method, ms[2].payload = 8, b"\xff" * 5
    an = Analysis()
    src = BytesSource(build_zip(ms))
    verify_crcs(src, read_directory(src), an)
    assert [f.code for f in an.findings] == [Code.ZIP_BAD_RECORD_DATA]


def test_findings_are_capped_per_code() -> None:
    ms = [*_ms(), *(Member(f"out{i}/x", b"") for i in range(DEFAULT_LIMITS.max_zip_findings_per_code + 30))]
    an = _findings(build_zip(ms))
    outside = [f for f in an.findings if f.code is Code.ZIP_NAME_OUTSIDE_PREFIX]
    assert len(outside) == DEFAULT_LIMITS.max_zip_findings_per_code + 1
    assert outside[-1].message == f"... and 30 more {Code.ZIP_NAME_OUTSIDE_PREFIX} findings"
