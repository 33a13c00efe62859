"""Leading and trailing bytes -> container kind. Never the file name.

Strategy: torch.load decides by the first four bytes (FORMATS.md §0): `PK\\x03\\x04`
means zip, anything else goes down the legacy path. We follow the same first
decision so that we judge what torch would read, and additionally notice a zip
end record at the tail of a non-zip file (a polyglot that shows one format to
torch and another to zip readers). Zip subtypes (torch, TorchScript, torch.export,
npz) need the central directory and are decided by core.scan.
"""

from __future__ import annotations

import re
import struct

from ckptguard.core.records import record

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Literal, TypeAlias

Container: TypeAlias = ('Literal["zip", "torch-legacy", "torch-tar", "pickle", "numpy", "safetensors", '
                        '"empty", "unknown"]')

ZIP_LOCAL_MAGIC = b"PK\x03\x04"
ZIP_EOCD_MAGIC = b"PK\x05\x06"
NUMPY_MAGIC = b"\x93NUMPY"
# torch's legacy magic number 0x1950A86A20F9469CFC6C pickled as LONG1 (FORMATS.md §4.1),
# which is what the default protocol 2 writes ...
TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e"
# ... and as `torch.save(..., pickle_protocol=p)` writes it for every other protocol:
# 3 (LONG1), 4/5 (a FRAME first), 0/1 (text LONG). torch reads all of them the same way.
_LEGACY_MAGIC_PICKLE = re.compile(
    rb"(?:\x80[\x02-\x05](?:\x95[\x00-\xff]{8})?\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
    rb"|[IL]119547037146038801333356L?\n)\.")
HEAD_BYTES = 4096

# Opcodes a pickle without PROTO can start with: every opcode that takes nothing from the
# stack (marks, constants, globals, persistent ids, EXT codes, ...; pickle.load runs such a
# file as far as it goes), and a few that fail at once, kept so such bytes read as a pickle.
# Written out, not built from pickletools at import (a cold start cost); tests/core/scan/
# test_cold_start.py checks it against pickletools.opcodes.
_PICKLE_FIRST_OPS = frozenset(
    b"().0123BCFGIJKLMNPSTUVX]cdeghijklnopqrs}\x80\x82\x83\x84\x88\x89\x8a\x8b\x8c\x8d\x8e"
    b"\x8f\x90\x91\x92\x93\x94\x95\x96\x97\x98")


@record(frozen=True, slots=True)
class Sniffed:
    container: Container
    zip_at_tail: bool = False      # an EOCD record near the end (zip or polyglot)
    detail: str = ""


def sniff(head: bytes, tail: bytes, size: int, *, tar: bool = True) -> Sniffed:
    """Classify by content. `head`: the first bytes (>= 512 if the file has them); `tail`: the last.
    A tar that `head` cannot decide (a header chain past it, pax records tarfile versions
    read apart) is `torch-tar` with detail "undecided": core.scan reads on to decide
    (`tar=False`: it is no tar)."""
    if size == 0:
        return Sniffed("empty")
    zip_at_tail = ZIP_EOCD_MAGIC in tail[-(65535 + 22):]
    if head.startswith(ZIP_LOCAL_MAGIC):
        return Sniffed("zip", zip_at_tail)
    probe = tar_probe(head)[0] if tar else False
    if probe is True:
        # torch's legacy path tries tarfile.open first: whatever it accepts (a v7 header
        # without "ustar", even an all-zero block) goes down the .tar branch
        return Sniffed("torch-tar", zip_at_tail, "tar")
    if probe is not False:
        return Sniffed("torch-tar", zip_at_tail, "undecided")
    if head.startswith(NUMPY_MAGIC):
        return Sniffed("numpy", zip_at_tail)
    if _LEGACY_MAGIC_PICKLE.match(head):
        return Sniffed("torch-legacy", zip_at_tail)
    if _looks_like_safetensors(head, size):
        return Sniffed("safetensors", zip_at_tail)
    if looks_like_pickle(head):
        if zip_at_tail and archive_at_tail(tail, size):
            # one byte is a weak sign of a pickle ("MZ" of a self-extractor is BININT2): an
            # archive behind it is read as zipfile reads it, and the bytes before it are a
            # region, judged as the pickle that pickle.load (and torch's legacy path) runs
            return Sniffed("zip", True, "prepended data before the first record; its first "
                           "byte also starts a pickle")
        return Sniffed("pickle", zip_at_tail, f"protocol {head[1]}" if head[:1] == b"\x80"
                       else "no PROTO: protocol 0/1 or not a pickle")
    if zip_at_tail:
        # a zip whose first record is not at offset 0 (prepended data): torch would take
        # the legacy path and fail; zip readers would see an archive.
        return Sniffed("zip", True, "prepended data before the first record")
    return Sniffed("unknown", zip_at_tail)


_EOCD = struct.Struct("<4s4xHHII")          # signature, (disks), entries here/total, size, offset
_ZIP64_LOCATOR_SIG, _ZIP64_LOCATOR_SIZE = b"PK\x06\x07", 20
_ZIP64_EOCD = struct.Struct("<4s36xQQ")     # signature, (fields), directory size, offset
_CENTRAL_SIG, _CENTRAL_MIN = b"PK\x01\x02", 46


def archive_at_tail(tail: bytes, size: int) -> bool:
    """Does the last end record in `tail` (the file's last bytes) close a real central directory?

    The directory ends where the end record (or its zip64 record) begins, wherever the archive
    starts; it must begin with a central header there, when `tail` holds that byte, or be
    large enough for its entries otherwise. EOCD-like bytes inside a pickle's data are not
    an archive (core.zip.directory then reads the archive as miniz and zipfile do).
    """
    pos = tail.rfind(ZIP_EOCD_MAGIC, 0, max(len(tail) - _EOCD.size + 4, 0))
    if pos < 0:
        return False
    n_here: int
    n_total: int
    cd_size: int
    _, n_here, n_total, cd_size, _ = _EOCD.unpack_from(tail, pos)
    end = pos                                   # the directory's end, as an index into tail
    locator = pos - _ZIP64_LOCATOR_SIZE
    if locator >= 0 and tail[locator:locator + 4] == _ZIP64_LOCATOR_SIG:
        record = locator - _ZIP64_EOCD.size
        if record < 0 or tail[record:record + 4] != b"PK\x06\x06":
            return False
        _, cd_size, _ = _ZIP64_EOCD.unpack_from(tail, record)
        end = record
    start = end - cd_size
    if start >= 0:
        return cd_size == 0 or tail[start:start + 4] == _CENTRAL_SIG
    return size - len(tail) + start >= 0 and cd_size >= _CENTRAL_MIN * max(n_here, n_total, 1)


def looks_like_pickle(head: bytes) -> bool:
    """Would `pickle.load` start running these bytes? PROTO 0-5, or an opcode a pickle
    without PROTO can start with. A cheap first test: the VM decides what the bytes do."""
    if head[:1] == b"\x80":
        return len(head) > 1 and head[1] <= 5
    return bool(head[:1]) and head[0] in _PICKLE_FIRST_OPS


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    """u64 header length, then a JSON object (FORMATS.md §6)."""
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head)
    if n < 2 or 8 + n > size:
        return False
    first = head[8:].lstrip(b" \t\r\n")[:1]
    return first == b"{"


# --- tar: would `tarfile.open(fileobj=f, mode="r:")` accept the file? -------------------
# torch.load tries tarfile first on a real file (FORMATS.md §4.2); this replays the checks
# of CPython's TarInfo.frombuf that decide it (core/formats/torch_tar.py reads the members).

TAR_BLOCK = 512
_NUMERIC_FIELDS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337), (337, 345))
_CHAINED = (b"L", b"K", b"x", b"g", b"X")   # GNU long name/link, pax headers
_PAX = (b"x", b"g", b"X")   # (tarfile reads Solaris' X headers as pax headers)
_PAX_RECORD = re.compile(rb"(\d{1,20}) ([^=]+)=")   # (a longer length: versions differ)


class _Invalid(Exception):
    """tarfile's InvalidHeaderError."""


def tar_number(field: bytes) -> int:
    """tarfile.nti: base-256 if the first byte is 0o200/0o377, else NUL-terminated octal."""
    if field[0] in (0o200, 0o377):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0o377 else n
    text = field.split(b"\0", 1)[0]
    try:
        return int(text.decode("ascii").strip() or "0", 8)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Invalid from exc


def is_tar(head: bytes) -> bool:
    """Would `tarfile.open(fileobj=f, mode="r:")` accept a file starting with `head`?

    Mirrors TarFile.next() at offset 0: a short first block or a bad checksum/number
    field is a ReadError; an all-zero block ends the archive silently (open succeeds);
    GNU long-name and pax headers need a valid header after their data. `head` must
    hold the bytes `tar_probe` asks for (or the whole file) for an exact answer:
    core.formats.torch_tar.tarfile_accepts reads them.
    """
    return tar_probe(head)[0] is True


def tar_probe(head: bytes) -> tuple[bool | int | None, int]:
    """(True/False: tarfile accepts/refuses the file; an int: the bytes `head` must hold to
    tell; None: it cannot be told (pax records that CPython's tarfile versions parse
    differently); the position of the last header read). A chain of headers is followed
    as far as `head` goes, however long: the caller bounds the bytes it reads."""
    pos = 0
    while True:
        if len(head) < pos + TAR_BLOCK:
            return (pos + TAR_BLOCK if pos else False), pos
        block = head[pos:pos + TAR_BLOCK]
        if block.count(0) == TAR_BLOCK:
            return pos == 0, pos   # at offset 0: empty archive; later: SubsequentHeaderError
        if not valid_tar_block(block):
            return False, pos
        kind = block[156:157]
        if kind == b"S" and block[482]:   # sparse extension blocks: read by versions apart
            return None, pos
        if kind not in _CHAINED:
            return True, pos
        length = max(0, tar_number(block[124:136]))
        padded = -(-length // TAR_BLOCK) * TAR_BLOCK
        if kind in _PAX:
            if len(head) < pos + TAR_BLOCK + padded:
                return pos + TAR_BLOCK + padded, pos
            body = head[pos + TAR_BLOCK:pos + TAR_BLOCK + padded]
            # (3.13 parses the padded block, older versions `length` bytes: NULs either way)
            if not _plain_pax(body[:length]) or body[length:].count(0) != padded - length:
                return None, pos
        pos += TAR_BLOCK + padded


def _plain_pax(body: bytes) -> bool:
    """Pax records as tarfile writes them, which every CPython's tarfile parses alike:
    `"%d %s=%s\n"`, each length its record's bytes, the records filling the body."""
    pos = 0
    while pos < len(body):
        match = _PAX_RECORD.match(body, pos)
        if match is None:
            return False
        length = int(match.group(1))
        if length < len(match.group(0)) or pos + length > len(body) \
                or body[pos + length - 1] != 0x0A:
            return False
        pos += length
    return True


def tar_fail_offset(head: bytes, size: int) -> int:
    """Where a failed `tarfile.open` leaves the file position: just after the header block it
    could not parse. torch then checks for a zip magic THERE (serialization.py _legacy_load)."""
    return min(size, tar_probe(head)[1] + TAR_BLOCK)


def valid_tar_block(block: bytes) -> bool:
    """TarInfo.frombuf's checks: checksum (unsigned or signed) and every number field."""
    try:
        chksum = tar_number(block[148:156])
        unsigned = 256 + sum(struct.unpack_from("148B8x356B", block))
        signed = 256 + sum(struct.unpack_from("148b8x356b", block))
        if chksum not in (unsigned, signed):
            return False
        for lo, hi in _NUMERIC_FIELDS:
            tar_number(block[lo:hi])
        if block[156:157] == b"S":   # a GNU sparse header's numbers (TarInfo.frombuf reads
            # each sparse entry with nti, whose InvalidHeaderError its `except ValueError` misses)
            for at in range(386, 482, 12):
                tar_number(block[at:at + 12])
            tar_number(block[483:495])
    except _Invalid:
        return False
    return True
