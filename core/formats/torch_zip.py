"""torch.save zip checkpoints (and TorchScript archives) — FORMATS.md §1-§3.

Strategy: read the central directory once (core.zip.directory), the local headers we need,
and the small metadata records together; replay torch.load's container checks in
torch's order (version record, subdirectory rule, TorchScript, byteorder, alignment,
data.pkl), then the pickle (core.judge). Storage offsets come from the pickle
order with the `calculate_storage_offsets` chain (core.zip.offsets) and are cross-checked
against the zip headers; the weights themselves are never read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ckptguard.core.errors import CkptError, Code
from ckptguard.core.io.source import ByteSource
from ckptguard.core.judge import scan_pickle
from ckptguard.core.manifest.build import SiteTable, StorageSite, build_manifest
from ckptguard.core.pickle.renames import torch_map
from ckptguard.core.records import record
from ckptguard.core.regions.region import RegionKind, declare_entry
from ckptguard.core.state import Analysis
from ckptguard.core.torch.answer import set_weights_only
from ckptguard.core.torch.container import (
    KNOWN_RECORDS,
    META_RECORDS,
    SERIALIZATION_ID,
    SMALL_RECORD_MAX,
    layout_error,
    serialization_id_error,
    storage_alignment,
    version_error,
)
from ckptguard.core.torch.rules import storage_itemsize
from ckptguard.core.torch.torch_error import UNSAFE_MESSAGE, TorchError, cpp_error
from ckptguard.core.values import PersId
from ckptguard.core.zip.checks import check_archive, verify_crcs
from ckptguard.core.zip.directory import (
    LOCATOR_PAST_END,
    ZIP64_CD_TOO_BIG,
    ZIP64_TOO_MANY,
    LocalHeader,
    ZipDirectory,
    ZipEntry,
    read_directory,
    read_local_headers,
    read_record,
)
from ckptguard.core.zip.layout import (
    ENCRYPTION_FLAGS,
    EOCD_SIZE,
    FLAG_ENCRYPTED,
    FLAG_MASKED_HEADER,
    FLAG_PATCHED,
    FLAG_STRONG_ENCRYPTION,
    miniz_directory,
)
from ckptguard.core.zip.offsets import chain_storage_offsets, verify_chain, written_by_torch

_MINIZ_HINT = (". This is an internal miniz error. If you are seeing this error, there is a high "
               "likelihood that your checkpoint file is corrupted. This can happen if the checkpoint "
               "was not saved properly, was transferred incorrectly, or the file was modified after "
               "saving.")


def zip_open_error(exc: CkptError, size: int) -> TorchError | None:
    """miniz's words when `mz_zip_reader_init` refuses what `read_directory` refused (None:
    a limit of ours, not torch's)."""
    if exc.code is Code.ZIP_NO_EOCD:
        return unreadable_zip_error(size)
    if exc.message.startswith(LOCATOR_PAST_END):
        return _miniz_error("failed reading zip archive", "not a ZIP archive")
    if exc.message.startswith(ZIP64_TOO_MANY):
        return _miniz_error("failed reading zip archive", "too many files")
    if exc.message.startswith(ZIP64_CD_TOO_BIG):
        return _miniz_error("failed reading zip archive", "unsupported central directory size")
    if exc.code is Code.ZIP_MULTIPLE_DISKS:
        return _miniz_error("failed reading zip archive", "unsupported multidisk archive")
    if exc.code in (Code.ZIP_BAD_EOCD, Code.ZIP_BAD_CENTRAL_DIR):
        return _miniz_error("failed reading zip archive", "invalid header or archive is corrupted")
    return None


def masked_header_error(directory: ZipDirectory) -> TorchError | None:
    """miniz refuses the whole archive while it reads the central directory when any entry
    sets bit 13 (local header masked), before any record is read."""
    if any(e.flags & FLAG_MASKED_HEADER for e in directory.entries):
        return _miniz_error("failed reading zip archive", "unsupported encryption")
    return None


def unreadable_zip_error(size: int) -> TorchError:
    """torch.load on a file that starts like a zip but has no end record miniz finds (a
    truncated download): miniz's words, by its size check first."""
    reason = "not a ZIP archive" if size < EOCD_SIZE else "failed finding central directory"
    return TorchError("RuntimeError", f"PytorchStreamReader failed reading zip archive: {reason}"
                      + _MINIZ_HINT)


def zip_answer(source: ByteSource, an: Analysis) -> TorchError | None:
    """torch.load(weights_only=True) on a zip that is no torch checkpoint (an .npz, a .pt2, any
    other archive), in torch's order: miniz opens it, the first entry must sit in a folder
    (inline_container.cc:180), then the version record, every entry under that folder,
    TorchScript, byteorder/alignment, and data.pkl must exist. Never None: such a zip has no
    data.pkl torch would accept (a torch zip is judged by `analyze_zip`)."""
    try:
        directory = read_directory(source, an.options.limits)
    except CkptError as exc:
        error = zip_open_error(exc, source.size)
        if error is None:
            raise
        return error
    masked = masked_header_error(directory)
    if masked is not None:
        return masked
    if directory.entries and b"/" not in directory.entries[0].name_bytes:
        return cpp_error(b"[enforce fail at inline_container.cc:180] . file in archive is not in a "
                         b"subdirectory: " + directory.entries[0].name_bytes)
    prefix = directory.prefix()
    records = _records_found(directory, prefix, META_RECORDS)
    wanted = list(records.values())
    locals_ = read_local_headers(source, wanted, errors=[])
    unreadable = unreadable_records(source, directory, locals_, wanted)
    meta = _read_small_records(source, directory, records, locals_, unreadable)
    is_torchscript = f"{prefix}/constants.pkl" in directory.by_name
    error = _container_error(directory, prefix, meta, source, is_torchscript, unreadable)
    if error is None and directory.find(f"{prefix}/data.pkl") is None:
        error = missing_record_error("data.pkl")
    return error or TorchError("Unmodelled", "not modelled: torch.load of this zip's data.pkl")


def missing_record_error(name: str) -> TorchError:
    return TorchError("RuntimeError", f"PytorchStreamReader failed locating file {name}: file not found"
                      + _MINIZ_HINT)


@record(slots=True)
class ZipStorageResolver:
    """What `load_tensor` finds in the archive for `data/<key>` (torch's container checks)."""

    directory: ZipDirectory
    prefix: str
    unreadable: Collection[int] = ()   # entries whose bytes miniz cannot reach
    source: ByteSource | None = None   # to read small records torch reads as data (nested metadata)
    locals_: Mapping[int, LocalHeader] | None = None

    def read(self, key: str, nbytes: int) -> bytes | None:
        """data/<key>'s bytes, when it holds exactly `nbytes` and torch could read it."""
        entry = self.directory.find(f"{self.prefix}/data/{key}")
        if self.source is None or entry is None or entry.uncompressed_size != nbytes \
                or record_error(self.directory, self.prefix, f"data/{key}", self.unreadable):
            return None
        return read_record(self.source, self.directory, entry.name, locals_=self.locals_)

    def check(self, key: str, nbytes: int) -> TorchError | None:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:   # pybind11 cannot hand a lone surrogate to C++ as a string
            return TorchError("TypeError", "get_storage_from_record(): incompatible function "
                              "arguments. The following argument types are supported:")
        entry = self.directory.find(f"{self.prefix}/data/{key}")
        if entry is None:
            return missing_record_error(f"data/{key}")
        if entry.uncompressed_size != nbytes:
            # CVE-2026-24747 fix: the record must hold exactly numel * itemsize bytes
            return TorchError("RuntimeError",
                              f"record size ({entry.uncompressed_size} bytes) does not match expected "
                              f"size ({nbytes} bytes = {nbytes} elements * 1 bytes/element) for dtype Byte")
        return record_error(self.directory, self.prefix, f"data/{key}", self.unreadable)



def analyze_zip(source: ByteSource, directory: ZipDirectory, an: Analysis) -> None:
    prefix = directory.prefix()

    def entry(record: str) -> ZipEntry | None:
        return directory.find(f"{prefix}/{record}")   # as miniz finds it (case-folded)

    # Local headers: all of them when random reads are cheap (local files); otherwise only
    # those the offset arithmetic needs, so a remote scan stays at a few requests.
    cheap = getattr(source, "random_access_cheap", True)
    wanted: list[ZipEntry] = list(directory.entries) if cheap else [
        e for e in (entry("data.pkl"), entry("data/0"), entry(".data/serialization_id"),
                    *(entry(r) for r in META_RECORDS))
        if e is not None]
    header_errors: list[CkptError] = []
    locals_ = read_local_headers(source, wanted, errors=header_errors)
    for exc in header_errors:
        an.add(exc.code, exc.message, record=exc.record, offset=exc.offset)
    check_archive(directory, locals_, an, source=source)
    if an.options.verify_crc:
        verify_crcs(source, directory, an)
    # a remote scan reads only the local headers the offset chain needs: say how many
    an.io["zip_local_headers_read"] = len(locals_)
    an.io["zip_entries"] = len(directory.entries)

    unreadable = unreadable_records(source, directory, locals_, wanted)
    meta = _read_small_records(source, directory,
                               _records_found(directory, prefix, (*META_RECORDS, SERIALIZATION_ID)),
                               locals_, unreadable)
    is_torchscript = f"{prefix}/constants.pkl" in directory.by_name  # exact, as torch lists it
    torch_error = _container_error(directory, prefix, meta, source, is_torchscript, unreadable)
    if is_torchscript:
        an.format = "torchscript"
        an.add(Code.TORCHSCRIPT_ARCHIVE, "TorchScript archive: holds code, refused by weights_only",
               record=f"{prefix}/constants.pkl")

    pkl_entry = entry("data.pkl")
    if pkl_entry is None:
        err = torch_error or missing_record_error("data.pkl")
        an.add(Code.TORCH_MISSING_RECORD, "no data.pkl record", record=f"{prefix}/data.pkl")
        set_weights_only(an, err, None)
        return
    pkl_name = pkl_entry.name
    torch_error = torch_error or record_error(directory, prefix, "data.pkl", unreadable)
    try:
        data = read_record(source, directory, pkl_name, locals_=locals_)
    except CkptError as exc:   # the error becomes the finding; torch's answer is its own
        set_weights_only(an, torch_error or TorchError(
            "Unmodelled", f"not modelled: torch reading this data.pkl ({exc.message})"), None)
        raise
    pkl_local = locals_.get(pkl_entry.index)
    base = pkl_local.data_offset if pkl_local is not None and pkl_entry.method == 0 else 0
    resolver = ZipStorageResolver(directory, prefix, unreadable, source, locals_)
    scan = scan_pickle(data, an, record=pkl_name, base_offset=base, resolver=resolver)
    for extra_pkl in ("constants.pkl",):  # TorchScript constants are pickles too
        ent = entry(extra_pkl)
        if ent is not None:
            scan_pickle(read_record(source, directory, ent.name, locals_=locals_), an,
                        record=ent.name, base_offset=0)

    storages = ([(u.key, u.nbytes) for u in scan.storages] if scan.fast
                else storages_in_order(scan.vm.persids))
    if not is_torchscript:
        sites = _storage_sites(source, directory, prefix, meta, locals_, storages, an)
        build_manifest(scan.root, SiteTable(sites), an, record=pkl_name,
                       persids=scan.vm.persids, built=scan.weights_only.built)
        _flag_unreferenced(directory, prefix, {k for k, _ in storages}, an)
    if meta.get("byteorder") == b"big":
        an.add(Code.TORCH_BIG_ENDIAN, "storages are big-endian",
               record=getattr(entry("byteorder"), "name", f"{prefix}/byteorder"))
    set_weights_only(an, torch_error or scan.weights_only.error or serialization_id_error(meta),
                     None if scan.fast else data, calls=scan.vm.calls)


def check_generic_zip(source: ByteSource, directory: ZipDirectory, an: Analysis) -> None:
    """An unrecognised zip: forensics only, and every member that is a pickle gets scanned."""
    cheap = getattr(source, "random_access_cheap", True)
    locals_ = read_local_headers(source, directory.entries if cheap else [])
    check_archive(directory, locals_, an, source=source)
    for i, ent in enumerate(directory.entries):
        small = ent.uncompressed_size <= an.options.limits.max_pickle_bytes
        if i < 64 and ent.name.endswith((".pkl", ".pickle")) and small \
                and directory.by_name.get(ent.name) is ent and ent.method in (0, 8) \
                and not ent.flags & ENCRYPTION_FLAGS:
            scan_pickle(read_record(source, directory, ent.name, locals_=locals_), an,
                        record=ent.name, base_offset=0)
        else:   # any member may be what a custom loader unpickles: sniffed, judged if a pickle
            _declare_member(an, "zip member", ent)


def storages_in_order(persids: Iterable[PersId]) -> list[tuple[str, int]]:
    """(key, nbytes) per distinct storage key, in first-encounter order (FORMATS.md §2.2)."""
    seen: dict[str, int] = {}
    for p in persids:
        pid = p.pid
        if not (isinstance(pid, tuple) and len(pid) >= 5):
            continue
        st, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(key, str) or key in seen or not isinstance(numel, int):
            continue
        seen[key] = numel * storage_itemsize(st, torch_map)
    return list(seen.items())


def _records_found(directory: ZipDirectory, prefix: str, records: Iterable[str]) -> dict[str, ZipEntry]:
    """record -> the entry torch reads for it (miniz's lookup: `.DATA/VERSION` is
    `.data/version`), for the records the archive has."""
    return {r: e for r in records if (e := directory.find(f"{prefix}/{r}")) is not None}


def _read_small_records(source: ByteSource, directory: ZipDirectory, records: Mapping[str, ZipEntry],
                        locals_: Mapping[int, LocalHeader] | None = None,
                        unreadable: Collection[int] = ()) -> dict[str, bytes]:
    """record -> its bytes, keyed by the name torch asks for (not the entry's own spelling)."""
    out: dict[str, bytes] = {}
    for asked, ent in records.items():
        if ent.uncompressed_size <= SMALL_RECORD_MAX and ent.index not in unreadable \
                and ent.method in (0, 8) and not ent.flags & ENCRYPTION_FLAGS:
            out[asked] = read_record(source, directory, ent.name, locals_=locals_)
    return out


def unreadable_records(source: ByteSource, directory: ZipDirectory,
                       locals_: Mapping[int, LocalHeader], wanted: Iterable[ZipEntry]) -> set[int]:
    """Entries of `wanted` whose bytes miniz cannot reach: no valid local header, or data
    past the end of the file ("invalid header or archive is corrupted"). An entry of no
    bytes is always reachable: miniz's extract returns before it reads the local header
    ("Empty file, or a directory")."""
    bad = set()
    for e in wanted:
        if e.compressed_size == 0:
            continue
        local = locals_.get(e.index)
        if local is None or local.data_offset + e.compressed_size > source.size:
            bad.add(e.index)
    return bad


def record_error(directory: ZipDirectory, prefix: str, record: str,
                 unreadable: Collection[int]) -> TorchError | None:
    """What torch's `getRecord(record)` raises on this archive, if anything (miniz's words)."""
    ent = directory.find(f"{prefix}/{record}")
    if ent is None:
        return missing_record_error(record)
    # mz_zip_reader_file_stat -> mz_zip_reader_is_file_supported, in its order
    if ent.method not in (0, 8):
        return _miniz_error(f"failed retrieving file meta-data for {record}", "unsupported method")
    if ent.flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION):
        return _miniz_error(f"failed retrieving file meta-data for {record}", "unsupported encryption")
    if ent.flags & FLAG_PATCHED:
        return _miniz_error(f"failed retrieving file meta-data for {record}", "unsupported feature")
    if ent.index in unreadable:
        return _miniz_error(f"failed reading file {record}", "invalid header or archive is corrupted")
    if ent.uncompressed_size and miniz_directory(ent.name_bytes, ent.external_attr):
        return TorchError("Unmodelled", f"not modelled: torch reads {record} as uninitialized "
                          "memory (a directory to its zip reader)")
    return None


def _miniz_error(what: str, reason: str) -> TorchError:
    return TorchError("RuntimeError", f"PytorchStreamReader {what}: {reason}" + _MINIZ_HINT)


def _container_error(directory: ZipDirectory, prefix: str, meta: Mapping[str, bytes],
                     source: ByteSource, is_torchscript: bool,
                     unreadable: Collection[int] = ()) -> TorchError | None:
    """torch.load's checks before unpickling, in its order (FORMATS.md §0, §1.1, §2.5): the
    reader's init (version record, serialization id), the TorchScript check's record list,
    then `_load`'s .format_version, byteorder and .storage_alignment reads."""
    if source.read_at(0, 4) != b"PK\x03\x04":
        return TorchError("UnpicklingError", "torch.load does not read this as a zip: the first "
                          "bytes are not a zip local header (it takes the legacy path)")
    if directory.shift:   # miniz takes the offsets as written: no record is where they say
        return TorchError("RuntimeError", "PytorchStreamReader failed reading zip archive: "
                          "invalid header or archive is corrupted" + _MINIZ_HINT)
    masked = masked_header_error(directory)
    if masked is not None:
        return masked
    has = {r for r in META_RECORDS if directory.find(f"{prefix}/{r}") is not None}
    version_record = ".data/version" if ".data/version" in has else "version"
    if version_record in has:
        error = record_error(directory, prefix, version_record, unreadable)
        if error is not None:
            return error
    version = version_error(meta)
    if version is not None:
        return version
    if directory.find(f"{prefix}/.data/serialization_id") is not None:
        error = record_error(directory, prefix, ".data/serialization_id", unreadable)
        if error is not None:
            return error
    raw_prefix = directory.raw_prefix()
    for ent in directory.entries:   # get_all_records: every name under the prefix, as str
        if not ent.name_bytes.startswith(raw_prefix + b"/"):
            return cpp_error(b"[enforce fail at inline_container.cc:340] . file in archive is not in a "
                             b"subdirectory " + raw_prefix + b"/: " + ent.name_bytes)
    for ent in directory.entries:
        try:
            ent.name_bytes[len(raw_prefix) + 1:].decode("utf-8")
        except UnicodeDecodeError as exc:   # pybind11 turns each name into a str
            return TorchError("UnicodeDecodeError", str(exc))
    if is_torchscript:
        return TorchError("RuntimeError", "Cannot use ``weights_only=True`` with TorchScript "
                          "archives passed to ``torch.load``. " + UNSAFE_MESSAGE)
    for member in (".format_version", "byteorder", ".storage_alignment"):
        if member in has:
            error = record_error(directory, prefix, member, unreadable)
            if error is not None:
                return error
        if member == "byteorder":
            error = layout_error({k: v for k, v in meta.items() if k == "byteorder"})
            if error is not None:
                return error
    return layout_error(meta)


def _storage_sites(source: ByteSource, directory: ZipDirectory, prefix: str,
                   meta: Mapping[str, bytes], locals_: dict[int, LocalHeader],
                   storages: list[tuple[str, int]], an: Analysis) -> dict[str, StorageSite]:
    """Where each storage's bytes are: chained arithmetic, cross-checked with the headers."""
    entries = {key: directory.find(f"{prefix}/data/{key}") for key, _ in storages}
    present = {k: e for k, e in entries.items() if e is not None}
    chained: dict[str, int] = {}
    verified: dict[str, bool] = {}
    can_chain = meta.get(".format_version", b"") >= b"1" and all(
        e.method == 0 for e in present.values()) and len(present) == len(storages)
    first = present.get("0")
    if can_chain and first is not None and storages:
        first_local = locals_.get(first.index) or read_local_headers(source, [first]).get(first.index)
        align = storage_alignment(meta)
        if first_local is not None:
            if not written_by_torch(first_local, first.uncompressed_size, align):
                # another writer: torch's arithmetic describes nothing here, so every local
                # header is read and the chain checked against where torch really reads
                locals_ = {**locals_, **read_local_headers(
                    source, [e for e in present.values() if e.index not in locals_])}
            try:
                chain = chain_storage_offsets(prefix, first_local.data_offset, storages, align,
                                              first_header_offset=first_local.offset)
            except CkptError as exc:
                an.add(exc.code, exc.message, record=exc.record, offset=exc.offset)
            else:
                verified = verify_chain(chain, directory, locals_, an)
                # torch reads each record where its local header says (miniz), not where
                # the chain lands: a mismatched storage falls back to its local header
                chained = {c.key: c.data_offset for c in chain if verified.get(c.key)}
    elif storages and present:
        an.add(Code.TORCH_OFFSET_UNVERIFIABLE,
               "storage offsets cannot be chained (pre-2.7 layout or compressed records); "
               "read from the local headers instead"
               + _mapped_compressed(sorted(k for k, e in present.items() if e.method == 8)))
    missing_locals = [e for k, e in present.items() if k not in chained and e.index not in locals_]
    if missing_locals:
        locals_ = {**locals_, **read_local_headers(source, missing_locals)}
    sites: dict[str, StorageSite] = {}
    for key, ent in present.items():
        local = locals_.get(ent.index)
        if key in chained:
            offset: int | None = chained[key]
            ok = verified.get(key, False)
        else:
            offset = local.data_offset if local is not None and ent.method == 0 else None
            ok = local is not None and local.name_bytes == ent.name_bytes
        sites[key] = StorageSite(record=ent.name, data_offset=offset,
                                 record_nbytes=ent.uncompressed_size, verified=ok)
    for key, found in entries.items():
        if found is None:
            an.add(Code.TORCH_MISSING_RECORD, f"storage {key!r} has no data/{key} record",
                   record=f"{prefix}/data/{key}")
    return sites


_NAMED_STORAGES = 8   # deflated storages a note names before it counts the rest


def _mapped_compressed(keys: list[str]) -> str:
    """What torch.load(mmap=True) makes of deflated storages (another zip writer's default,
    7-Zip's -mx=5): it maps each at its record's data, so the compressed bytes become the
    tensor's values, while torch.load without mmap inflates them (measured, torch 2.13)."""
    if not keys:
        return ""
    named = ", ".join(f"data/{k}" for k in keys[:_NAMED_STORAGES])
    more = f" and {len(keys) - _NAMED_STORAGES} more" if len(keys) > _NAMED_STORAGES else ""
    return (f"; {named}{more} deflated: torch.load inflates them, torch.load(mmap=True) reads "
            "their compressed bytes as the tensors' values")


def _flag_unreferenced(directory: ZipDirectory, prefix: str, keys: set[str], an: Analysis) -> None:
    """Records torch never reads: reported, and their content judged (core.regions). A
    record torch reads is the entry miniz finds for its name, in any case (`VERSION`)."""
    read = {e.index for r in (*KNOWN_RECORDS, *(f"data/{k}" for k in keys))
            if (e := directory.find(f"{prefix}/{r}")) is not None}
    for ent in directory.entries:
        if directory.by_name.get(ent.name) is not ent:   # a duplicate name torch does not pick
            _declare_member(an, "shadowed entry", ent)
            continue
        if not ent.name.startswith(prefix + "/"):
            _declare_member(an, "outside-prefix entry", ent)
            continue
        if ent.index in read:
            continue
        an.add(Code.TORCH_UNREFERENCED_RECORD, f"record {ent.name!r} is not referenced by the pickle",
               record=ent.name, offset=ent.header_offset)
        _declare_member(an, "unreferenced record", ent)


def _declare_member(an: Analysis, kind: RegionKind, ent: ZipEntry) -> None:
    declare_entry(an.regions, kind, header_offset=ent.header_offset, compressed_size=ent.compressed_size,
                  method=ent.method, record=ent.name)
