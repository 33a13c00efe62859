"""Read tensors from a checkpoint (local path or URL) into NumPy, one ranged read each.

Strategy: the manifest comes from `core.scan.scan_source` (never Python's pickle); a
tensor's `data_offset`/`nbytes` name exactly the bytes its view spans, so reading it is
one `read_at` (a set of tensors is one `read_many`, which HttpSource coalesces). The
bytes become an array by `as_strided` over the read buffer (element strides x item
size, storage offset already in `data_offset`), after checking that the view stays
inside the buffer, then copied out. Big-endian files are swapped as torch does
(FORMATS.md §2.5): by the storage's element size (half of it for complex), and not at
all for UntypedStorage pids (v3 dtypes), so the result is byte-equal to torch.load. A
storage record another writer deflated has no offset in the file: its tensors come from the
inflated record, as torch.load reads them (not as mmap=True does: that maps the compressed bytes).

Example:
    >>> with open_checkpoint("model.pt") as ckpt:            # doctest: +SKIP
    ...     w = ckpt.read_tensor("layer.0.weight")
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np

from ckptguard.core.errors import CkptError, Code
from ckptguard.core.io.source import ByteSource, FileSource
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.records import field, record
from ckptguard.core.report import Report, SourceInfo, StorageEntry, TensorEntry
from ckptguard.core.state import ScanOptions
from ckptguard.core.torch.dtypes import ITEMSIZE, NUMPY_DTYPE
from ckptguard.core.zip.directory import parse_local_header, read_directory, read_record

_ML_DTYPES = frozenset({"bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
                        "float8_e4m3fnuz", "float8_e8m0fnu"})


class TensorUnreadable(ValueError):
    """The tensor exists in the manifest but its bytes cannot become a NumPy array."""


def numpy_dtype(name: str) -> np.dtype[np.generic]:
    """NumPy dtype of a torch dtype name (bfloat16/float8 via ml_dtypes)."""
    spec = NUMPY_DTYPE.get(name)
    if spec is None:
        raise TensorUnreadable(f"dtype {name} has no NumPy equivalent")
    if name in _ML_DTYPES:
        kind = getattr(ml_dtypes, spec, None)
        if kind is None:
            raise TensorUnreadable(f"dtype {name} needs a newer ml_dtypes")
        found: np.dtype[np.generic] = np.dtype(kind)
        return found
    return np.dtype(spec)


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


@record
class RemoteCheckpoint:
    """A scanned checkpoint whose tensors can be read on demand (local or remote)."""

    source: ByteSource
    report: Report
    _by_name: dict[str, TensorEntry] = field(init=False, repr=False)
    _ambiguous: dict[str, int] = field(init=False, repr=False)   # name -> how many share it
    _storages: dict[str, StorageEntry] = field(init=False, repr=False)
    _headers: dict[str, int] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self._by_name = {}
        self._ambiguous = {}   # keys that print alike (1 and "1"), an item and an attribute
        for t in self.report.tensors:
            if t.name in self._by_name:
                self._ambiguous[t.name] = self._ambiguous.get(t.name, 1) + 1
            else:
                self._by_name[t.name] = t
        self._storages = {s.key: s for s in self.report.storages}

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def big_endian(self) -> bool:
        return any(f.code == Code.TORCH_BIG_ENDIAN for f in self.report.findings)

    def entry(self, name: str) -> TensorEntry:
        if name in self._ambiguous:
            raise KeyError(f"{self._ambiguous[name]} tensors are named {name!r} in "
                           f"{self.source.name} (keys that print alike, e.g. 1 and '1', or an "
                           "item and an attribute of one name): "
                           "the name does not say which one to read")
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.source.name}") from None

    def read_tensor(self, name: str) -> np.ndarray:
        """The tensor `name` as a new C-contiguous array: exactly one ranged read (a deflated
        record: the record, inflated)."""
        return self.read_tensors([name])[name]

    def read_tensors(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """Several tensors; their spans go to the source at once (coalesced over HTTP)."""
        entries = [self.entry(n) for n in dict.fromkeys(names)]
        out = {e.name: self._inflated(e) for e in entries if self._deflated(e)}
        entries = [e for e in entries if e.name not in out]
        spans = [self._span(e) for e in entries]
        headers = [self._local_header(e) if s[1] else None for e, s in zip(entries, spans, strict=True)]
        # a remote read starts at the record's local header, to check where its data begins
        wanted = [s if h is None else (h, s[0] + s[1] - h)
                  for s, h in zip(spans, headers, strict=True) if s[1]]
        blobs = iter(self.source.read_many(wanted)) if wanted else iter(())
        for e, s, h in zip(entries, spans, headers, strict=True):
            data = next(blobs) if s[1] else b""
            if h is not None:
                data = self._after_local_header(e, h, data)
            out[e.name] = self._to_array(e, data)
        return out

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> RemoteCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- where the data begins ------------------------------------------------------

    def _local_header(self, entry: TensorEntry) -> int | None:
        """The local header offset of the tensor's zip record when the scan did not read
        it (a remote scan checks calculated offsets against the central directory only);
        None when there is nothing to check."""
        if getattr(self.source, "random_access_cheap", True) or entry.storage is None:
            return None
        storage = self._storages.get(entry.storage)
        if storage is None or storage.record is None:
            return None
        if self._headers is None:
            directory = read_directory(self.source)   # the tail is cached: no new request
            self._headers = {s.record: e.header_offset for s in self._storages.values()
                             if s.record is not None
                             and (e := directory.find(s.record)) is not None}
        return self._headers.get(storage.record)

    def _after_local_header(self, entry: TensorEntry, header: int, data: bytes) -> bytes:
        """The tensor's bytes from a read that starts at its record's local header, after
        checking that the header puts the record's data where the manifest says (torch,
        through miniz, reads it where the local header says)."""
        try:
            begins = parse_local_header(data, header).data_offset
        except CkptError as exc:
            raise TensorUnreadable(f"{entry.name}: {exc.message} at offset {header}") from exc
        storage = self._storages[entry.storage]  # type: ignore[index]
        if begins != storage.data_offset or entry.data_offset is None:
            raise TensorUnreadable(
                f"{entry.name}: the local header of {storage.record} puts its data at {begins}, "
                f"not at the calculated {storage.data_offset}: this file reads differently to "
                "torch and to offset-calculating readers")
        return data[entry.data_offset - header:]

    # --- deflated records ------------------------------------------------------------

    def _deflated(self, entry: TensorEntry) -> bool:
        """A tensor whose storage record another writer deflated (7-Zip's default level,
        zipfile.ZIP_DEFLATED): it has no offset in the file, torch.load inflates the record."""
        storage = self._storages.get(entry.storage or "")
        return (entry.data_offset is None and storage is not None and storage.record is not None
                and storage.data_offset is None and storage.dtype == entry.dtype
                and entry.kind in ("tensor", "parameter"))

    def _inflated(self, entry: TensorEntry) -> np.ndarray:
        """The tensor from its inflated record, as torch.load reads it (core.zip's read_record:
        deflate only, size-capped); the record is inflated whole, so this costs its size."""
        storage = self._storages[entry.storage]  # type: ignore[index]
        try:
            record = read_record(self.source, read_directory(self.source), storage.record or "")
        except CkptError as exc:
            raise TensorUnreadable(f"{entry.name}: {exc.message}") from exc
        start = entry.storage_offset * ITEMSIZE.get(storage.dtype, 1)
        return self._to_array(entry, record[start:start + entry.nbytes])

    # --- bytes -> array -------------------------------------------------------------

    def _span(self, entry: TensorEntry) -> tuple[int, int]:
        numel = 1
        for n in entry.shape:
            numel *= n
        if numel and entry.data_offset is None:
            raise TensorUnreadable(f"{entry.name}: no data in the file ({entry.kind})")
        return (entry.data_offset or 0, entry.nbytes if numel else 0)

    def _to_array(self, entry: TensorEntry, data: bytes) -> np.ndarray:
        dtype = numpy_dtype(entry.dtype)
        itemsize = dtype.itemsize
        if ITEMSIZE.get(entry.dtype, itemsize) != itemsize:
            raise TensorUnreadable(f"{entry.name}: item size of {entry.dtype} disagrees")
        shape, stride = tuple(entry.shape), tuple(entry.stride)
        if len(shape) != len(stride) or any(n < 0 for n in shape) or any(s < 0 for s in stride):
            raise TensorUnreadable(f"{entry.name}: shape {list(shape)} / stride {list(stride)}")
        # a dimension of one element never steps: its stride (any int torch took) is not used
        stride = tuple(0 if n == 1 else s for n, s in zip(shape, stride, strict=True))
        if 0 in shape:
            try:
                return np.empty(shape, dtype=dtype)
            except ValueError as exc:   # numpy still multiplies the other dimensions
                raise TensorUnreadable(f"{entry.name}: shape {list(shape)}: {exc}") from exc
        last = sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        # as_strided trusts its arguments: make sure the view stays inside the buffer
        if (last + 1) * itemsize > len(data) or len(data) % itemsize:
            raise TensorUnreadable(f"{entry.name}: view needs {(last + 1) * itemsize} bytes, "
                                   f"read {len(data)}")
        raw = self._swapped(entry, data) if self.big_endian else data
        # as_strided goes through __array_interface__, which ml_dtypes types cannot cross:
        # stride opaque items of the same size, copy out, then reinterpret
        flat = np.frombuffer(raw, dtype=np.dtype((np.void, itemsize)), count=last + 1)
        try:
            view = np.lib.stride_tricks.as_strided(
                flat, shape=shape, strides=tuple(s * itemsize for s in stride), writeable=False)
            out: np.ndarray = np.array(view, copy=True, order="C").view(dtype)
        except (ValueError, OverflowError, MemoryError) as exc:
            # a view of a few bytes can stand for more elements than memory holds (an
            # expanded view torch keeps as one), or than numpy indexes: the copy is refused
            raise TensorUnreadable(f"{entry.name}: shape {list(shape)} of {entry.dtype} cannot "
                                   f"be written out as an array here ({exc})") from exc
        # torch's lazy bits: the stored bytes are the un-conjugated / un-negated values
        if "conj" in entry.flags:
            out = np.conj(out)
        if "neg" in entry.flags:
            out = np.negative(out)
        return out

    def _swapped(self, entry: TensorEntry, data: bytes) -> bytes:
        """torch's byteswap: by the storage pid's element size (FORMATS.md §2.5)."""
        if sys.byteorder == "big":  # pragma: no cover - no big-endian CI host
            return data
        storage = self._storages.get(entry.storage or "")
        if storage is None:
            return data
        unit = ITEMSIZE.get(storage.dtype, 1)
        if storage.dtype.startswith("complex"):
            unit = max(unit // 2, 1)
        if unit == 1 or len(data) % unit:
            return data
        return np.frombuffer(data, dtype=f"u{unit}").byteswap().tobytes()


def open_checkpoint(target: str, *, headers: Mapping[str, str] | None = None,
                    guard: UrlGuard | None = None, options: ScanOptions | None = None,
                    source: ByteSource | None = None) -> RemoteCheckpoint:
    """Scan a local path or http(s) URL and return it ready for tensor reads."""
    from ckptguard.core.scan import scan_source  # the scan pipeline pulls in every format parser

    opts = options or ScanOptions()
    info: SourceInfo
    if source is None and is_url(target):
        from ckptguard.core.io.http import HttpSource

        source = HttpSource(target, headers=headers, guard=guard, limits=opts.limits)
        info = SourceInfo(kind="url", name=source.name, url=target, size=source.size)
    elif source is None:
        source = FileSource(target)
        info = SourceInfo(kind="file", name=source.name, size=source.size)
    else:
        info = SourceInfo(kind="bytes", name=source.name, size=source.size)
    try:
        report = scan_source(source, options=opts, info=info)
    except BaseException:
        close = getattr(source, "close", None)
        if callable(close):
            close()
        raise
    if hasattr(source, "budget"):
        source.budget = None  # the scan's byte budget is spent; tensor reads are asked for
    return RemoteCheckpoint(source, report)


def scan_url(url: str, *, headers: Mapping[str, str] | None = None, guard: UrlGuard | None = None,
             options: ScanOptions | None = None, info: SourceInfo | None = None) -> Report:
    """Scan an http(s) URL over Range requests (a plain function: runs in a worker process).

    Raises SourceError (SOURCE_URL_REFUSED for the guard, SOURCE_HTTP/SOURCE_CHANGED/
    SOURCE_SHORT_READ for the server) when the bytes cannot be read; any bytes -> Report.
    """
    from ckptguard.core.io.http import HttpSource
    from ckptguard.core.scan import scan_source

    opts = options or ScanOptions()
    with HttpSource(url, headers=headers, guard=guard, limits=opts.limits) as source:
        if info is None:
            info = SourceInfo(kind="url", name=source.name, url=url)
        info.size = source.size
        return scan_source(source, options=opts, info=info)

