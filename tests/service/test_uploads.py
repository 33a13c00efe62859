"""uploads.py: streamed multipart parsing, hashing, caps; chunking never changes the result."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from ckptguard.app.problems import AppError
from ckptguard.app.uploads import clean_filename, receive_upload
from tests.service.conftest import BOUNDARY, multipart_chunks

CTYPE = f"multipart/form-data; boundary={BOUNDARY}"


async def _chunks(body: bytes, size: int):
    for pos in range(0, len(body), size):
        yield body[pos: pos + size]


def receive(body: bytes, tmp_path: Path, *, chunk: int = 65536, max_bytes: int = 1 << 20,
            length: str | None = None):
    return asyncio.run(receive_upload(CTYPE, length, _chunks(body, chunk),
                                      upload_dir=tmp_path / "up", max_bytes=max_bytes))


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_chunking_invariance(tmp_path: Path, chunk: int) -> None:
    data = os.urandom(5000) + b"\r\n--" + BOUNDARY.encode()[:-1] + b"\r\n"   # near-boundary bytes
    body = b"".join(multipart_chunks([data], "w.pt"))
    up = receive(body, tmp_path, chunk=chunk)
    assert up.path.read_bytes() == data
    assert up.sha256 == hashlib.sha256(data).hexdigest() and up.size == len(data)
    assert up.filename == "w.pt" and up.path.parent == (tmp_path / "up")
    up.discard()
    assert not up.path.exists()


def test_cap_while_streaming_removes_temp_file(tmp_path: Path) -> None:
    body = b"".join(multipart_chunks([b"x" * 2000], "w.pt"))
    with pytest.raises(AppError) as info:
        receive(body, tmp_path, max_bytes=1999, chunk=100)
    assert info.value.status == 413
    assert list((tmp_path / "up").iterdir()) == []
    assert receive(body, tmp_path, max_bytes=2000).size == 2000


def test_declared_length_over_cap_is_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(AppError) as info:
        receive(b"", tmp_path, max_bytes=10, length=str(10**12))
    assert info.value.status == 413


def test_other_fields_ignored_and_two_files_refused(tmp_path: Path) -> None:
    extra = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n").encode()
    body = extra + b"".join(multipart_chunks([b"abc"], "a"))
    assert receive(body, tmp_path).path.read_bytes() == b"abc"
    part = "--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{n}\"\r\n\r\n{d}\r\n"
    two = (part.format(b=BOUNDARY, n="a", d="abc") + part.format(b=BOUNDARY, n="b", d="def")
           + f"--{BOUNDARY}--\r\n").encode()
    with pytest.raises(AppError) as info:
        receive(two, tmp_path)
    assert info.value.code == "BAD_MULTIPART"


@pytest.mark.parametrize("raw,clean", [
    ("model.pt", "model.pt"), ("../../etc/passwd", "passwd"), ("C:\\x\\y.bin", "y.bin"),
    ("a\x00b\x1fc.pt", "abc.pt"), ("", None), ("dir/", None), ("x" * 300, "x" * 255),
])
def test_clean_filename(raw: str, clean: str | None) -> None:
    assert clean_filename(raw) == clean


def test_sweep_stale_removes_only_old_upload_files(tmp_path: Path) -> None:
    from ckptguard.app.uploads import sweep_stale

    up = tmp_path / "up"
    up.mkdir()
    old, fresh, other = up / "upload-a.bin", up / "upload-b.bin", up / "keep.db"
    for p in (old, fresh, other):
        p.write_bytes(b"x")
    os.utime(old, (1, 1))
    os.utime(other, (1, 1))
    assert sweep_stale(up, 3600) == 1
    assert not old.exists() and fresh.exists() and other.exists()
    assert sweep_stale(tmp_path / "missing") == 0
