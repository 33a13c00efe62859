"""The fast lane: a clean torch.save zip judged in columns, or Decline to the general path.

Strategy: the general path (core.formats.torch_zip) handles every archive and every
pickle, finding by finding, at ~25 us per tensor. Most checkpoints are a plain
`torch.save(state_dict)`: for those this module proves, with whole-column checks, that
the general path would add no finding and would call the file loadable, and produces
the same report (tensors, storages, globals, weights_only) directly:

1. core.zip.columns: the archive is exactly torch's writer layout (no zip anomaly);
2. torch.load's container checks (version, byteorder, alignment; not TorchScript);
3. core.pickle.fast.column_stubs: the pickle uses only accepted opcodes and allowlisted globals, loaded by
   the C unpickler with inert stubs;
4. every persistent id and every rebuild call, reachable or not, passes torch's checks
   (storage record present with numel x itemsize bytes, views inside their storage,
   requires_grad only on floating dtypes, empty hooks), checked per column;
5. the storage offsets follow torch's `calculate_storage_offsets` chain and equal the
   local headers', and every record is referenced;
6. one walk of the value graph names the tensors as core.manifest.build does.

Anything outside that raises `Decline` before the Analysis is touched, and the caller
runs the general path. tests/core/lane checks both paths give the same report on
every fixture and on mutated archives. Nothing here imports the general path's modules
(core.formats, core.judge, the emulator, the VM, the manifest builder): a clean file's
whole-process scan loads only what it runs (tests/core/scan/test_cold_start.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property, partial
from itertools import repeat
from operator import add, and_, floordiv, gt, is_, mul, not_

from ckptguard.core.errors import Code, Decline
from ckptguard.core.filemap import ZipSpans
from ckptguard.core.io.source import ByteSource
from ckptguard.core.limits import Limits
from ckptguard.core.manifest.keynames import segment as tensor_segment
from ckptguard.core.manifest.paths import AnyPath, depth, spelled
from ckptguard.core.pickle.fast.column_stubs import (
    Loaded,
    RebuildCall,
    RebuildParameter,
    RebuildV2,
    RebuildV3,
    StubGlobal,
    load,
)
from ckptguard.core.pickle.fast.containers import CheckedDict, CheckedList
from ckptguard.core.pickle.fast.tokenize import Tokens, global_uses
from ckptguard.core.pickle.result import VmResult
from ckptguard.core.records import record
from ckptguard.core.report import StorageEntry, TensorEntry, join_name, name_chars
from ckptguard.core.state import Analysis
from ckptguard.core.threats.assess import assess
from ckptguard.core.torch import container  # torch.load's record rules, as the general path's
from ckptguard.core.torch.allowlist import allowed_checker
from ckptguard.core.torch.answer import set_weights_only
from ckptguard.core.torch.dtypes import ITEMSIZE, PACKED_PER_BYTE
from ckptguard.core.torch.rules import (
    all_of_type,
    lane_storage_dtype,
    may_require_grad,
    restorable,
    view_extents,
)
from ckptguard.core.zip.columns import (
    PlainArchive,
    pick,
    read_plain_archive,
    writer_data_offsets,
)
from ckptguard.core.zip.offsets import DESCRIPTOR_SIZE32

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

_MAX_NUMEL = 1 << 32         # records here are < 4 GiB (no zip64): larger numels cannot match
_SCALARS = frozenset((str, int, float, bool, type(None), bytes, complex, StubGlobal))


def try_torch_zip(source: ByteSource, an: Analysis) -> bool:
    """Fill `an` for a clean torch zip and return True; False (an untouched) otherwise."""
    if an.options.verify_crc:
        return False
    try:
        result = _judge(source, an)
    except Decline:
        return False
    except Exception:   # any surprise is a decline: the general path is the authority
        import logging  # here: logging is ~10 ms of a clean scan's start

        logging.getLogger("ckptguard.fastlane").debug("fast lane declined with an exception",
                                                      exc_info=True)
        return False
    result.commit(an)
    return True


@record(slots=True)
class _Result:
    """Everything the report needs; written into the Analysis only once all checks passed."""

    pkl_name: str
    tokens: Tokens
    base: int                  # file offset of data.pkl
    tensors: list[TensorEntry]
    storages: list[StorageEntry]
    entries: int               # zip entries
    locals_read: int           # local headers read (all of them on a local source)
    spans: ZipSpans            # the map of the file (core.filemap)

    def commit(self, an: Analysis) -> None:
        toks = self.tokens
        vm = VmResult(root=None, complete=True, start=0, end=toks.end, protocol=toks.protocol,
                      globals=global_uses(toks, self.base))
        an.format = "torch-zip"
        an.io["zip_local_headers_read"] = self.locals_read
        an.io["zip_entries"] = self.entries
        an.io["pickle_bytes"] = self.tokens.end   # as core.judge.scan_pickle counts it
        an.zip_spans = self.spans
        assess(vm, an, allow=an.options.allow, record=self.pkl_name)
        if toks.protocol is not None and toks.protocol != 2:
            an.add(Code.PICKLE_PROTOCOL, f"pickle protocol {toks.protocol}", record=self.pkl_name,
                   offset=self.base)
        an.tensors.extend(self.tensors)
        an.storages.extend(self.storages)
        set_weights_only(an, None, None)


def _judge(source: ByteSource, an: Analysis) -> _Result:
    limits = an.options.limits
    arc = read_plain_archive(source, limits)
    prefix = arc.prefix

    def row_of(record: str) -> int | None:
        return arc.folded.get(f"{prefix}/{record}".lower())

    if f"{prefix}/constants.pkl" in arc.index:
        raise Decline("TorchScript")
    pkl_row = row_of("data.pkl")
    if pkl_row is None:
        raise Decline("no data.pkl")
    meta = _read_meta(source, arc, row_of)
    alignment = _check_container(meta)
    arc.place_unread(alignment)   # a remote source read only the headers torch needs
    arc.check_tiles()
    pkl_size = arc.size[pkl_row]
    if pkl_size > limits.max_pickle_bytes:
        raise Decline("pickle past the cap")
    base = arc.data_offset[pkl_row]
    data = source.read_at(base, pkl_size)

    loaded = load(data, allowed_checker(an.options.allow), limits=limits)
    if loaded.tokens.end != len(data):
        raise Decline("bytes after STOP")
    storages = _Storages(loaded.pids, loaded.refs, arc)
    # every record is torch's own (by its exact name, as the general path judges it) or
    # the storage of a persistent id
    known = {row for r in container.KNOWN_RECORDS if (row := arc.index.get(f"{prefix}/{r}")) is not None}
    if len(known) + len(storages.rows) != len(arc.names) \
            or len(known.union(storages.rows)) != len(arc.names):
        raise Decline("a record the pickle does not reference")
    storages.verify_chain(arc, prefix, alignment)
    views = _Views(loaded, storages)
    tensors = _walk(loaded, views, storages, arc.names[pkl_row], limits)
    # every storage torch loads, also one only a dropped value used (core.manifest.build)
    entries = storages.entries(arc)
    return _Result(arc.names[pkl_row], loaded.tokens, base, tensors, entries, len(arc.names),
                   arc.locals_read, _spans(arc, source.size))



def _spans(arc: PlainArchive, file_size: int) -> ZipSpans:
    """The archive's spans in file order: read_plain_archive proved the records tile the file
    up to the directory, and the end records follow it up to the last byte."""
    rows = range(len(arc.names)) if arc.order is None else arc.order
    header = pick(arc.header_offset, rows)
    return ZipSpans(names=pick(arc.names, rows), header=header,
                    data=pick(arc.data_offset, rows), size=pick(arc.size, rows),
                    end=[*header[1:], arc.cd_offset], cd_offset=arc.cd_offset,
                    cd_end=arc.cd_offset + arc.cd_size, tail_start=arc.cd_offset + arc.cd_size,
                    archive_end=file_size, file_size=file_size, prefix=arc.prefix)


def _read_meta(source: ByteSource, arc: PlainArchive, row_of: Any) -> dict[str, bytes]:
    rows = {r: row for r in (*container.META_RECORDS, container.SERIALIZATION_ID)
            if (row := row_of(r)) is not None}
    if any(arc.size[row] > container.SMALL_RECORD_MAX for row in rows.values()):
        raise Decline("large metadata record")
    spans = [(arc.data_offset[row], arc.size[row]) for row in rows.values()]
    return dict(zip(rows, source.read_many(spans) if spans else [], strict=True))


def _check_container(meta: dict[str, bytes]) -> int:
    """torch.load's record checks pass and the general path would add no finding; returns
    the storage alignment."""
    if container.version_error(meta) is not None or container.layout_error(meta) is not None \
            or container.serialization_id_error(meta) is not None:
        raise Decline("a version, byteorder, alignment or serialization id record torch refuses")
    if meta.get("byteorder", b"little") != b"little":
        raise Decline("big-endian storages")
    if not meta.get(".format_version", b"") >= b"1":
        raise Decline("no calculated offsets before format version 1")
    return container.storage_alignment(meta)


class _Storages:
    """Every persistent id, proven to be what torch's `persistent_load` accepts.

    Columns are per distinct key, in first-encounter order (FORMATS.md §2.2)."""

    def __init__(self, pids: list[Any], refs: list[tuple[Any]], arc: PlainArchive) -> None:
        if not all_of_type(pids, tuple) or set(map(len, pids)) - {5}:
            raise Decline("persistent id shape")   # also: a storage fed to BINPERSID again
        self.refs = refs   # what persistent_load returned: the only valid storage arguments
        tags, stypes, keys, locations, numels = zip(*pids, strict=True) if pids else ((),) * 5
        if set(tags) - {"storage"} or not all_of_type(stypes, StubGlobal) \
                or not all_of_type(keys, str) or not all_of_type(locations, str) \
                or not all_of_type(numels, int) or (numels and min(numels) < 0):
            raise Decline("persistent id fields")
        if numels and max(numels) >= _MAX_NUMEL:
            raise Decline("a storage larger than any record of this lane")
        if not all(map(restorable, set(locations))):
            raise Decline("storage location")
        order = list(dict.fromkeys(keys))
        self.distinct = len(order) == len(pids)   # pid i declares storage i
        if not self.distinct:   # a key met again must be the same storage (torch caches by key)
            if len(set(pids)) != len(order):
                raise Decline("a storage key declared twice, differently")
            first = dict(zip(reversed(keys), reversed(pids), strict=True))
            firsts = list(map(first.__getitem__, order))
            stypes = tuple(p[1] for p in firsts)
            locations = tuple(p[3] for p in firsts)
            numels = tuple(p[4] for p in firsts)
        types = set(stypes)
        dtype_of_type = {st: lane_storage_dtype(st) for st in types}
        if len(types) == 1:
            self.dtype: list[str] = [dtype_of_type[next(iter(types))]] * len(order)
        else:
            self.dtype = list(map(dtype_of_type.__getitem__, stypes))
        self.order, self.locations, self.numel = order, list(locations), list(numels)
        self.itemsize = _itemsizes(self.dtype)
        self.nbytes = list(map(mul, self.numel, self.itemsize))
        self.rows = _record_rows(order, arc)
        if self.nbytes != pick(arc.size, self.rows):
            raise Decline("a record whose size is not numel x itemsize")
        self.data_offset = pick(arc.data_offset, self.rows)

    @cached_property
    def ref_ids(self) -> set[int]:
        return set(map(id, self.refs))

    @cached_property
    def position(self) -> dict[str, int]:
        """storage key -> its row in these columns."""
        return dict(zip(self.order, range(len(self.order)), strict=True))

    def rows_of(self, storage_args: Any) -> tuple[Sequence[int], list[str]]:
        """(storage row, storage key) of each call's storage argument; Decline unless each
        is what persistent_load returned (not a pid tuple itself, memoized and fetched)."""
        if self.distinct and len(storage_args) == len(self.refs) \
                and all(map(is_, storage_args, self.refs)):
            # torch.save's layout: call i got pid i, the first (only) one of storage i
            return range(len(storage_args)), self.order
        if not set(map(id, storage_args)) <= self.ref_ids:
            raise Decline("a tensor storage that is not a persistent id")
        keys = [ref[0][2] for ref in storage_args]
        return list(map(self.position.__getitem__, keys)), keys

    def verify_chain(self, arc: PlainArchive, prefix: str, alignment: int) -> None:
        """The `calculate_storage_offsets` chain lands on every record's real offsets."""
        if not self.order:
            return
        if self.order[0] != "0":
            raise Decline("first storage is not '0'")
        nbytes, header, data = self.nbytes, pick(arc.header_offset, self.rows), self.data_offset
        # a descriptor follows every non-empty record (no zip64 records in this lane)
        if header[1:] != [offset + n + (DESCRIPTOR_SIZE32 if n else 0)
                          for offset, n in zip(data[:-1], nbytes[:-1], strict=True)]:
            raise Decline("records are not in pickle order")
        # the name of record i: `<prefix>/data/<key>`
        name_len = map(add, map(len, self.order[1:]), repeat(len(prefix) + 6))
        if writer_data_offsets(header[1:], list(name_len), alignment) != data[1:]:
            raise Decline("a data offset differs from the calculated one")

    def entries(self, arc: PlainArchive) -> list[StorageEntry]:
        """StorageEntry rows of every storage, in first-encounter order."""
        return list(map(_NEW_STORAGE, zip(
            self.order, self.dtype, self.numel, self.nbytes, self.locations,
            map(arc.names.__getitem__, self.rows), self.data_offset, repeat(True))))


def _record_rows(keys: list[str], arc: PlainArchive) -> Sequence[int]:
    """The archive row of each storage key's record `<prefix>/data/<key>`, by exact name."""
    prefix = f"{arc.prefix}/data/"
    first = arc.index.get(prefix + keys[0]) if keys else None
    if first is not None:
        # torch.save writes the records in pickle order: one comparison of joined names
        # (names hold no newline, so equal strings mean equal names one by one)
        run = arc.names[first:first + len(keys)]
        if "\n".join(run) == prefix + f"\n{prefix}".join(keys):
            return range(first, first + len(keys))
    rows = list(map(arc.index.get, [prefix + k for k in keys]))
    if None in rows:   # missing, or only under another case (miniz would find it)
        raise Decline("a storage without a record of its exact name")
    return rows  # type: ignore[return-value]   # (no None in it: checked above)


# NamedTuple rows built in C from zipped columns (no Python call per row)
_NEW_STORAGE = partial(tuple.__new__, StorageEntry)
_NEW_TENSOR = partial(tuple.__new__, TensorEntry)


def _itemsizes(dtypes: list[str]) -> list[int]:
    kinds = set(dtypes)
    if len(kinds) == 1:
        return [ITEMSIZE[next(iter(kinds))]] * len(dtypes)
    return list(map(ITEMSIZE.__getitem__, dtypes))


class _Views:
    """Every `_rebuild_tensor_v2/_v3` and `_rebuild_parameter` call, checked per column.

    Columns hold the v2 calls, then the v3 calls (`position` maps a call to its row)."""

    def __init__(self, loaded: Loaded, storages: _Storages) -> None:
        if any(loaded.calls[base] for base in loaded.calls
               if base not in (RebuildV2, RebuildV3, RebuildParameter)):
            raise Decline("a rebuild function this lane does not model")
        v2, v3 = loaded.calls[RebuildV2], loaded.calls[RebuildV3]
        calls = v2 + v3 if v3 else v2
        self.calls = calls
        args = [c.args for c in v2]
        arity = set(map(len, args))
        if arity - {6, 7} or (7 in arity and not _no_metadata(a[6] for a in args if len(a) == 7)):
            raise Decline("_rebuild_tensor_v2 arity or metadata (conj/neg bits)")
        if 7 in arity:
            args = [a[:6] for a in args]
        pids, offsets, sizes, strides, grads, hooks = zip(*args, strict=True) if args else ((),) * 6
        dtypes: list[str] | None = None
        if v3:
            more = self._v3_columns(v3, storages)
            dtypes = ([storages.dtype[0]] * len(v2) if len(set(storages.dtype)) == 1 else None)
            pids, offsets, sizes, strides, grads, hooks = (
                a + b for a, b in zip((pids, offsets, sizes, strides, grads, hooks), more[:6],
                                      strict=True))
        index, self.keys = storages.rows_of(pids)
        if dtypes is None:
            dtypes = (storages.dtype[:1] * len(v2) if len(set(storages.dtype)) == 1
                      else pick(storages.dtype, index[:len(v2)]))
        self.dtypes = dtypes + more[6] if v3 else dtypes
        if not all_of_type(offsets, int) or not all_of_type(sizes, tuple) \
                or not all_of_type(strides, tuple) or not all_of_type(grads, bool) \
                or not _empty_hooks(hooks, loaded):
            raise Decline("tensor argument types")
        if list(map(len, sizes)) != list(map(len, strides)):
            raise Decline("size and stride lengths differ")
        self.offsets, self.grads, self.sizes, self.strides = offsets, grads, sizes, strides
        itemsize = _itemsizes(self.dtypes) if v3 else pick(storages.itemsize, index)
        extent, empty = view_extents(sizes, strides)
        if offsets and max(offsets) >= _MAX_NUMEL:   # past any record here: cannot fit
            raise Decline("a storage offset past any record of this lane")
        # in elements of the tensor's dtype: (offset + extent) * itemsize <= storage bytes
        limit = map(floordiv, pick(storages.nbytes, index), itemsize)
        has_numel = list(map(not_, empty))
        if (offsets and min(offsets) < 0) or any(map(and_, map(gt, map(add, offsets, extent),
                                                                limit), has_numel)):
            raise Decline("a view past the end of its storage")
        if any(grads) and any(g and not may_require_grad(d)
                              for g, d in zip(grads, self.dtypes, strict=True)):
            raise Decline("requires_grad on a non-floating tensor")
        self.nbytes = list(map(mul, map(mul, extent, itemsize), has_numel))
        self.data_offset = list(map(add, pick(storages.data_offset, index),
                                    map(mul, offsets, itemsize)))
        self._params(loaded.calls[RebuildParameter], loaded)

    @cached_property
    def position(self) -> dict[int, int]:
        """id(call) -> its row in these columns."""
        return dict(zip(map(id, self.calls), range(len(self.calls)), strict=True))

    @staticmethod
    def _v3_columns(v3: list[RebuildCall], storages: _Storages) -> tuple[Any, ...]:
        """The six v2 columns of the v3 calls, their storage keys and their dtypes."""
        args = [c.args for c in v3]
        arity = set(map(len, args))
        if arity - {7, 8} or (8 in arity and not _no_metadata(a[7] for a in args if len(a) == 8)):
            raise Decline("_rebuild_tensor_v3 arity or metadata (conj/neg bits)")
        if 8 in arity:
            args = [a[:7] for a in args]
        pids, offsets, sizes, strides, grads, hooks, dtypes = zip(*args, strict=True)
        if not all_of_type(dtypes, StubGlobal):
            raise Decline("_rebuild_tensor_v3 dtype")
        if any(g is not False for g in grads):
            # never loads with requires_grad: torch.empty(requires_grad=True), then set_() on
            # a leaf that requires grad raises (the exact interpreter words it)
            raise Decline("_rebuild_tensor_v3 with requires_grad")
        for module, name in set(dtypes):
            if module != "torch" or name not in ITEMSIZE or name in PACKED_PER_BYTE:
                raise Decline(f"_rebuild_tensor_v3 dtype {module}.{name}")
        names = [d[1] for d in dtypes]
        return pids, offsets, sizes, strides, grads, hooks, names

    def _params(self, params: list[RebuildCall], loaded: Loaded) -> None:
        args = [p.args for p in params]
        if set(map(len, args)) - {3}:
            raise Decline("_rebuild_parameter arity")
        inner, grads, hooks = zip(*args, strict=True) if args else ((),) * 3
        if not all_of_type(grads, bool) or not _empty_hooks(hooks, loaded) \
                or not all(isinstance(t, RebuildV2) for t in inner):
            raise Decline("_rebuild_parameter arguments")
        if any(grads) and any(g and not may_require_grad(self.dtypes[self.position[id(t)]])
                              for t, g in zip(inner, grads, strict=True)):
            raise Decline("requires_grad on a non-floating parameter")


def _no_metadata(values: Any) -> bool:
    """Every metadata argument is None or `{}` (torch's conj/neg bits: the exact path)."""
    return all(m is None or (type(m) is CheckedDict and not m) for m in values)


def _empty_hooks(hooks: Any, loaded: Loaded) -> bool:
    """Every backward_hooks argument is an `OrderedDict()` nothing was added to."""
    attributes = loaded.attributes
    return all_of_type(hooks, loaded.dict_type) and not any(hooks) and not (
        attributes and any(id(h) in attributes for h in hooks))


_NAMED_KEYS = frozenset((str, int, bytes, float, bool, type(None)))


def _segment(key: Any) -> str | int:
    """core.manifest.build' name of a key; Decline where that name is a stub's repr()."""
    if type(key) not in _NAMED_KEYS:
        raise Decline("a key whose name depends on object identity")
    return tensor_segment(key)


def _walk(loaded: Loaded, views: _Views, storages: _Storages, record: str,
          limits: Limits) -> list[TensorEntry]:
    """Tensors in document order, named as core.manifest.build names them."""
    max_tensors = limits.max_tensors
    flat = _flat_state_dict(loaded)
    paths: list[Any]
    if flat is not None and flat[2] is None:
        names, values, _ = flat
        paths = [[k] for k in names]
    else:
        start: list[tuple[AnyPath, Any]] | None = None
        if flat is not None and flat[2] is not None:   # a module's state_dict: flat items,
            # then what BUILD set on it (its `_metadata`), walked
            start = [((_segment(k),), v) for k, v in reversed(flat[2].items())]
        paths, values = _found(loaded, storages.ref_ids, limits, start)
        max_name = limits.max_name_chars
        names = [p[0] if len(p) == 1 and type(p[0]) is str else join_name(p, max_name)
                 for p in paths]
        paths = list(map(list, paths))
        if flat is not None:
            names, values, paths = flat[0] + names, flat[1] + values, [[k] for k in flat[0]] + paths
    if len(values) > max_tensors:
        raise Decline("tensor cap")
    kinds = loaded.kinds
    params = loaded.calls[RebuildParameter]
    grads: Any
    if params:
        is_param = [kinds[type(v)] is RebuildParameter for v in values]
        inner = [v.args[0] if p else v for v, p in zip(values, is_param, strict=True)]
        kind: Any = ["parameter" if p else "tensor" for p in is_param]
        grads = [v.args[1] if p else views.grads[views.position[id(v)]]
                 for v, p in zip(values, is_param, strict=True)]
        reached_params = {id(v) for v, p in zip(values, is_param, strict=True) if p}
        if len(reached_params) != len(params):
            raise Decline("a parameter the graph does not reach")
    else:
        inner, kind, grads = values, repeat("tensor"), None
    calls = views.calls
    columns: tuple[Any, ...] = (views.dtypes, views.sizes, views.strides, views.offsets, views.keys)
    if len(inner) == len(calls) and all(map(is_, inner, calls)):
        # torch.save's layout: the i-th tensor met is the i-th call, columns as they are
        rows = None
        data_offset, nbytes = views.data_offset, views.nbytes
    else:
        rows = list(map(views.position.__getitem__, map(id, inner)))
        # torch runs every rebuild call, reachable or not: each must be in the manifest
        if len(set(rows)) != len(calls):
            raise Decline("a rebuild call the graph does not reach")
        columns = tuple(list(map(column.__getitem__, rows)) for column in columns)
        data_offset, nbytes = pick(views.data_offset, rows), pick(views.nbytes, rows)
    if grads is None:
        grads = views.grads if rows is None else list(map(views.grads.__getitem__, rows))
    dtypes, sizes, strides, offsets, keys = columns
    # core.manifest.build's cap: the path, shape and stride items of every entry
    if sum(map(len, paths)) + 2 * sum(map(len, sizes)) > limits.max_manifest_dims:
        raise Decline("manifest items past the cap")
    return list(map(_NEW_TENSOR, zip(
        names, paths, dtypes, map(list, sizes), map(list, strides), offsets, keys, kind, grads,
        data_offset, nbytes, repeat(record), repeat(()))))


def _flat_state_dict(loaded: Loaded) -> tuple[list[str], list[Any], dict[Any, Any] | None] | None:
    """The common root, a dict of str -> tensor, without walking it: (keys, tensors, the
    attributes a BUILD gave it, e.g. a module state_dict's `_metadata`); None for any other."""
    root = loaded.root
    if type(root) is not CheckedDict and type(root) is not loaded.dict_type:
        return None
    keys, values = list(root), list(root.values())
    if not all_of_type(keys, str) or not set(map(type, values)) <= loaded.kinds.keys():
        return None
    built = loaded.attributes.get(id(root))
    return keys, values, None if built is None else built[1]


def _found(loaded: Loaded, ref_ids: set[int], limits: Limits,
           start: list[tuple[AnyPath, Any]] | None = None
           ) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """(path, tensor) pairs of the general walk, in document order (core.manifest.build' rules);
    from `start` (the root already walked) if given. A child's path is a link to its parent's
    (core.manifest.paths), spelled out only for a tensor, under the manifest's item cap."""
    kinds, dict_type, attributes = loaded.kinds, loaded.dict_type, loaded.attributes
    max_tensors, max_depth = limits.max_tensors, limits.max_depth
    items_left = limits.max_manifest_dims
    chars_left = limits.max_manifest_name_chars
    paths: list[tuple[Any, ...]] = []
    values: list[Any] = []
    stack: list[tuple[AnyPath, Any]] = [((), loaded.root)] if start is None else start
    seen: set[int] = set() if start is None else {id(loaded.root)}
    pop = stack.pop
    while stack:
        path, value = pop()
        below = depth(path) + 1
        if below > max_depth + 1:   # the general path reports it
            raise Decline("values nested past the depth limit")
        t = type(value)
        if t in _SCALARS:
            continue
        if t in kinds:
            full = spelled(path)
            items_left -= len(full)
            chars_left -= name_chars(full)
            if items_left < 0 or chars_left < 0:   # the general path reports the cap
                raise Decline("manifest items or name characters past the cap")
            paths.append(full)
            values.append(value)
            if len(values) > max_tensors:
                raise Decline("tensor cap")
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if t is CheckedDict or t is dict_type:
            items: list[tuple[AnyPath, Any]] = [([path, _segment(k), below], v)
                                                 for k, v in value.items()]
            built = attributes.get(id(value)) if t is dict_type else None
            if built is not None:   # BUILD set attributes: children after the items
                items += [([path, _segment(k), below], v) for k, v in built[1].items()]
            stack.extend(reversed(items))
        elif t is tuple or t is CheckedList:
            if id(value) in ref_ids:
                raise Decline("a bare storage")
            stack.extend(reversed([([path, i, below], v) for i, v in enumerate(value)]))
        elif t is set or t is frozenset:
            if not set(map(type, value)) <= _SCALARS:
                raise Decline("a set holding objects")
        else:
            raise Decline(f"a {t.__name__} in the graph")
    return paths, values
