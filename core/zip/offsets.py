"""torch's `calculate_storage_offsets` arithmetic (FORMATS.md §1.2-§1.4), and its cross-check.

Strategy: a torch 2.7+ zip writes data/* records back to back in pickle first-encounter
order, each padded (FB extra field) so its bytes start on a multiple of the alignment.
Given the first storage's data offset (one local header read) every later offset follows
from the record name length and sizes alone, exactly as `torch.serialization._load`'s
`_get_offset` computes it via `get_record_offset_no_read` (C++ `getOffset`). The result is
then compared with the zip headers, as torch does under TORCH_SERIALIZATION_DEBUG=1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ckptguard.core.errors import Code, FormatError
from ckptguard.core.records import record
from ckptguard.core.state import Analysis
from ckptguard.core.zip.layout import LOCAL_SIZE, U32_MAX

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:   # the fast lane's reader uses this module without the directory parser
    from ckptguard.core.zip.directory import LocalHeader, ZipDirectory

FB_HEADER_SIZE = 4            # "FB" id + u16 length, always present (FORMATS.md §1.2)
ZIP64_HEADER_SIZE = 4         # id 0x0001 + u16 length
DESCRIPTOR_SIZE32 = 16        # torch: data_descripter_size32
DESCRIPTOR_SIZE64 = 24        # torch: data_descripter_size64


def _is_large(header_offset: int, size: int) -> bool:
    return size >= U32_MAX or header_offset >= U32_MAX


def record_data_offset(header_offset: int, name_len: int, size: int, alignment: int) -> int:
    """Where torch's writer puts a record's bytes (FORMATS.md §1.3, C++ `getOffset`).

    `name_len` is the full name's byte length incl. the prefix.

    >>> record_data_offset(1128, 10, 10, 64)   # FORMATS.md §1.4, data/1
    1216
    """
    start = header_offset + LOCAL_SIZE + name_len + FB_HEADER_SIZE
    if _is_large(header_offset, size):
        start += ZIP64_HEADER_SIZE
        if size >= U32_MAX:
            start += 16       # u64 usize + u64 csize
        if header_offset >= U32_MAX:
            start += 8        # u64 header offset (miniz puts it in the local extra)
    if alignment <= 1:
        return start
    return -(-start // alignment) * alignment


def descriptor_size(header_offset: int, size: int) -> int:
    """Data descriptor after a record: none for 0 bytes, 24 if zip64-sized, else 16.

    >>> descriptor_size(1242, 0), descriptor_size(982, 24), descriptor_size(2**32, 1)
    (0, 16, 24)
    """
    if size == 0:
        return 0
    return DESCRIPTOR_SIZE64 if _is_large(header_offset, size) else DESCRIPTOR_SIZE32


def written_by_torch(local: LocalHeader, size: int, alignment: int) -> bool:
    """Does this local header have exactly the extra field torch's writer gives a `size`-byte
    record ([zip64] + FB padding to the alignment)? Only then does the chain describe the
    archive: another writer (zipfile, Info-ZIP, 7-Zip) writes other extras and no padding.

    >>> from ckptguard.core.zip.directory import LocalHeader
    >>> written_by_torch(LocalHeader(1128, b"ex1/data/1", 0x808, 0, 0, 0, 0,
    ...                  b"FB" + bytes([44, 0]) + b"Z" * 44, 1216), 10, 64)
    True
    """
    if local.data_offset != record_data_offset(local.offset, len(local.name_bytes), size, alignment):
        return False
    fb = 0   # the FB field follows the zip64 field, when there is one
    if _is_large(local.offset, size):
        fb = ZIP64_HEADER_SIZE + (16 if size >= U32_MAX else 0) + (8 if local.offset >= U32_MAX else 0)
    extra = local.extra
    return extra[fb:fb + 2] == b"FB" and \
        int.from_bytes(extra[fb + 2:fb + 4], "little") == len(extra) - fb - FB_HEADER_SIZE


@record(frozen=True, slots=True)
class ChainedOffset:
    """One storage record placed by the chain: its local header and its first data byte."""

    key: str
    header_offset: int
    data_offset: int
    nbytes: int


def chain_storage_offsets(prefix: str, first_data_offset: int, storages: Sequence[tuple[str, int]],
                          alignment: int, *, first_header_offset: int | None = None
                          ) -> list[ChainedOffset]:
    """Offsets of every distinct storage, in pickle first-encounter order (FORMATS.md §1.3).

    `storages` = (key, nbytes) in encounter order; repeated keys reuse their first result.
    torch reads the first record's local header (`get_record_header_offset`): pass its
    offset as `first_header_offset`. Without it the first descriptor size is judged from
    the data offset (wrong only if that header sits just below 4 GiB and its data above)
    and key "0" gets header_offset -1.

    >>> [c.data_offset for c in chain_storage_offsets("ex", 1088, [("0", 24), ("1", 10)], 64)]
    [1088, 1216]
    """
    out: list[ChainedOffset] = []
    seen: set[str] = set()
    cursor: int | None = None
    for key, nbytes in storages:
        if key in seen:
            continue   # §1.3 step 4: cached per record
        if nbytes < 0:
            raise FormatError(Code.TORCH_BAD_TENSOR_ARGS, f"storage {key!r} has {nbytes} bytes",
                              record=f"{prefix}/data/{key}")
        if cursor is None:
            if key != "0":
                # torch: AssertionError raised by _get_offset
                raise FormatError(Code.TORCH_STORAGE_ORDER, f"expected key '0', got {key!r}",
                                  record=f"{prefix}/data/{key}")
            header = -1 if first_header_offset is None else first_header_offset
            data = first_data_offset
            desc = descriptor_size(first_data_offset if first_header_offset is None
                                   else first_header_offset, nbytes)
        else:
            header = cursor
            name_len = len(f"{prefix}/data/{key}".encode())
            data = record_data_offset(header, name_len, nbytes, alignment)
            desc = descriptor_size(header, nbytes)
        seen.add(key)
        out.append(ChainedOffset(key, header, data, nbytes))
        cursor = data + nbytes + desc
    return out


def verify_chain(chain: Sequence[ChainedOffset], directory: ZipDirectory,
                 locals_: Mapping[int, LocalHeader], an: Analysis) -> dict[str, bool]:
    """Compare each chained offset with the zip headers; mismatch -> TORCH_OFFSET_MISMATCH.

    A mismatch is a layout note, not an attack: other zip writers (Python's zipfile, Info-ZIP,
    7-Zip, hub repackers) write other extra fields and no padding, and torch.load reads every
    record where its local header says (miniz), as zipfile does. Only the opt-in
    `torch.load(mmap=True)` with `calculate_storage_offsets=True` (and meta loads' recorded
    `_checkpoint_offset`) trusts the chain and reads other bytes, without an error
    (measured on torch 2.13: tests/differential/test_repacked_vs_torch.py).

    The data offset is checked against the local header (what miniz's `get_record_offset`
    returns) when one is given, else the header offset against the central directory.
    Records missing from the archive are reported unverified, without a finding here
    (the caller reports TORCH_MISSING_RECORD).
    """
    prefix = directory.prefix()
    verified: dict[str, bool] = {}
    for c in chain:
        name = f"{prefix}/data/{c.key}"
        entry = directory.find(name)
        if entry is None:
            verified[c.key] = False
            continue
        local = locals_.get(entry.index)
        ok = True
        if local is not None and local.data_offset != c.data_offset:
            ok = False
            an.add(Code.TORCH_OFFSET_MISMATCH,
                   f"data/{c.key} starts at {local.data_offset} (its local header: torch.load "
                   f"reads there); torch's writer layout puts it at {c.data_offset}, where only "
                   "mmap=True with calculate_storage_offsets=True reads; torch's debug check "
                   f"says: Incorrect offset for data/{c.key}, got {c.data_offset} expected "
                   f"{local.data_offset}", record=name, offset=local.data_offset)
        elif c.header_offset >= 0 and entry.header_offset != c.header_offset:
            ok = False
            an.add(Code.TORCH_OFFSET_MISMATCH,
                   f"data/{c.key}'s local header offset is {entry.header_offset} (torch.load "
                   f"reads it there); torch's writer layout puts it at {c.header_offset}",
                   record=name, offset=entry.header_offset)
        verified[c.key] = ok
    return verified
