"""Rebuild calls in an interpreted pickle -> the tensor and storage manifest.

Strategy: one explicit stack of (path, value), no recursion. Containers push their
children reversed, so they pop in document order, each child's path a link to its
parent's (core.manifest.paths: one small list a child, spelled out only for a tensor); a
container (or generic call) met twice is visited once, which stops memo cycles and
exponential DAGs. A
`torch._utils._rebuild_*` call becomes one `TensorEntry`: its wrappers
(`_rebuild_parameter[_with_state]`, `_rebuild_from_type_v2`,
`_rebuild_device_tensor_from_cpu_tensor`) are peeled in a bounded loop, the base call
gives dtype, view and storage; composite kinds push their component tensors back onto
the same stack. Storages are resolved once per key through the container's
`StorageLocator` (FORMATS.md §2.2-§2.6).

Naming (the report contract, DESIGN.md): `path` is the list of segments from the root,
`name` joins them with ".".
- dict key: kept if `str`/`int`, `bytes` decoded latin-1, anything else `repr()` of the
  object torch builds, rendered from the graph without offsets (`segment`, "names of keys"
  below: `torch.float16`, `device(type='cpu')`, `(1, b'x')`, a bytes key pickled as
  `_codecs.encode(s, 'latin1')` decoded like bytes);
- a tensor inside a dict key (torch loads it as it loads a value): the key's segment, then
  `(key)` (`KEY_SEGMENT`), then its path inside the key (`{t: 1}` -> `<repr of t>.(key)`);
- list/tuple index: the `int` index;
- an object built by a call (OrderedDict, a custom class): the items a dict type is called
  with (`Counter({k: v})`, `OrderedDict([(k, v)])`) by their keys, then SETITEM keys and
  APPEND indices as for dicts/lists, then the keys of its BUILD state dict(s) (attributes),
  then its other positional args by index (a namedtuple's fields);
- a tensor's own attributes (the state of `_rebuild_from_type_v2` /
  `_rebuild_parameter_with_state`): `<tensor>.<attribute>`;
- component tensors of composite kinds use the parameter names of torch's rebuild code:
  sparse COO `<t>.indices`, `<t>.values`; CSR/CSC/BSR/BSC `<t>.compressed_indices`,
  `<t>.plain_indices`, `<t>.values`; per-channel quantized `<t>.scales`,
  `<t>.zero_points`; nested `<t>.buffer`, `<t>.sizes`, `<t>.strides`,
  `<t>.storage_offsets`. The composite entry itself has no storage (`storage` None,
  `data_offset` None, `nbytes` 0), except quantized tensors, which own their storage;
- a bare storage (a `PersId` outside any rebuild call) is an entry of kind `storage`,
  shape `[numel]`, stride `[1]`.

Kinds: tensor, parameter, subclass, quantized, sparse, nested, meta, wrapper (a
`_rebuild_wrapper_subclass`, no data), numpy (`_rebuild_device_tensor_from_numpy`, no
storage), storage. A wrapper kind (parameter, subclass) replaces only `tensor`.

Offsets: `data_offset` = storage data_offset + storage_offset x itemsize (plus the byte
offset of a legacy storage view); `nbytes` = itemsize x (1 + sum((size_i - 1) x stride_i)),
0 when numel is 0 (FORMATS.md §2.6). The first pid of a key defines the storage, as in
torch's `persistent_load` cache; a later pid that disagrees is a finding, unless the
storage is empty: torch caches none of those, and loads each pid's anew. A key the
locator cannot place gets `data_offset` None: the container layer, which knows its
records, reports TORCH_MISSING_RECORD. `_rebuild_device_tensor_from_cpu_tensor` is listed
as its cpu tensor (dtype, view and bytes as stored), with the wrapper's requires_grad and,
where torch's `to` does not return those values, a flag: `to:<dtype>` (the values converted
to that dtype) and `to:meta` (a meta tensor: no values at all).

Speed: a 100k-tensor state_dict (distinct storages) takes ~0.3 s of CPU on a loaded
2-core box, ~0.2 s of it building the 200k report records (bench/manifest_bench.py); a
plain `_rebuild_tensor_v2` takes an inlined path (`fast_v2`), property-tested equal to the
general one (tests/core/manifest).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from operator import itemgetter
from typing import Any, Protocol

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.gcpause import collector_paused
from ckptguard.core.manifest.keynames import segment
from ckptguard.core.manifest.paths import AnyPath, depth, spelled
from ckptguard.core.pickle.vm import hashable_key
from ckptguard.core.records import record
from ckptguard.core.report import StorageEntry, TensorEntry, join_name, name_chars
from ckptguard.core.state import Analysis
from ckptguard.core.torch.dtypes import (
    ITEMSIZE,
    PACKED_PER_BYTE,
)
from ckptguard.core.torch.rules import INT64_MAX, INT64_MIN, may_require_grad, storage_class_dtype
from ckptguard.core.torch.tensor_build import TensorView
from ckptguard.core.values import Call, Global, PersId, brief


@record(frozen=True, slots=True)
class StorageSite:
    """Where a storage's bytes are, as the container knows it."""

    record: str | None        # e.g. "archive/data/0"
    data_offset: int | None   # absolute offset of the storage's first byte
    record_nbytes: int | None  # actual size of the record/block
    verified: bool            # data_offset cross-checked against the container headers


class StorageLocator(Protocol):
    def locate(self, key: str) -> StorageSite | None:
        """The site of storage `key`; None if the container has no bytes for it."""


def _flags(metadata: Any) -> list[str]:
    """torch's `set_tensor_metadata` bits that change a tensor's logical value."""
    if type(metadata) is not dict:
        return []
    return sorted(k for k in ("conj", "neg") if metadata.get(k) is True)


class NoStorages:
    """A locator for a bare pickle: no storage has bytes."""

    def locate(self, key: str) -> StorageSite | None:
        return None


@record(slots=True)
class SiteTable:
    """A locator over a ready table of sites (what the container layer computed)."""

    sites: dict[str, StorageSite]

    def locate(self, key: str) -> StorageSite | None:
        return self.sites.get(key)


_UTILS = "torch._utils"
_WRAPPERS = frozenset({"_rebuild_parameter", "_rebuild_parameter_with_state",
                       "_rebuild_device_tensor_from_cpu_tensor"})
_BASES = frozenset({"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_qtensor",
                    "_rebuild_sparse_tensor", "_rebuild_nested_tensor",
                    "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass",
                    "_rebuild_device_tensor_from_numpy", "_rebuild_xla_tensor"})
FROM_TYPE_V2 = Global("torch._tensor", "_rebuild_from_type_v2")
REBUILDERS: frozenset[Global] = frozenset(
    {Global(_UTILS, n) for n in _WRAPPERS | _BASES} | {FROM_TYPE_V2})
# (module, name) pairs: tuple-of-str hashing is C-fast, a record's __hash__ is not
_REBUILD_PAIRS = frozenset((g.module, g.name) for g in REBUILDERS)
_MAX_WRAPPERS = 16          # torch itself nests at most parameter(from_type(v2))
_SPARSE_LAYOUTS = {"torch.sparse_coo": ("indices", "values"),
                   "torch.sparse_csr": ("compressed_indices", "plain_indices", "values"),
                   "torch.sparse_csc": ("compressed_indices", "plain_indices", "values"),
                   "torch.sparse_bsr": ("compressed_indices", "plain_indices", "values"),
                   "torch.sparse_bsc": ("compressed_indices", "plain_indices", "values")}
_Path = tuple[str | int, ...]

# the segment after a dict key's own when the key itself holds tensors (see Naming)
KEY_SEGMENT = "(key)"
# values the walk has nothing to find in (no tensor, no storage): a key of these types keeps
# only its segment, a set of them needs no order
_INERT_TYPES = frozenset((str, int, bytes, float, bool, type(None), Global))


class _Bad(Exception):
    """Malformed rebuild arguments (becomes a TORCH_BAD_TENSOR_ARGS finding)."""


# A resolved storage: (entry, itemsize, limit, storage class). `limit` is the bytes a view
# may reach: min(declared, record size). A plain tuple: one per storage, 100k of them in a
# big state_dict, and a tuple costs a tenth of a record to build (bench/manifest_bench.py).
_Storage = tuple[StorageEntry, int, int, Any]


def build_manifest(root: Any, locator: StorageLocator, an: Analysis, *,
                   record: str | None = None, persids: Iterable[PersId] = (),
                   built: Mapping[int, tuple[TensorView, bool]] | None = None) -> None:
    """Append the tensors reachable from `root` to `an`, and the storages of every
    persistent id in `persids` (the pickle's, in order) and of those tensors.

    torch's `persistent_load` loads a storage for every persistent id it unpickles, also
    for a value the result then drops (a dict key set twice, a popped or memo-only
    tensor): those storages are the checkpoint's too, listed in the order torch first
    loads them, and the first persistent id of a key defines the storage, as in torch's
    cache (tests/agreement holds every engine to this).

    >>> an = Analysis(); build_manifest(graph, zip_locator, an, record="archive/data.pkl")
    >>> an.tensors[0].name, an.tensors[0].data_offset
    ('weight', 1088)

    `built`: the tensors a BUILD changed (`Tensor.set_`, `Parameter.__setstate__`), by the
    offset of their rebuild call, as the weights-only replay saw torch end up with them
    (`WeightsOnlyResult.built`): those entries follow it, not their rebuild arguments.

    Never raises on malformed input except `LimitExceeded(LIMIT_TENSORS)`.
    """
    # A 100k-tensor graph makes the cyclic GC rescan it over and over (1.5 s instead of
    # 0.2 s, bench/); nothing built here forms a cycle, so pause it for the walk.
    with collector_paused():
        builder = _Builder(locator, an, record, built or {})
        builder.preload(persids)
        builder.run(root)


def _ints(value: Any, what: str) -> list[int]:
    """A size/stride argument: tuple/list of ints or `torch.Size((...))`."""
    if type(value) is Call and value.func == Global("torch", "Size") and type(value.args) is tuple \
            and len(value.args) == 1:
        value = value.args[0]
    if not isinstance(value, (tuple, list)):
        raise _Bad(f"{what} is {type(value).__name__}, not a sequence of ints")
    for v in value:
        if type(v) is not int:
            raise _Bad(f"{what} holds {type(v).__name__}, not int")
        if not INT64_MIN <= v <= INT64_MAX:   # torch refuses it; JSON could not print it
            raise _Bad(f"{what} holds an int outside int64")
    return list(value)


def _int64(value: int, what: str) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise _Bad(f"{what} is an int outside int64")
    return value





def _dtype_of(value: Any) -> str:
    if type(value) is Global and value.module == "torch" and value.name in ITEMSIZE:
        return value.name
    raise _Bad(f"dtype argument {brief(value)} is not a torch dtype")


def _device_type(value: Any) -> str | None:
    """"meta" for "meta", "meta:0", torch.device("meta") (one copy deep); None if not a device."""
    if type(value) is Call and value.func == Global("torch", "device") and type(value.args) is tuple \
            and value.args:
        value = value.args[0]
    return value.split(":", 1)[0] if type(value) is str else None


def _name_of(value: Any) -> str:
    """`torch.sparse_coo` from `_get_layout('torch.sparse_coo')` or a `torch.<x>` global."""
    if type(value) is Call and value.func == Global("torch.serialization", "_get_layout") \
            and type(value.args) is tuple and len(value.args) == 1 and type(value.args[0]) is str:
        return value.args[0]  # type: ignore[no-any-return]
    if type(value) is Global:
        return value.full
    raise _Bad(f"layout argument {brief(value)} is not a layout")


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise _Bad(f"{what} is {type(value).__name__}, not bool")
    return value  # type: ignore[no-any-return]


def _args(call: Call, low: int, high: int) -> tuple[Any, ...]:
    args = call.args
    if type(args) is not tuple or not low <= len(args) <= high:
        n = len(args) if type(args) is tuple else type(args).__name__
        raise _Bad(f"{call.func_name} takes {low}..{high} arguments, got {n}")
    return args  # type: ignore[no-any-return]


class _Builder:
    def __init__(self, locator: StorageLocator, an: Analysis, record: str | None,
                 built: Mapping[int, tuple[TensorView, bool]]) -> None:
        self.locator = locator
        self.built = built
        self.an = an
        self.record = record
        self.storages: dict[str, _Storage] = {}
        self.stypes: dict[tuple[str, str], tuple[str, int]] = {}
        self.max_tensors = an.options.limits.max_tensors
        self.count = 0
        # one tensor met at 250k paths with 1,000 dims is 500 M list items from a 500 KB
        # file: the entries' shape, stride and path items are bounded in all
        self.max_items = an.options.limits.max_manifest_dims
        self.max_name = an.options.limits.max_name_chars
        self.items_left = self.max_items
        self.chars_left = an.options.limits.max_manifest_name_chars
        self.append = an.tensors.append
        self.expanded: set[int] = set()   # tensor calls whose attributes/components were walked

    def charge(self, items: int, path: _Path) -> None:
        """Count one more entry holding `items` shape/stride/path items, named by `path`;
        fail closed past the caps."""
        self.count += 1
        self.items_left -= items
        self.chars_left -= name_chars(path)
        if self.chars_left < 0:
            raise LimitExceeded(Code.LIMIT_TENSORS, "tensor names of more than "
                                f"{self.an.options.limits.max_manifest_name_chars} characters "
                                "in all (each is joined and hashed whole, then shortened)",
                                record=self.record)
        if self.count > self.max_tensors:
            raise LimitExceeded(Code.LIMIT_TENSORS, f"more than {self.max_tensors} tensors",
                                record=self.record)
        if self.items_left < 0:
            raise LimitExceeded(Code.LIMIT_TENSORS, f"tensor entries holding more than "
                                f"{self.max_items} shape, stride and path items in all",
                                record=self.record)

    # --- the walk --------------------------------------------------------------------
    def run(self, root: Any) -> None:
        stack: list[tuple[AnyPath, Any]] = [((), root)]
        seen: set[int] = set()
        pop, push, extend = stack.pop, stack.append, stack.extend
        max_depth = self.an.options.limits.max_depth
        while stack:
            path, value = pop()
            below = depth(path) + 1   # the depth of this value's children
            if below > max_depth + 1:
                raise LimitExceeded(Code.LIMIT_DEPTH, f"values nested more than {max_depth} deep",
                                    record=self.record)
            t = type(value)
            if t is Call:
                fn = value.func
                if type(fn) is Global and (fn.module, fn.name) in _REBUILD_PAIRS \
                        and (fn.name != "_rebuild_from_type_v2" or _wraps_rebuild(value)):
                    full = spelled(path)
                    if fn.name != "_rebuild_tensor_v2" or not self.fast_v2(full, value):
                        self.tensor(full, value, push)
                    continue
                if id(value) in seen:
                    continue
                seen.add(id(value))
                extend(reversed(_call_children(path, below, value)))
            elif t is dict:
                if id(value) in seen:
                    continue
                seen.add(id(value))
                extend(reversed(_keyed(path, below, value.items())))
            elif t is list or t is tuple:
                if id(value) in seen:
                    continue
                seen.add(id(value))
                extend(reversed([([path, i, below], v) for i, v in enumerate(value)]))
            elif t is PersId:
                self.bare_storage(spelled(path), value)
            elif t is set or t is frozenset:
                if id(value) in seen:
                    continue
                seen.add(id(value))
                extend(reversed([([path, i, below], v) for i, v in enumerate(_in_pickle_order(value))]))
            elif isinstance(value, (dict, list, tuple)):
                # subclasses (core.pickle.fast.stubs builds OrderedDict/list stand-ins): same as the
                # base, then the attributes a BUILD set (as for a Call's state)
                if id(value) in seen:
                    continue
                seen.add(id(value))
                children: list[tuple[AnyPath, Any]] = (
                    _keyed(path, below, value.items()) if isinstance(value, dict)
                    else [([path, i, below], v) for i, v in enumerate(value)])
                attributes = getattr(value, "__dict__", None)
                if attributes:
                    children += [([path, segment(k), below], v) for k, v in attributes.items()]
                extend(reversed(children))

    # --- one tensor ------------------------------------------------------------------
    def fast_v2(self, path: _Path, call: Call) -> bool:
        """The common case (a plain `_rebuild_tensor_v2` on a known storage) inline; False: not it."""
        args = call.args
        if type(args) is not tuple or len(args) != 6 or call.state or call.offset in self.built:
            return False   # a 7th argument is metadata (conj/neg bits): the general path
        pid, offset, shape, stride, rg = args[0], args[1], args[2], args[3], args[4]
        if type(pid) is not PersId or type(offset) is not int or offset < 0 or type(rg) is not bool \
                or type(shape) is not tuple or type(stride) is not tuple or len(shape) != len(stride):
            return False
        p = pid.pid
        if type(p) is not tuple or len(p) != 5 or p[0] != "storage" or type(p[2]) is not str:
            return False
        st = self.storages.get(p[2])
        if st is None:
            try:
                st = self.new_storage(p, p[1], p[2], p[3], p[4], pid)
            except _Bad:
                return False
        elif (st[3] is not p[1] and st[3] != p[1]) or st[0].numel != p[4]:
            return False
        numel = span = 1
        if offset > INT64_MAX:
            return False
        for size, st_ in zip(shape, stride):  # noqa: B905 (lengths checked above)
            if type(size) is not int or type(st_) is not int or not (
                    0 <= size <= INT64_MAX and 0 <= st_ <= INT64_MAX):
                return False
            numel *= size
            span += (size - 1) * st_
        entry, itemsize, limit, _ = st
        dtype = entry.dtype
        if (rg and not may_require_grad(dtype)) or dtype in PACKED_PER_BYTE:
            return False
        nbytes = span * itemsize if numel else 0
        start = offset * itemsize
        if numel and start + nbytes > limit:
            return False
        self.charge(len(path) + 2 * len(shape), path)
        base = entry.data_offset
        name = path[0] if len(path) == 1 and type(path[0]) is str \
            else join_name(path, self.max_name)  # type: ignore[arg-type]
        self.append(TensorEntry(
            name, list(path), dtype, list(shape), list(stride), offset, entry.key,  # type: ignore[arg-type]
            "tensor", rg, None if base is None else base + start, nbytes, self.record))
        return True

    def tensor(self, path: _Path, call: Call, push: Any) -> None:
        """List the tensor `call` builds at `path`. A tensor met again (tied weights) is listed
        again, at its new path, but what hangs from it (python attributes, a composite's
        component tensors) is walked the first time only, as a shared container is: else a
        DAG of tensors through their attributes lists 2**depth rows from a few KB."""
        if id(call) in self.expanded:
            push = _walked_already
        else:
            self.expanded.add(id(call))
        try:
            self._tensor(path, call, push)
        except _Bad as exc:
            self.bad(f"{'.'.join(map(str, path)) or '<root>'}: {exc}", call)

    def _tensor(self, path: _Path, call: Call, push: Any) -> None:
        as_built = self.built.get(call.offset) if call.offset >= 0 else None
        if as_built is not None:
            self.built_tensor(path, call, *as_built, push)
            return
        wrapper_kind: str | None = None
        requires_grad: bool | None = None
        to_dtype: str | None = None   # a device copy's target dtype and device
        to_meta = False
        attrs: list[Any] = []
        node = call
        for _ in range(_MAX_WRAPPERS):
            func = node.func
            name = func.name
            if func == FROM_TYPE_V2:
                inner_func, new_type, inner_args, state = _args(node, 4, 4)
                if type(new_type) is not Global:
                    raise _Bad(f"_rebuild_from_type_v2 type is {brief(new_type)}")
                if new_type.full == "torch.nn.parameter.Parameter":
                    wrapper_kind = wrapper_kind or "parameter"
                elif new_type.full != "torch.Tensor":
                    wrapper_kind = wrapper_kind or "subclass"
                attrs.append(state)
                node = Call(inner_func, inner_args, offset=node.offset)
            elif name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
                args = _args(node, 3, 3) if name == "_rebuild_parameter" else _args(node, 4, 4)
                wrapper_kind = wrapper_kind or "parameter"
                if requires_grad is None:
                    requires_grad = _bool(args[1], "requires_grad")
                if len(args) == 4:
                    attrs.append(args[3])
                node = args[0]
            elif name == "_rebuild_device_tensor_from_cpu_tensor":
                args = _args(node, 4, 4)
                if requires_grad is None:
                    requires_grad = _bool(args[3], "requires_grad")
                    target = args[1]
                    if type(target) is Global and target.module == "torch" and target.name in ITEMSIZE:
                        to_dtype = target.name
                    to_meta = _device_type(args[2]) == "meta"
                # the device (xla, maia, ...) is where torch moves it; the bytes are the cpu tensor's
                node = args[0]
            else:
                break
            if type(node) is not Call or type(node.func) is not Global or node.func not in REBUILDERS:
                raise _Bad(f"{name} wraps {type(node).__name__}, not a tensor rebuild call")
        else:
            raise _Bad(f"more than {_MAX_WRAPPERS} nested tensor wrappers")
        self._base(path, node, call, wrapper_kind, requires_grad, push, (to_dtype, to_meta))
        # a tensor's python attributes (state dict, or (dict, slots) pair) are children
        for state in reversed(attrs):
            for part in reversed(state if type(state) is tuple else (state,)):
                if type(part) is dict:
                    push_all(push, path, part)

    def _base(self, path: _Path, node: Call, outer: Call, wrapper_kind: str | None,
              requires_grad: bool | None, push: Any, copy: tuple[str | None, bool] = (None, False)) -> None:
        name = node.func.name
        storage: _Storage | None = None
        view_byte = 0
        components: list[tuple[str, Any]] = []
        offset = 0
        view_limit = 0
        shape: list[int] = []
        stride: list[int] = []
        flags: list[str] = []
        if name in ("_rebuild_tensor_v2", "_rebuild_tensor", "_rebuild_tensor_v3", "_rebuild_qtensor"):
            if name == "_rebuild_tensor_v2":
                args = _args(node, 6, 7)
                rg = args[4]
                kind = "tensor"
                flags = _flags(args[6]) if len(args) == 7 else []
            elif name == "_rebuild_tensor":
                args = _args(node, 4, 4)
                rg = False
                kind = "tensor"
            elif name == "_rebuild_tensor_v3":
                args = _args(node, 7, 8)
                rg = args[4]
                kind = "tensor"
                flags = _flags(args[7]) if len(args) == 8 else []
            else:
                args = _args(node, 7, 7)
                rg = args[5]
                kind = "quantized"
                components = _qparams(args[4])
            pid = args[0]
            if type(pid) is not PersId:
                raise _Bad(f"storage argument is {type(pid).__name__}, not a persistent id")
            storage, view_byte, view_limit = self.storage(pid, node)
            dtype = _dtype_of(args[6]) if name == "_rebuild_tensor_v3" else storage[0].dtype
            offset = args[1]
            if type(offset) is not int:
                raise _Bad(f"storage_offset is {type(offset).__name__}, not int")
            _int64(offset, "storage_offset")
            shape = _ints(args[2], "size")
            stride = _ints(args[3], "stride")
            rg = _bool(rg, "requires_grad")
            if outer.state and outer is node:
                shape, stride, offset, storage, view_byte, view_limit = self.rebuilt_by_build(
                    outer, name, shape, stride, offset, storage, view_byte, view_limit)
        elif name == "_rebuild_meta_tensor_no_storage":
            args = _args(node, 4, 4)
            dtype, kind = _dtype_of(args[0]), "meta"
            shape, stride = _ints(args[1], "size"), _ints(args[2], "stride")
            rg = _bool(args[3], "requires_grad")
        elif name == "_rebuild_wrapper_subclass":
            args = _args(node, 8, 8)
            dtype, kind = _dtype_of(args[1]), "wrapper"
            shape, stride = _ints(args[2], "size"), _ints(args[3], "stride")
            offset = args[4] if type(args[4]) is int else 0
            rg = _bool(args[7], "requires_grad")
        elif name == "_rebuild_sparse_tensor":
            layout, data = _args(node, 2, 2)
            layout_name = _name_of(layout)
            parts = _SPARSE_LAYOUTS.get(layout_name)
            if parts is None:
                raise _Bad(f"unknown sparse layout {layout_name}")
            if type(data) is not tuple or len(data) not in ((3, 4) if len(parts) == 2 else (4,)):
                raise _Bad(f"{layout_name} data is not a tuple of the right length")
            components = list(zip(parts, data, strict=False))
            shape = _ints(data[len(parts)], "size")
            dtype, kind, rg = _peek_dtype(data[len(parts) - 1]), "sparse", False
        elif name == "_rebuild_nested_tensor":
            args = _args(node, 4, 4)
            components = list(zip(("buffer", "sizes", "strides", "storage_offsets"), args, strict=True))
            dtype, kind, rg = _peek_dtype(args[0]), "nested", False
        else:   # _rebuild_device_tensor_from_numpy / _rebuild_xla_tensor: an ndarray, no storage
            args = _args(node, 4, 4)
            dtype, kind = _dtype_of(args[1]), "numpy"
            rg = _bool(args[3], "requires_grad")
        if requires_grad is not None:
            rg = requires_grad
        to_dtype, to_meta = copy
        if to_dtype is not None and to_dtype != dtype:   # Tensor.to converts the stored values
            flags = [*flags, f"to:{to_dtype}"]
        if to_meta:   # a meta tensor: no values at all
            flags = [*flags, "to:meta"]
        if wrapper_kind is not None and kind == "tensor":
            kind = wrapper_kind
        self.emit(path, node, kind, dtype, shape, stride, offset, storage, view_byte, view_limit, rg,
                  flags)
        for seg, value in reversed(components):
            push(([path, seg, len(path) + 1], value))

    def built_tensor(self, path: _Path, call: Call, view: TensorView, rg: bool, push: Any) -> None:
        """A tensor a BUILD changed, as the weights-only replay saw torch end up with it: its
        view, not its rebuild arguments (which torch accepted, or the replay would have
        stopped); the kind and python attributes still come from its rebuild call."""
        self.bad(f"{'.'.join(map(str, path)) or '<root>'}: a BUILD changed this tensor "
                 "(Tensor.set_ / Parameter.__setstate__); the manifest follows torch", call)
        name, args = call.func.name, call.args if type(call.args) is tuple else ()
        kind, attrs, base = "tensor", [], call
        if name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            kind, attrs = "parameter", list(args[3:4])
            base = args[0] if args and type(args[0]) is Call and type(args[0].func) is Global else call
        elif call.func == FROM_TYPE_V2 and len(args) == 4 and type(args[1]) is Global:
            kind = {"torch.Tensor": "tensor", "torch.nn.parameter.Parameter": "parameter"}.get(
                args[1].full, "subclass")
            attrs = [args[3]]
        # the metadata argument (conj/neg bits) of the tensor rebuild under it, if any
        at = {"_rebuild_tensor_v2": 6, "_rebuild_tensor_v3": 7}.get(base.func.name)
        metadata = base.args[at] if at and type(base.args) is tuple and len(base.args) == at + 1 else None
        storage, view_byte, view_limit = None, 0, 0
        if view.persid is not None:   # else set_() gave it a fresh storage of its own
            try:
                storage, view_byte, view_limit = self.storage(view.persid, call)
            except _Bad as exc:
                self.bad(f"{'.'.join(map(str, path)) or '<root>'}: {exc}", call)
                return
        self.emit(path, call, kind, view.dtype, list(view.shape), list(view.stride), view.offset, storage,
                  view_byte, view_limit, rg, _flags(metadata))   # set_ keeps the conj/neg bits
        for state in reversed(attrs):
            for part in reversed(state if type(state) is tuple else (state,)):
                if type(part) is dict:
                    push_all(push, path, part)

    def emit(self, path: _Path, node: Call, kind: str, dtype: str, shape: list[int],
             stride: list[int], offset: int, storage: _Storage | None, view_byte: int,
             view_limit: int, rg: bool, flags: list[str] | None = None) -> None:
        self.charge(len(path) + len(shape) + len(stride), path)
        name = join_name(path, self.max_name)  # type: ignore[arg-type]
        itemsize = ITEMSIZE[dtype]
        if len(shape) != len(stride) and kind != "sparse" and kind != "nested":
            self.bad(f"{name}: unequal size length ({len(shape)}) and stride length ({len(stride)})",
                     node)
        nbytes = 0
        data_offset: int | None = None
        if storage is not None:
            numel = 1
            span = 1
            for size, st in zip(shape, stride, strict=False):
                numel *= size
                span += (size - 1) * st
                if size < 0 or st < 0:
                    self.bad(f"{name}: negative size or stride {shape} {stride}", node)
            if offset < 0:
                self.bad(f"{name}: invalid storage offset {offset}", node)
            nbytes = span * itemsize if numel else 0
            start = view_byte + offset * itemsize
            pack = PACKED_PER_BYTE.get(dtype)
            if pack is not None:     # bytes = ceil(elements / pack)
                nbytes = -(-(offset + span) // pack) - offset // pack if numel else 0
                start = view_byte + offset // pack
            if numel and start + nbytes > view_limit:
                self.an.add(Code.TORCH_TENSOR_OUT_OF_BOUNDS,
                            f"{name}: bytes [{start}, {start + nbytes}) of storage {storage[0].key} "
                            f"pass its {view_limit} bytes", record=self.record,
                            offset=node.offset if node.offset >= 0 else None)
            if storage[0].data_offset is not None:
                data_offset = storage[0].data_offset + start
        converted = next((f[3:] for f in flags or () if f.startswith("to:") and f != "to:meta"), dtype)
        if rg and not may_require_grad(converted):
            self.bad(f"{name}: only tensors of floating point dtype can require gradients "
                     f"(dtype {dtype})", node)
        self.an.tensors.append(TensorEntry(
            name, list(path), dtype, shape, stride, offset,
            storage[0].key if storage is not None else None, kind, rg, data_offset, nbytes,
            self.record, tuple(flags or ())))

    # --- storages ----------------------------------------------------------------------
    def preload(self, persids: Iterable[PersId]) -> None:
        """The storage of each key's first persistent id, in order, as torch loads them; a
        first id that is malformed is left to the walk, which reports it where it is used."""
        tried: set[str] = set()
        for persid in persids:
            pid = persid.pid
            key = pid[2] if type(pid) is tuple and len(pid) in (5, 6) else None
            if type(key) is not str or key in tried:
                continue
            tried.add(key)
            try:
                stype, key, location, numel = _storage_pid(pid)
                self.new_storage(pid, stype, key, location, numel, persid)
            except _Bad:
                continue

    def storage(self, persid: PersId, node: Call) -> tuple[_Storage, int, int]:
        """(storage, view start byte, view end byte) of a storage pid (FORMATS.md §2.2, §4.1)."""
        pid = persid.pid
        stype, key, location, numel = _storage_pid(pid)
        st = self.storages.get(key)
        if st is None:
            st = self.new_storage(pid, stype, key, location, numel, persid)
        elif st[3] != stype or st[0].numel != numel:   # the key declared again, differently
            if st[0].nbytes == 0:
                # torch caches a storage only if it has a data pointer (load_tensor's
                # `_data_ptr() != 0`): an empty one is loaded again, as this pid declares it
                st = self.new_storage(pid, stype, key, location, numel, persid, listed=False)
            else:
                self.bad(f"storage {key} declared again as {brief(stype)} x {brief(numel)}; torch "
                         f"keeps the first ({st[0].dtype} x {st[0].numel})", node)
        if len(pid) == 6 and pid[5] is not None:
            view = pid[5]
            if type(view) is not tuple or len(view) != 3 or type(view[1]) is not int \
                    or type(view[2]) is not int or view[1] < 0 or view[2] < 0:
                raise _Bad(f"storage view metadata {brief(view)} is not (key, offset, size)"[:200])
            start, end = view[1] * st[1], (view[1] + view[2]) * st[1]
            if end > st[2]:
                raise _Bad(f"storage view [{brief(start)}, {brief(end)}) passes storage {key}'s "
                           f"{st[2]} bytes")
            return st, start, end
        return st, 0, st[2]

    def new_storage(self, pid: tuple[Any, ...], stype: Any, key: str, location: Any, numel: Any,
                    persid: PersId, *, listed: bool = True) -> _Storage:
        """The storage a pid declares; `listed`: the key's storage (the report's row), not a
        later declaration torch loads again (an empty storage's, see `storage`)."""
        kind = self.stypes.get((stype.module, stype.name)) if type(stype) is Global else None
        if kind is None:
            kind = self.storage_kind(stype)
        dtype, itemsize = kind
        if type(numel) is not int or numel < 0:
            raise _Bad(f"storage numel {brief(numel)} is not a non-negative int")
        if type(location) is not str:
            location = location.decode("latin-1") if type(location) is bytes else repr(location)
        nbytes = numel * itemsize
        site = self.locator.locate(key)
        if site is None:
            entry = StorageEntry(key, dtype, numel, nbytes, location, None, None, False)
            st = (entry, itemsize, nbytes, stype)
        else:
            record_nbytes = site.record_nbytes
            limit = nbytes
            if record_nbytes is not None and record_nbytes != nbytes:
                self.an.add(Code.TORCH_RECORD_SIZE_MISMATCH,
                            f"record size ({record_nbytes} bytes) does not match expected size "
                            f"({brief(nbytes)} bytes = {brief(numel)} elements * {itemsize} "
                            f"bytes/element) for storage {key}", record=site.record or self.record,
                            offset=site.data_offset)
                limit = min(limit, record_nbytes)
            entry = StorageEntry(key, dtype, numel, nbytes, location, site.record, site.data_offset,
                                 site.verified)
            st = (entry, itemsize, limit, stype)
        if listed:
            self.storages[key] = st
            self.an.storages.append(entry)
        return st

    def storage_kind(self, stype: Any) -> tuple[str, int]:
        """(dtype, itemsize) of a storage class global (FORMATS.md §2.3); cached per name."""
        if type(stype) is not Global:
            raise _Bad(f"storage type is {brief(stype)}, not a storage class"[:200])
        dtype = storage_class_dtype(stype.module, stype.name)
        if dtype is None:
            raise _Bad(f"{stype.full} is not a storage class")
        kind = (dtype, ITEMSIZE[dtype])
        self.stypes[(stype.module, stype.name)] = kind
        return kind

    def bare_storage(self, path: _Path, persid: PersId) -> None:
        node = Call(Global(_UTILS, "<storage>"), (), offset=persid.offset)
        try:
            st, start, end = self.storage(persid, node)
        except _Bad as exc:
            self.bad(f"{'.'.join(map(str, path)) or '<root>'}: {exc}", node)
            return
        numel = (end - start) // st[1]
        self.emit(path, node, "storage", st[0].dtype, [numel], [1], start // st[1], st, 0, end,
                  False)

    def rebuilt_by_build(self, call: Call, name: str, shape: list[int], stride: list[int],
                         offset: int, storage: _Storage, view_byte: int, view_limit: int,
                         ) -> tuple[list[int], list[int], int, _Storage, int, int]:
        """BUILD on a rebuilt Tensor runs `Tensor.set_(*state)` (torch: legacy unpickling)."""
        self.bad(f"{name} result is modified by BUILD (Tensor.set_); the manifest follows it", call)
        for state in call.state:
            if type(state) is tuple and len(state) == 4 and type(state[0]) is PersId \
                    and name != "_rebuild_tensor_v3":
                storage, view_byte, view_limit = self.storage(state[0], call)
                if type(state[1]) is not int:
                    raise _Bad("set_ storage_offset is not int")
                _int64(state[1], "set_ storage_offset")
                offset, shape, stride = state[1], _ints(state[2], "size"), _ints(state[3], "stride")
        return shape, stride, offset, storage, view_byte, view_limit

    def bad(self, message: str, node: Call) -> None:
        self.an.add(Code.TORCH_BAD_TENSOR_ARGS, message, record=self.record,
                    offset=node.offset if node.offset >= 0 else None)


def _storage_pid(pid: Any) -> tuple[Any, str, Any, Any]:
    """(storage class, key, location, numel) of a storage persistent id (FORMATS.md §2.2)."""
    if type(pid) is not tuple or len(pid) not in (5, 6):
        raise _Bad(f"storage pid is not a 5- or 6-tuple: {brief(pid)}"[:200])
    tag, stype, key, location, numel = pid[:5]
    if isinstance(tag, bytes):
        tag = tag.decode("ascii", "replace")
    if tag != "storage":
        raise _Bad(f"persistent id tag is {brief(tag)}, not 'storage'")
    if type(key) is not str:
        raise _Bad(f"storage key is {type(key).__name__}, not str")
    return stype, key, location, numel


_FIRST_MADE_NODES = 1_000   # nodes of one hashable value searched by _first_made


def _first_made(value: Any) -> int | None:
    """The smallest pickle offset of a call or storage inside a hashable value (tuples and
    frozensets searched, up to _FIRST_MADE_NODES nodes); -1 if it holds none, None if the
    search stopped first (then it may hold one)."""
    first, stack, seen, left = -1, [value], set(), _FIRST_MADE_NODES
    while stack:
        left -= 1
        if left < 0:
            return None
        x = stack.pop()
        t = type(x)
        if t is Call or t is PersId:
            first = x.offset if first < 0 else min(first, x.offset)
        elif (t is tuple or t is frozenset) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x)
    return first


def _pickle_position(member: Any) -> int:
    """Where a set member was made in the pickle: the first call or storage inside it; -1 for
    plain values (they come first, in any order: they name nothing)."""
    first = _first_made(member)
    return -1 if first is None else first


def _in_pickle_order(members: set[Any] | frozenset[Any]) -> list[Any]:
    """A set's members in an order that is the same in every run: a set of calls or storages
    iterates by their ids (memory addresses), so its index names would change from scan to
    scan; the tensors in it are named by where the pickle made them. A set of plain values
    names nothing: as it is (one C pass, no search a member)."""
    if _INERT_TYPES.issuperset(map(type, members)):
        return list(members)
    return sorted(members, key=_pickle_position)


def _keyed(path: AnyPath, below: int, items: Collection[tuple[Any, Any]]) -> list[tuple[AnyPath, Any]]:
    """A dict's children (at depth `below`): each value under its key's segment, and a key
    that may hold tensors (a rebuild call, a tuple...) under that segment + KEY_SEGMENT,
    before its value (torch unpickles the key first)."""
    if _INERT_TYPES.issuperset(map(type, map(itemgetter(0), items))):   # the usual dict, in C
        return [([path, segment(k), below], v) for k, v in items]
    out: list[tuple[AnyPath, Any]] = []
    for k, v in items:
        at = [path, segment(k), below]
        if type(k) not in _INERT_TYPES and _first_made(k) != -1:
            # `(key)` names, it is no level of nesting: the key's items sit as deep as the
            # value's would (Limits.max_depth counts the pickle's containers)
            out.append(([at, KEY_SEGMENT, below], k))
        out.append((at, v))
    return out


def _walked_already(item: tuple[AnyPath, Any]) -> None:
    """The push of a tensor whose attributes and components were walked at another path."""


def push_all(push: Any, path: _Path, mapping: dict[Any, Any]) -> None:
    below = len(path) + 1
    for k, v in reversed(list(mapping.items())):
        push(([path, segment(k), below], v))


def _call_children(path: AnyPath, below: int, call: Call) -> list[tuple[AnyPath, Any]]:
    """Children of an object built by a call: items, appends, BUILD attributes, args.

    A dict type called with its items (`Counter({k: v})`, `OrderedDict([(k, v), ...])`,
    `defaultdict(factory, {k: v})`, by REDUCE/INST/OBJ: NEWOBJ's `dict.__new__` ignores its
    arguments) holds them as its own items, first, as the built object does: they are named by
    their keys, not by the argument's index. Its other arguments keep their index.
    """
    out: list[tuple[AnyPath, Any]] = []
    args = call.args
    items_at = _DICT_TYPES.get(call.func) if type(call.func) is Global \
        and call.opcode != "NEWOBJ" and call.opcode != "NEWOBJ_EX" else None
    if items_at is not None and (type(args) not in (tuple, list) or len(args) != items_at + 1
                                 or type(args[items_at]) not in (dict, list, tuple)):
        items_at = None
    items: list[tuple[Any, Any]] = []
    if items_at is not None:
        mapping = args[items_at]
        if type(mapping) is dict:
            items += mapping.items()
        else:    # [(k, v), ...]: the pairs are items
            items += [(pair[0], pair[1]) for pair in mapping
                      if type(pair) in (list, tuple) and len(pair) == 2]
    items += call.setitems
    if type(call.func) is Global and call.func in _DICT_TYPES:   # a dict: a key set again
        items = _as_dict(items)                                  # replaces the value
    out += _keyed(path, below, items)
    out += [([path, i, below], v) for i, v in enumerate(call.appends)]
    # BUILD updates the object's attributes (`__dict__.update`, slots by setattr): an
    # attribute set again holds the last value
    attributes = [kv for state in call.state
                  for part in (state if type(state) is tuple and len(state) == 2 else (state,))
                  if type(part) is dict for kv in part.items()]
    out += [([path, segment(k), below], v) for k, v in _as_dict(attributes)]
    if type(call.func) is Global and call.func in _DICT_TYPES and call.opcode in ("NEWOBJ", "NEWOBJ_EX"):
        return out   # `dict.__new__(cls, *args)` ignores them: the object holds none of them
    if type(args) is tuple or type(args) is list:
        out += [([path, i, below], v) for i, v in enumerate(args) if i != items_at]
    return out


def _as_dict(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The items of a dict the pairs were set in, in turn: a key set again (an equal key:
    1, 1.0 and True are one) keeps its first place and key and takes the last value."""
    merged: dict[Any, list[Any]] = {}
    for k, v in pairs:
        slot = merged.get(hk := hashable_key(k))
        if slot is None:
            merged[hk] = [k, v]
        else:
            slot[1] = v
    return [(k, v) for k, v in merged.values()]


# dict types -> the index of the argument that holds their items
_DICT_TYPES = {Global("collections", "OrderedDict"): 0, Global("builtins", "dict"): 0,
               Global("collections", "Counter"): 0, Global("collections", "defaultdict"): 1}


def _wraps_rebuild(call: Call) -> bool:
    """A `_rebuild_from_type_v2` around a tensor rebuild; else (an NJT's `_rebuild_njt`, ...)
    the call is walked as a plain object."""
    args = call.args
    return (type(args) is tuple and len(args) == 4 and type(args[0]) is Global
            and (args[0].module, args[0].name) in _REBUILD_PAIRS)


def _qparams(qparams: Any) -> list[tuple[str, Any]]:
    """Per-channel scales/zero_points tensors are components (FORMATS.md §2.4)."""
    if type(qparams) is not tuple or not qparams or type(qparams[0]) is not Global:
        raise _Bad(f"quantizer params {brief(qparams)} are not (qscheme, ...)"[:200])
    scheme = qparams[0].name
    if scheme == "per_tensor_affine" and len(qparams) == 3:
        return []
    if scheme in ("per_channel_affine", "per_channel_affine_float_qparams") and len(qparams) == 4:
        return [("scales", qparams[1]), ("zero_points", qparams[2])]
    raise _Bad(f"unsupported quantizer params for qscheme {qparams[0].full}")


def _peek_dtype(value: Any) -> str:
    """dtype of a component tensor call (sparse values, nested buffer) without walking it."""
    for _ in range(_MAX_WRAPPERS):
        if type(value) is not Call or type(value.func) is not Global or value.func not in REBUILDERS \
                or type(value.args) is not tuple:
            break
        name, args = value.func.name, value.args
        if value.func == FROM_TYPE_V2 and len(args) == 4:
            value = Call(args[0], args[2])
        elif name in _WRAPPERS and args:
            value = args[0]
        elif name in ("_rebuild_tensor_v2", "_rebuild_tensor", "_rebuild_qtensor") and args \
                and type(args[0]) is PersId and type(args[0].pid) is tuple and len(args[0].pid) >= 2:
            stype = args[0].pid[1]
            if type(stype) is Global:
                found = storage_class_dtype(stype.module, stype.name)
                if found is not None:
                    return found
            break
        elif name == "_rebuild_tensor_v3" and len(args) >= 7:
            return _dtype_of(args[6])
        elif name == "_rebuild_meta_tensor_no_storage" and args:
            return _dtype_of(args[0])
        elif name == "_rebuild_sparse_tensor" and len(args) == 2 and type(args[1]) is tuple \
                and len(args[1]) >= 3:
            value = args[1][1] if len(args[1]) in (3, 4) and _is_coo(args[0]) else args[1][2]
        elif name == "_rebuild_nested_tensor" and args:
            value = args[0]
        else:
            break
    raise _Bad("cannot tell the dtype of a component tensor")


def _is_coo(layout: Any) -> bool:
    try:
        return _name_of(layout) == "torch.sparse_coo"
    except _Bad:
        return False
