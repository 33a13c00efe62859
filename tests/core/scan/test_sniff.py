"""Format detection is by content only: the same bytes under any name sniff the same."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

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
