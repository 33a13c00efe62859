"""NumPy `.npy` and `.npz`: headers parsed without eval, manifest, object-array pickles.

Strategy: `read_npy_header` replays numpy 2.4's `read_magic` + `_read_array_header`
(FORMATS.md §7) with `pyliteral.parse_literal` in place of `ast.literal_eval`, and the
same checks in the same order (version, header cap of 10 000 characters, dict with
exactly descr/fortran_order/shape, int shape, bool fortran_order, descr -> dtype via
numpy's own `descr_to_dtype` logic on the parsed literal: `numpy.dtype` builds a
description, it never evaluates or imports). Plain arrays become a manifest entry with
absolute offsets; object arrays (`dtype.hasobject`) carry a pickle that np.load refuses
without allow_pickle: it goes through core.judge, never Python's pickle.
`.npz` members are scanned one by one: stored members in place (two small reads), deflated
ones inflated under the byte cap (no absolute offsets then); their header bytes together are
capped (`max_npy_headers_total`), so many wide headers cannot add up to a long scan.
A header numpy reads may still describe an array np.load cannot build (a dimension beyond
int64, more than 64 dimensions, more bytes than intp counts): `_numpy_refusal` applies
numpy's own checks, so such shapes and their huge strides never reach the manifest.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ckptguard.core.errors import CkptError, Code, FormatError, LimitExceeded, SourceError
from ckptguard.core.filemap import add_region
from ckptguard.core.io.source import ByteSource, BytesSource, WindowSource
from ckptguard.core.npyheader import declared_header, parse_npy_header
from ckptguard.core.records import record
from ckptguard.core.regions.region import declare_entry
from ckptguard.core.report import TensorEntry, WeightsOnly
from ckptguard.core.state import Analysis
from ckptguard.core.zip.checks import check_archive
from ckptguard.core.zip.directory import LocalHeader, ZipDirectory, ZipEntry, read_local_headers, read_record

MAGIC = b"\x93NUMPY"
HEAD_READ = 4096                    # one read covers numpy's usual 128-byte headers
OBJECT_ERROR = "Object arrays cannot be loaded when allow_pickle=False"
NPY_MAXDIMS = 64                    # numpy 2.x: more dimensions is a ValueError
INTP_MAX = 2**63 - 1                # numpy's intp on 64-bit builds

# numpy dtype.str of native little-endian kinds -> torch dtype names (DESIGN.md: torch names)
_TORCH_NAMES = {
    "<f8": "float64", "<f4": "float32", "<f2": "float16", "<i8": "int64", "<i4": "int32",
    "<i2": "int16", "|i1": "int8", "|u1": "uint8", "<u2": "uint16", "<u4": "uint32",
    "<u8": "uint64", "|b1": "bool", "<c8": "complex64", "<c16": "complex128",
}


@record(frozen=True, slots=True)
class NpyHeader:
    version: tuple[int, int]
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype[Any]
    data_pos: int                   # bytes from the start of the .npy to its data

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def analyze(source: ByteSource, an: Analysis) -> None:
    """A whole `.npy` file."""
    an.format = "numpy"
    loadable = analyze_array(source, an, name="array", record=None, base=0)
    _set_weights_only(an, loadable)


def analyze_zip(source: ByteSource, directory: ZipDirectory, an: Analysis) -> None:
    """A `.npz`: the zip forensics of the core, then every member as np.load reads it."""
    an.format = "numpy-zip"
    limits = an.options.limits
    errors: list[CkptError] = []
    locals_ = read_local_headers(source, directory.entries, errors=errors)
    before = len(an.findings)
    check_archive(directory, locals_, an, source=source)
    # an npz has no torch record prefix: that torch-only rule does not apply here
    an.findings[before:] = [f for f in an.findings[before:]
                            if f.code is not Code.ZIP_NAME_OUTSIDE_PREFIX]
    for exc in errors:
        an.add_error(exc)
    loadable = True
    headers_left = limits.max_npy_headers_total
    for i, (name, entry) in enumerate(directory.by_name.items()):
        key = name[:-4] if name.endswith(".npy") else name   # np.load's key for the member
        local = locals_.get(entry.index)
        try:
            member, base = _member_source(source, directory, entry, local, limits.max_bytes_read)
            head = member.read_at(0, min(member.size, 12))
            if head[:len(MAGIC)] != MAGIC:
                # np.load hands such members back as raw bytes: not an array
                an.add(Code.NPY_BAD_HEADER, f"npz member {name} is not a .npy array", record=name,
                       offset=base)
                declare_entry(an.regions, "npz member", header_offset=entry.header_offset,
                              compressed_size=entry.compressed_size, method=entry.method,
                              record=name)
                loadable = False
                continue
            # each header is capped, but thousands of them still cost seconds and gigabytes:
            # charge what this one declares before parsing it, stop (fail closed) when spent
            declared = declared_header(head)
            headers_left -= min(declared[2] if declared else 0, member.size)
            if headers_left < 0:
                an.add(Code.LIMIT_HEADER, f"the .npy headers of this .npz exceed "
                       f"{limits.max_npy_headers_total} bytes together: {name} and the "
                       f"{len(directory.by_name) - i - 1} members after it are not scanned",
                       record=name, offset=base)
                loadable = False
                break
            loadable &= analyze_array(member, an, name=key, record=name, base=base)
        except SourceError:
            raise
        except CkptError as exc:
            an.add(exc.code, exc.message, record=exc.record or name, offset=exc.offset)
            loadable = False
    _set_weights_only(an, loadable)


def _member_source(source: ByteSource, directory: ZipDirectory, entry: ZipEntry,
                   local: LocalHeader | None, max_nbytes: int) -> tuple[ByteSource, int | None]:
    """A stored member in place (absolute offsets), else its inflated bytes (no offsets)."""
    if (local is not None and entry.method == 0 and not entry.flags & 0x0041
            and entry.compressed_size == entry.uncompressed_size
            and local.data_offset + entry.compressed_size <= source.size):
        return WindowSource(source, local.data_offset, entry.compressed_size, entry.name), \
            local.data_offset
    data = read_record(source, directory, entry.name, max_nbytes=max_nbytes)
    return BytesSource(data, name=entry.name), None


def _set_weights_only(an: Analysis, loadable: bool) -> None:
    if an.has(Code.NPY_OBJECT_ARRAY):
        unsafe = sorted(g.full for g in an.globals.values() if g.status != "allowed")
        an.weights_only = WeightsOnly(loadable=False, error=OBJECT_ERROR, error_type="ValueError",
                                      unsafe_globals=unsafe)
    elif loadable:
        an.weights_only = WeightsOnly(loadable=True)   # no pickle: np.load needs no allow_pickle
    else:
        first = next((f.message for f in an.findings if f.code.effect == "invalid"), None)
        an.weights_only = WeightsOnly(loadable=False, error=first, error_type="ValueError")


def analyze_array(source: ByteSource, an: Analysis, *, name: str, record: str | None,
                  base: int | None) -> bool:
    """One .npy (whole file or npz member); True if np.load would return it unpickled.

    `base`: absolute offset of the .npy's first byte, None when it is not addressable
    (a deflated member).
    """
    abs_ = (lambda pos: base + pos) if base is not None else (lambda pos: None)
    try:
        header = read_npy_header(source, an.options.limits.max_npy_header_bytes)
    except (FormatError, LimitExceeded) as exc:
        an.add(exc.code, exc.message, record=record, offset=abs_(exc.offset or 0))
        return False
    size = source.size
    if record is None:   # a whole .npy file (an .npz member is on the archive's map)
        add_region(an.map_regions, "header", ".npy header", 0, min(header.data_pos, size))
    # np.load's first use of the shape, before the dtype check: multiply.reduce(shape,
    # dtype=int64) converts every dimension (the message never shows them: 4000-digit ints)
    if any(not -2**63 <= d <= 2**64 - 1 for d in header.shape):
        an.add(Code.NPY_BAD_HEADER, f"{name}: a dimension of the shape does not fit int64: "
               "Python int too large to convert to C long", record=record, offset=abs_(0))
        return False
    if header.dtype.hasobject:
        an.add(Code.NPY_OBJECT_ARRAY, f"{name}: object array ({header.dtype.str}): its data is a "
               "pickle; np.load refuses it without allow_pickle", record=record,
               offset=abs_(header.data_pos))
        _scan_object_pickle(source, an, header, record=record, base=base)
        if record is None:
            add_region(an.map_regions, "pickle", f"{name} (object array)", header.data_pos,
                       size - header.data_pos)
        return False
    refusal = _numpy_refusal(header.shape, header.dtype.itemsize)
    if refusal is not None:
        an.add(Code.NPY_BAD_HEADER, f"{name}: {refusal}", record=record, offset=abs_(0))
        return False
    if any(d < 0 for d in header.shape):
        an.add(Code.NPY_BAD_SHAPE, f"{name}: negative dimension in shape {header.shape}",
               record=record, offset=abs_(0))
        return False
    nbytes = header.count * header.dtype.itemsize
    end = header.data_pos + nbytes
    if end > size:
        an.add(Code.NPY_TRUNCATED, f"{name}: {header.shape} x {header.dtype.str} needs {nbytes} "
               f"bytes, the file has {size - header.data_pos}", record=record,
               offset=abs_(header.data_pos))
        return False
    if end < size:
        an.add(Code.NPY_TRAILING_DATA, f"{name}: {size - end} bytes after the array data "
               "(np.load ignores them)", record=record, offset=abs_(end))
    if len(an.tensors) >= an.options.limits.max_tensors:
        raise LimitExceeded(Code.LIMIT_TENSORS, f"more than {an.options.limits.max_tensors} arrays")
    if record is None:
        add_region(an.map_regions, "tensor_data", name, header.data_pos, nbytes)
    an.tensors.append(TensorEntry(
        name=name, path=[name], dtype=torch_dtype_name(header.dtype),
        shape=list(header.shape), stride=_strides(header.shape, header.fortran_order),
        storage_offset=0, storage=None, kind="array", requires_grad=False,
        data_offset=abs_(header.data_pos), nbytes=nbytes, record=record))
    return True


def _numpy_refusal(shape: tuple[int, ...], itemsize: int) -> str | None:
    """numpy's words when it cannot build an array of `shape` (np.load's reshape), else None.

    Checked in numpy's order: the dimension count, each dimension as an intp, then the byte
    size (zero dimensions skipped, as numpy does). Negative dimensions are left to the caller.
    An itemsize of 0 counts as 1: numpy would build (0, 2**62, 2**62) of `V0`, but its element
    strides exceed int64 and the manifest could not hold them; we refuse it (fail closed).
    Afterwards every element stride and the byte count fit int64.
    """
    if len(shape) > NPY_MAXDIMS:
        return (f"maximum supported dimension for an ndarray is currently {NPY_MAXDIMS}, "
                f"found {len(shape)}")
    if any(d > INTP_MAX for d in shape):
        return "Maximum allowed dimension exceeded"
    nbytes = max(itemsize, 1)
    for d in shape:
        if d > 0:
            nbytes *= d
            if nbytes > INTP_MAX:
                return ("array is too big; `arr.size * arr.dtype.itemsize` is larger than the "
                        "maximum possible size.")
    return None


def torch_dtype_name(dtype: np.dtype[Any]) -> str:
    """torch's name for native little-endian kinds, numpy's `dtype.str` otherwise."""
    if dtype.names is None and dtype.subdtype is None:
        return _TORCH_NAMES.get(dtype.str, dtype.str)
    return str(dtype.descr)


def _strides(shape: tuple[int, ...], fortran: bool) -> list[int]:
    dims = list(reversed(shape)) if fortran else list(shape)
    strides = [1] * len(dims)
    acc = 1
    for i in range(len(dims) - 1, -1, -1):
        strides[i] = acc
        acc *= max(dims[i], 1)
    return list(reversed(strides)) if fortran else strides


def _scan_object_pickle(source: ByteSource, an: Analysis, header: NpyHeader, *,
                        record: str | None, base: int | None) -> None:
    from ckptguard.core.judge import scan_pickle

    nbytes = source.size - header.data_pos
    limits = an.options.limits
    if nbytes > limits.max_pickle_bytes:
        raise LimitExceeded(Code.LIMIT_PICKLE_SIZE, f"object-array pickle of {nbytes} bytes",
                            record=record)
    data = source.read_at(header.data_pos, nbytes)
    scan_pickle(data, an, record=record,
                base_offset=(base + header.data_pos) if base is not None else 0)


def read_npy_header(source: ByteSource, max_header: int) -> NpyHeader:
    """numpy's read_magic + _read_array_header over a source (one or two reads)."""
    size = source.size
    first = source.read_at(0, min(size, HEAD_READ))
    if len(first) < 8:
        raise FormatError(Code.NPY_BAD_HEADER, "EOF: reading magic string", offset=0)
    if first[:6] != MAGIC:
        raise FormatError(Code.NPY_BAD_HEADER, f"the magic string is not correct; got {first[:6]!r}",
                          offset=0)
    version = (first[6], first[7])
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise FormatError(Code.NPY_BAD_HEADER, "we only support format version (1,0), (2,0), "
                          f"and (3,0), not {version}", offset=6)
    fmt = "<H" if version == (1, 0) else "<I"
    len_end = 8 + struct.calcsize(fmt)
    if size < len_end:
        raise FormatError(Code.NPY_BAD_HEADER, "EOF: reading array header length", offset=8)
    (hlen,) = struct.unpack_from(fmt, first, 8)
    data_pos = len_end + hlen
    if data_pos > size:
        raise FormatError(Code.NPY_BAD_HEADER, f"EOF: reading array header, expected {hlen} bytes "
                          f"got {size - len_end}", offset=len_end)
    # numpy compares the cap with the decoded length; latin-1/UTF-8 never shrink below 1/4
    if hlen > 4 * max_header:
        raise LimitExceeded(Code.LIMIT_HEADER, f"Header info length ({hlen}) is large and may not "
                            "be safe to load securely", offset=len_end)
    raw = first[len_end:data_pos] if data_pos <= len(first) else \
        first[len_end:] + source.read_at(len(first), data_pos - len(first))
    shape, fortran, dtype = parse_npy_header(raw, version, max_header, offset=len_end)
    return NpyHeader(version, shape, fortran, dtype, data_pos)


