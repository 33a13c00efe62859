"""Format detection is by content only: the same bytes under any name sniff the same."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.sniff import TORCH_LEGACY_MAGIC, sniff


def _sniff(data: bytes) -> str:
    return sniff(data[:4096], data[-65558:], len(data)).container


def test_zip_by_local_header_magic() -> None:
    assert _sniff(b"PK\x03\x04" + b"\0" * 100) == "zip"


def test_zip_with_prepended_bytes_is_still_seen_by_its_tail() -> None:
    fake_zip = b"\x00junk" + b"PK\x05\x06" + b"\0" * 18
    got = sniff(fake_zip, fake_zip, len(fake_zip))
    assert got.container == "zip" and got.zip_at_tail


def test_numpy_magic() -> None:
    import io

    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    assert _sniff(buf.getvalue()) == "numpy"


def test_torch_legacy_magic() -> None:
    assert _sniff(TORCH_LEGACY_MAGIC + b"\x80\x02M\xe9\x03.") == "torch-legacy"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_torch_legacy_magic_in_every_protocol(protocol: int) -> None:
    """torch.save(..., pickle_protocol=p) pickles the magic number with that protocol:
    text LONG (0/1), LONG1 (2/3), a FRAME first (4/5); all are the legacy format."""
    magic = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=protocol)
    assert _sniff(magic + pickle.dumps(1001, protocol=protocol)) == "torch-legacy"
    # another number in the same place is a plain pickle
    assert _sniff(pickle.dumps(0x1950A86A20F9469CFC6D, protocol=protocol)) == "pickle"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_pickles_of_every_protocol(protocol: int) -> None:
    assert _sniff(pickle.dumps({"a": [1, 2.0, "x"]}, protocol=protocol)) == "pickle"


def test_safetensors_header() -> None:
    header = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    data = struct.pack("<Q", len(header)) + header + b"\0" * 4
    assert _sniff(data) == "safetensors"


def test_safetensors_length_past_end_is_not_safetensors() -> None:
    data = struct.pack("<Q", 10**6) + b"{" + b"\0" * 10
    assert _sniff(data) != "safetensors"


def test_ustar_magic_with_a_bad_checksum_is_not_a_tar() -> None:
    data = bytearray(1024)
    data[257:262] = b"ustar"          # tarfile.open rejects the header: torch goes on
    assert _sniff(bytes(data)) != "torch-tar"


def test_empty_and_unknown() -> None:
    assert sniff(b"", b"", 0).container == "empty"
    assert _sniff(b"\x7fELF\x02\x01\x01") == "unknown"


def test_tar_without_ustar_magic_takes_the_tar_path_as_in_torch() -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("pickle")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    data = bytearray(buf.getvalue())
    assert _sniff(bytes(data)) == "torch-tar"
    assert _sniff(bytes(1024)) == "torch-tar"   # all zero: tarfile.open accepts it


# --- an archive behind a prefix whose first byte also starts a pickle ------------------------

_PICKLE_FIRST = sorted(set(b"().0123BCFGIJKLMNPSTUVX]cdeghijklnopqrs}\x82\x83\x84\x88\x89\x8a\x8b"
                           b"\x8c\x8d\x8e\x8f\x90\x91\x92\x93\x94\x95\x96\x97\x98"))


def _archive(members: int, prefix: bytes, *, zip64: bool = False, counted: bool = False) -> bytes:
    """An archive behind `prefix` (`counted`: its offsets count the prefix, SFX style) that
    Python's zipfile reads."""
    import io
    import zipfile

    from tests.core.zip.zipbuild import Member, build_zip

    data = build_zip([Member(f"ex/data/{i}", bytes([i % 256]) * 8) for i in range(members)],
                     prepend=prefix, zip64_eocd=zip64, relative_offsets=not counted)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.testzip() is None and len(z.namelist()) == members
    return data


@pytest.mark.parametrize("first", _PICKLE_FIRST)
def test_an_archive_behind_a_pickle_like_first_byte_is_a_zip(first: int) -> None:
    """The first byte of `MZ`, of `Copyright`, of `(`...: the archive zipfile reads is found."""
    data = _archive(3, bytes([first]) + b"Z" * 63)
    got = sniff(data[:4096], data[-65558:], len(data))
    assert got.container == "zip" and "also starts a pickle" in got.detail


def test_a_pickle_with_an_end_record_in_its_data_stays_a_pickle() -> None:
    """EOCD-like bytes inside a pickle's data do not close a central directory."""
    fake = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 1, 1, 46, 0, 0)
    data = pickle.dumps({"blob": b"x" * 100 + fake}, protocol=2)
    assert _sniff(data) == "pickle"


@settings(max_examples=60, deadline=None)
@given(members=st.integers(0, 40), prefix=st.binary(min_size=1, max_size=300),
       pad=st.integers(0, 80_000), zip64=st.booleans(), counted=st.booleans())
def test_archive_at_tail_finds_every_archive_zipfile_reads(members: int, prefix: bytes, pad: int,
                                                            zip64: bool, counted: bool) -> None:
    """Whatever precedes it (short or past the tail window), an archive zipfile reads closes a
    central directory in the file's last bytes; a pickle without one never does."""
    from ckptguard.core.sniff import archive_at_tail

    data = _archive(members, prefix + b"\0" * pad, zip64=zip64, counted=counted)
    assert archive_at_tail(data[-65558:], len(data))
    plain = pickle.dumps({"prefix": prefix, "pad": b"\0" * pad, "n": members}, protocol=2)
    assert not archive_at_tail(plain[-65558:], len(plain))


def test_a_directory_larger_than_the_tail_window_is_still_an_archive() -> None:
    """2,000 entries: the central directory starts before the last 64 KiB the sniffer sees."""
    data = _archive(2000, b"MZ" + b"\0" * 62)
    assert data.rfind(b"PK\x01\x02", 0, len(data) - 65558) > 0   # the directory starts earlier
    assert _sniff(data) == "zip"
