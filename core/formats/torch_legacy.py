"""Legacy torch checkpoints: the pickled stream of `_use_new_zipfile_serialization=False`
(FORMATS.md §4.1), and the dispatch to the pre-0.2 `.tar` layout (§4.2, core.formats.torch_tar).

Strategy: torch reads five pickles back to back — magic number, protocol version,
sys_info, the main object, the sorted storage-key list — then, per key in that list's
order, an int64 LE element count and the storage's bytes. We read only the pickles
region (a window that grows geometrically until each pickle reaches STOP), pass every
pickle through `core.judge.scan_pickle` (weights-only emulation + VM + threats),
and locate the storage blocks WITHOUT reading their data: offsets are predicted from the
pids' sizes and all 8-byte counts are fetched with one `read_many`; a count that
disagrees re-predicts from there. torch.load's weights_only outcome is replayed in its
order (torch/serialization.py `_legacy_load`): tar attempt, magic, protocol, sys_info,
main pickle, key list, then per-block size and EOF checks, in torch's words.
"""

from __future__ import annotations

import struct

from ckptguard.core import sniff
from ckptguard.core.errors import CkptError, Code, Effect, LimitExceeded
from ckptguard.core.filemap import add_region
from ckptguard.core.formats import torch_tar
from ckptguard.core.io.source import ByteSource
from ckptguard.core.judge import PickleScan, scan_pickle
from ckptguard.core.pickle.renames import torch_map
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.pickle.window import PickleWindow
from ckptguard.core.records import record
from ckptguard.core.state import Analysis
from ckptguard.core.threats.assess import assess
from ckptguard.core.torch.answer import set_weights_only
from ckptguard.core.torch.dtypes import ITEMSIZE
from ckptguard.core.torch.rules import storage_itemsize
from ckptguard.core.torch.torch_error import TorchError
from ckptguard.core.torch.weights_only import WeightsOnlyResult, emulate
from ckptguard.core.values import Call, Global, PersId, brief

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

    from ckptguard.core.manifest.build import StorageSite

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
COUNT = struct.Struct("<q")
_PICKLES = ("magic number", "protocol version", "sys_info", "main object", "storage key list")
# torch/csrc/serialization.cpp: TORCH_CHECK with printf markers it never formats (c10::str
# concatenates its arguments); the two numbers are appended as they are, without a space (file
# count x element size, then the storage's nbytes). Measured on torch 2.13:
# "storage has wrong byte size: expected %ld got %ld108". weights_only.error keeps torch's
# words; our own findings say it with the numbers in place.
_WRONG_SIZE = "storage has wrong byte size: expected %ld got %ld"
_EOF = "unexpected EOF, expected {} more bytes. The file might be corrupted."
_FIRST_WINDOW = 1 << 16     # most legacy pickles fit; the window doubles as needed
_UNUSED_BLOCK_KEYS = 8       # findings for overwritten/missing blocks, then a summary


def legacy_answer(source: ByteSource, an: Analysis, *,
                  first: WeightsOnlyResult | None = None) -> TorchError | None:
    """What `torch.load(path, weights_only=True)` says about a file it reads as legacy (any
    file that does not start with a zip local header: a plain pickle, NumPy, safetensors
    under another name, text): its tar attempt, then the magic-number pickle, read with the
    restricted unpickler and no storage hook. None: it loads. Costs one pickle's bytes.

    A plain pickle fails once its first pickle is read ("Invalid magic number; corrupt
    file?"), unless the restricted unpickler refused it first, in its own words. `first`:
    the first pickle already emulated (a pickle without persistent ids reads alike with
    and without torch's storage hook), so a large plain pickle is not replayed twice.
    """
    tar, head = torch_tar.tarfile_accepts(source, an.options.limits)
    if tar:
        return TorchError("RuntimeError", torch_tar.TAR_ERROR, 0)
    if tar is None:
        return _TAR_UNDECIDED
    stop = sniff.tar_fail_offset(head, source.size)
    if stop + 4 <= source.size and source.read_at(stop, 4) == b"PK\x03\x04":
        return TorchError("RuntimeError", f"{source.name} is a zip archive (did you mean to use "
                          "torch.jit.load()?)", stop)
    limits = an.options.limits
    # a window that grows only while the replay reads to its end: a NumPy or safetensors
    # file stops torch within its first bytes, so its weights are never read
    n, cap = min(source.size, _FIRST_WINDOW), min(source.size, limits.max_pickle_bytes)
    while first is None:
        first = emulate(source.read_at(0, n), allow=an.options.allow, limits=limits, legacy=True,
                        persistent_load=False)
        if first.error is not None and first.read_to >= n and n < source.size:
            if n >= cap:
                return TorchError("LimitExceeded", f"the first pickle runs past {cap} bytes", 0)
            first, n = None, min(n * 4, cap)
    if first.error is not None:
        return first.error
    if not (type(first.root) is int and first.root == MAGIC_NUMBER):
        return TorchError("RuntimeError", "Invalid magic number; corrupt file?", 0)
    stream = Analysis(an.options)   # a real legacy stream after all: replay all of it
    analyze(source, stream)
    wo = stream.weights_only
    return None if wo is None or wo.loadable else TorchError(wo.error_type or "RuntimeError",
                                                             wo.error or "", 0)


def analyze(source: ByteSource, an: Analysis) -> None:
    """Scan a legacy torch file (stream or tar) into `an`; sets `an.weights_only`.

    >>> analyze(FileSource("old.pt"), an); an.format, an.storages[0].data_offset
    ('torch-legacy', 537)
    """
    tar, head = torch_tar.tarfile_accepts(source, an.options.limits)
    if tar:   # torch tries tarfile.open first (real files at offset 0)
        an.format = "torch-tar"
        torch_tar.analyze_tar(source, an)
        return
    if tar is None:
        _judge_tar_reading(source, an)
    an.format = "torch-legacy"
    an.add(Code.TORCH_LEGACY_FORMAT, "legacy pickled-stream checkpoint (no zip container)",
           offset=0)
    stream = _Stream(source, an)
    # After the failed tarfile.open, torch looks for a zip magic where tarfile stopped reading.
    stop = sniff.tar_fail_offset(head, source.size)
    if stop + 4 <= source.size and source.read_at(stop, 4) == b"PK\x03\x04":
        stream.fail(TorchError("RuntimeError", f"{source.name} is a zip archive (did you mean to "
                               "use torch.jit.load()?)", stop))
        an.add(Code.TORCH_BAD_LEGACY_STREAM, f"a zip local header at offset {stop}, where torch "
               "looks after its tar attempt: torch.load refuses the file", offset=stop)
    stream.run()
    if tar is None:   # torch's answer depends on the tar attempt, which cannot be told
        _unmodelled_answer(an)


def _judge_tar_reading(source: ByteSource, an: Analysis) -> None:
    """The file read as the tar it may be to torch: what its pickles would run, into `an`
    (the legacy stream's reading follows)."""
    an.add(Code.TORCH_TAR_UNDECIDED, "torch.load may read this file as a legacy .tar (its "
           "header chain or pax records are past what the scan can tell) or as a stream: the "
           "tar's members are judged too", offset=0)
    reading = Analysis(an.options)
    try:
        torch_tar.analyze_tar(source, reading)
    except CkptError as exc:
        reading.add_error(exc)
    for f in reading.findings:
        if f.code.effect is Effect.UNSAFE:   # what the tar's pickles would run
            an.add(f.code, f"as a tar: {f.message}", record=f.record, offset=f.offset,
                   severity=f.severity)
    for key, entry in reading.globals.items():
        an.globals.setdefault(key, entry)


# torch's answer on a file that tarfile.open may or may not accept (TORCH_TAR_UNDECIDED)
_TAR_UNDECIDED = TorchError("Unmodelled", "not modelled: whether tarfile.open accepts this "
                            "file (TORCH_TAR_UNDECIDED)", 0)


def _unmodelled_answer(an: Analysis) -> None:
    wo = an.weights_only
    if wo is not None:
        wo.loadable, wo.error_type, wo.error = False, _TAR_UNDECIDED.type, _TAR_UNDECIDED.message


@record(slots=True)
class _Block:
    """What the main pickle says about one storage key."""

    key: Any
    itemsize: int
    nbytes: int
    view: bool = False   # a view's key (pid[5]): its block, if listed, lands in the root


class _Stream:
    def __init__(self, source: ByteSource, an: Analysis) -> None:
        self.source = source
        self.an = an
        self.error: TorchError | None = None
        self.at_bad_key: TorchError | None = None   # fails once the blocks before it are read

    def fail(self, error: TorchError) -> None:
        if self.error is None:     # torch stops at its first exception
            self.error = error

    def run(self) -> None:
        an = self.an
        window = PickleWindow(self.source, an.options.limits.max_pickle_bytes, first=_FIRST_WINDOW)
        pos = 0
        end: int | None = 0
        scans: list[PickleScan] = []
        for what in _PICKLES:
            if pos >= self.source.size:
                self.fail(TorchError("EOFError", "", pos))
                an.add(Code.TORCH_BAD_LEGACY_STREAM, f"the stream ends before the {what} pickle",
                       offset=pos)
                break
            end = window.pickle_end(pos, an)
            add_region(an.map_regions, "pickle", f"{what} pickle", pos, (end or self.source.size) - pos)
            scan = scan_pickle(window.buf, an, record=None, base_offset=0, legacy=True, start=pos,
                               check_trailing=False, persistent_load=what == "main object")
            scans.append(scan)
            self.check(what, scan)
            if end is None:
                an.add(Code.TORCH_BAD_LEGACY_STREAM, f"the {what} pickle does not end", offset=pos)
                break
            pos = end
        mapped = pos if end is not None else self.source.size   # the pickles' regions' end
        if len(scans) > 3:   # the manifest even when the key list or the blocks are broken
            # here, not at import: torch.load's answer on a plain pickle needs this module,
            # not the manifest builder (tests/core/scan/test_cold_start.py)
            from ckptguard.core.manifest.build import SiteTable, build_manifest

            main = scans[3]
            sites: dict[str, StorageSite] = {}
            if len(scans) == 5:
                blocks = _blocks(main)
                keys = self.key_list(scans[4], blocks)
                sites = self.locate(keys, blocks, pos) if keys is not None else {}
                if self.at_bad_key is not None:
                    self.fail(self.at_bad_key)
                viewed = [k for k in keys or () if (b := blocks.get(_hashable(k))) and b.view]
                if viewed:   # torch's _set_from_file on the view writes into its root's bytes
                    self.fail(TorchError("Unmodelled", "not modelled: the key list names the "
                                         f"view {_py_repr(viewed[0])}, whose block torch reads "
                                         "into the storage it views"))
            build_manifest(main.root, SiteTable(sites), an, persids=main.vm.persids,
                           built=main.weights_only.built)
            for site_key, site in sites.items():
                nbytes = site.record_nbytes or 0
                add_region(an.map_regions, "tensor_data", f"storage {site_key}", site.data_offset,
                           nbytes)
                if site.data_offset is not None:
                    mapped = max(mapped, site.data_offset + nbytes)
        self.map_rest(mapped)
        self.finish([c for scan in scans for c in scan.vm.calls])

    def map_rest(self, end: int) -> None:
        """Bytes after what was mapped that no trailing-data finding maps either (blocks of a
        key list that could not be read, a count cut short): one region, so the map still
        covers the file."""
        an, size = self.an, self.source.size
        if end < size and not any(f.code is Code.PICKLE_TRAILING_DATA and f.offset == end
                                  for f in an.findings):
            add_region(an.map_regions, "unreferenced_data", "bytes not read as storage blocks",
                       end, size - end)

    def check(self, what: str, scan: PickleScan) -> None:
        """torch's checks on each pickle's value (serialization.py `_legacy_load`)."""
        wo = scan.weights_only
        if wo.error is not None:
            self.fail(wo.error)
            return
        value = wo.root
        if what == "magic number" and not (type(value) is int and value == MAGIC_NUMBER):
            self.fail(TorchError("RuntimeError", "Invalid magic number; corrupt file?", 0))
            self.an.add(Code.TORCH_BAD_LEGACY_STREAM, "invalid magic number", offset=0)
        elif what == "protocol version" and not (
                type(value) in (int, float) and value == PROTOCOL_VERSION):
            self.fail(TorchError("RuntimeError", f"Invalid protocol version: {_py_str(value)}"))
            self.an.add(Code.TORCH_BAD_LEGACY_STREAM, f"protocol version {_py_str(value)[:50]}")

    def key_list(self, scan: PickleScan, blocks: dict[Any, _Block]) -> list[Any] | None:
        """The storage-key list as torch iterates it; None if torch could not iterate it."""
        value = scan.root
        limit = self.an.options.limits.max_tensors
        if type(value) in (list, tuple, str):
            keys = list(value[: limit + 1])
        elif type(value) is dict:
            keys = list(value)[: limit + 1]
        elif type(value) is bytes:
            keys = list(value[: limit + 1])
        else:
            tname = type(value).__name__ if not isinstance(value, (Call, Global, PersId)) else None
            self.fail(TorchError("TypeError", f"'{tname}' object is not iterable") if tname else
                      TorchError("Unmodelled", "not modelled: iterating this storage key list"))
            self.an.add(Code.TORCH_BAD_LEGACY_STREAM, "the storage key list is not a list")
            return None
        if len(keys) > limit:
            raise LimitExceeded(Code.LIMIT_TENSORS, f"more than {limit} storage keys")
        # torch checks each key as it reads its block: a bad key fails only once the blocks
        # before it were read (and their sizes checked), so its error waits for them
        for key in keys:
            if type(key) in (list, dict, set, bytearray):
                self.at_bad_key = TorchError("TypeError", f"unhashable type: '{type(key).__name__}'")
                return keys[: keys.index(key)]
            if _hashable(key) not in blocks:
                self.at_bad_key = TorchError(
                    "AssertionError", f"storage key {_py_repr(key)} not found in deserialized_objects")
                self.an.add(Code.TORCH_BAD_LEGACY_STREAM,
                            f"storage key {_py_repr(key)[:80]} is not used by the pickle")
                return keys[: keys.index(key)]
        return keys

    def locate(self, keys: list[Any], blocks: dict[Any, _Block], start: int) -> dict[str, StorageSite]:
        """Offsets of every block: predicted in batches, each count read and checked."""
        from ckptguard.core.manifest.build import StorageSite

        size = self.source.size
        sites: dict[str, StorageSite] = {}
        overwritten: list[str] = []
        offset, i = start, 0
        # predict every block at once (one round trip); after a wrong count, predict one
        # block, then twice as many each time the predictions hold: a stream of wrong counts
        # cost len(keys) predictions per block (10k blocks: 25 s), now each block is read once
        batch = len(keys)
        while i < len(keys):
            spans: list[tuple[int, int]] = []
            o = offset
            wanted = keys[i:i + batch]
            for key in wanted:
                if o + 8 > size:
                    break
                spans.append((o, 8))
                o += 8 + blocks[_hashable(key)].nbytes
            raw = self.source.read_many(spans) if spans else []
            for got in raw:
                key = keys[i]
                block = blocks[_hashable(key)]
                (count,) = COUNT.unpack(got)
                product = count * block.itemsize
                wrapped = product % (1 << 64)     # torch compares (and prints) size_t values
                data_offset = offset + 8
                add_region(self.an.map_regions, "header", f"storage {key} element count", offset, 8)
                ok = wrapped == block.nbytes
                nbytes = block.nbytes if ok else product
                if not ok:
                    self.fail(TorchError("RuntimeError", f"{_WRONG_SIZE}{wrapped}{brief(block.nbytes)}",
                                         offset))
                    self.an.add(Code.TORCH_RECORD_SIZE_MISMATCH,
                                f"storage {_py_repr(key)[:80]}: its block counts {count} elements of "
                                f"{block.itemsize} bytes ({wrapped} bytes), the pickle "
                                f"{brief(block.nbytes)} bytes", offset=offset)
                elif product != block.nbytes:
                    self.an.add(Code.TORCH_RECORD_SIZE_MISMATCH,
                                f"storage {key}: count {count} x {block.itemsize} bytes wraps around "
                                f"to {block.nbytes} (a forged count torch accepts)", offset=offset)
                if nbytes < 0 or data_offset + nbytes > size:
                    missing = nbytes - (size - data_offset) if nbytes >= 0 else 0
                    if ok:
                        self.fail(TorchError("RuntimeError", _EOF.format(missing), data_offset))
                    self.an.add(Code.TORCH_BAD_LEGACY_STREAM,
                                f"storage {key} needs {nbytes} bytes at {data_offset}, past the end",
                                offset=offset)
                    sites[str(key)] = StorageSite(None, data_offset, max(0, size - data_offset), False)
                    return sites
                if str(key) in sites:
                    overwritten.append(str(key))
                    hidden = sites[str(key)]   # torch reads the later block: these bytes hide
                    add_region(self.an.map_regions, "unreferenced_record",
                               f"storage {key} (an overwritten block)", hidden.data_offset,
                               hidden.record_nbytes or 0)
                sites[str(key)] = StorageSite(None, data_offset, nbytes, ok)
                offset = data_offset + nbytes
                i += 1
                if not ok:
                    batch = 1
                    break     # the next offsets were predicted from the wrong size
            else:
                batch *= 2
                if len(spans) < len(wanted):   # the next count itself runs past the end
                    self.fail(TorchError("RuntimeError", _EOF.format(offset + 8 - size), offset))
                    self.an.add(Code.TORCH_BAD_LEGACY_STREAM,
                                f"the stream ends before the block of storage {keys[i]}", offset=offset)
                    return sites
        self.report_unused(blocks, sites, overwritten, offset)
        return sites

    def report_unused(self, blocks: dict[Any, _Block], sites: dict[str, StorageSite],
                      overwritten: list[str], end: int) -> None:
        an = self.an
        for key in overwritten[:_UNUSED_BLOCK_KEYS]:
            an.add(Code.TORCH_UNREFERENCED_RECORD,
                   f"storage {key} has two data blocks: torch overwrites the first (hidden bytes)")
        missing = [str(b.key) for b in blocks.values() if str(b.key) not in sites]
        for key in missing[:_UNUSED_BLOCK_KEYS]:
            an.add(Code.TORCH_MISSING_RECORD,
                   f"storage {key} has no data block: torch leaves it uninitialized")
        if end < self.source.size:
            an.add(Code.PICKLE_TRAILING_DATA,
                   f"{self.source.size - end} bytes after the last storage block (torch ignores them)",
                   offset=end)
            self.scan_tail(end)

    def scan_tail(self, start: int) -> None:
        """Bytes after the last block: torch ignores them, a later pickle.load would not."""
        limits = self.an.options.limits
        tail = self.source.read_at(start, min(self.source.size - start, limits.max_pickle_bytes))
        pos = 0
        for _ in range(limits.max_trailing_pickles):
            if pos >= len(tail):
                return
            vm = run_vm(tail, start=pos, base_offset=start, limits=limits)
            if not vm.globals and not (vm.complete and vm.opcode_count > 1):
                return
            self.an.add(Code.PICKLE_SECOND_PICKLE, f"a pickle ({vm.opcode_count} opcodes) hides "
                        "after the last storage block", offset=start + pos)
            assess(vm, self.an, allow=self.an.options.allow, record=None)
            if not vm.complete or vm.end <= pos:
                return
            pos = vm.end

    def finish(self, calls: list[Call]) -> None:
        # get_unsafe_globals_in_checkpoint refuses non-zip files (FORMATS.md §3.7): list what
        # the allowlist rejected in any of the five pickles instead.
        listed = sorted(g.full for g in self.an.globals.values() if g.status != "allowed")
        set_weights_only(self.an, self.error, None, unsafe=listed, calls=calls)


def _blocks(scan: PickleScan) -> dict[Any, _Block]:
    """Storage key -> element size and byte count, from the first pid naming it (torch's cache),
    or, when the replay got through the pickle, the size each storage has after it (a view past
    a root's end grows the root)."""
    out: dict[Any, _Block] = {}
    for p in scan.vm.persids:
        pid = p.pid
        if type(pid) is not tuple or len(pid) < 5:
            continue
        tag = pid[0].decode("ascii", "replace") if type(pid[0]) is bytes else pid[0]
        key, numel = _hashable(pid[2]), pid[4]
        if tag != "storage" or key in out or type(numel) is not int or numel < 0:
            continue
        itemsize = storage_itemsize(pid[1], torch_map)
        out[key] = _Block(pid[2], itemsize, numel * itemsize)
        view = pid[5] if len(pid) > 5 else None
        if type(view) is tuple and len(view) == 3 and type(view[2]) is int and view[2] >= 0:
            vkey = _hashable(view[0])
            if vkey not in out:
                out[vkey] = _Block(view[0], itemsize, view[2] * itemsize, view=True)
    for key, (dtype, nbytes) in (scan.weights_only.deserialized or {}).items():
        if (known := out.get(_hashable(key))) is not None:
            out[_hashable(key)] = _Block(key, ITEMSIZE[dtype], nbytes, view=known.view)
    return out




def _hashable(key: Any) -> Any:
    return key if type(key) in (str, int, bytes, float, bool) or key is None else ("<node>", id(key))


def _py_str(value: Any) -> str:
    """`str(value)` for the plain values a pickle can hold (torch formats them into messages)."""
    if type(value) in (str, int, float, bool) or value is None:
        return str(value)
    return _py_repr(value)


def _py_repr(value: Any) -> str:
    if type(value) in (str, int, float, bool, bytes) or value is None:
        return repr(value)
    if type(value) in (list, tuple) and len(value) < 32 and all(
            type(v) in (str, int, float, bool, bytes) or v is None for v in value):
        return repr(value)
    return f"<{type(value).__name__}>"
