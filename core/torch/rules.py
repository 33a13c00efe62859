"""torch 2.13's acceptance rules for what a weights-only load builds: one place, three forms.

Every path that judges a checkpoint imports its rules from here: the exact interpreter
(core.torch.weights_only + core.torch.callables, which word each refusal as torch does),
the general fast path (core.judge over core.pickle.fast, which declines instead of
wording), the column-wise lane (core.lane, the same rules over whole columns) and the
manifest (core.manifest). A rule changed here changes every path at once.

- modules torch blocks before it even looks at the allowlist;
- persistent ids: the storage tuple, the storage class -> dtype, the restorable locations;
- views: `Tensor.set_(storage, offset, size, stride)` bounds, int64 parsing, and
  requires_grad only on floating/complex dtypes — exact (`check_view`, `set_args`,
  `set_requires_grad`), scalar fast (`check_rebuild`) and column (`view_extents`) forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import accumulate, chain, compress, repeat
from math import prod
from operator import contains, mul, not_, sub

from ckptguard.core.errors import Decline
from ckptguard.core.pickle.fast.containers import CheckedDict, OrderedDictStub
from ckptguard.core.records import record
from ckptguard.core.torch.dtypes import FLOATING, ITEMSIZE, PACKED_PER_BYTE, UNTYPED_STORAGES, storage_dtype
from ckptguard.core.values import Call, Global, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, TypeAlias

# torch's weights-only unpickler refuses these modules before the allowlist (and so
# whatever add_safe_globals says)
BLOCKED_MODULES: frozenset[str] = frozenset(("sys", "os", "posix", "nt"))

# torch 2.13 torch/_weights_only_unpickler.py `Unpickler.load` (FORMATS.md §3.4): every
# other opcode fails with "Unsupported operand {byte}".
TORCH_ACCEPTED: frozenset[str] = frozenset({
    "PROTO", "STOP", "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM",
    "SETITEMS", "MARK", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE",
    "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "BININT", "BININT1", "BININT2",
    "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID", "BINGET", "LONG_BINGET",
    "BINPUT", "LONG_BINPUT", "LONG1",
})

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1   # what torch's argument parser unpacks
INT64_SAFE = 1 << 62   # ints below this are exact through every product we form
# the lane's columns decline sizes/strides from this on, and more dims (bounds it has
# always had: a column's sums once lived in int64)
MAX_COLUMN_EXTENT = 1 << 28
MAX_COLUMN_DIMS = 64


# --- persistent ids and storage classes -------------------------------------------------

_RESTORABLE = re.compile(r"cpu|mps|cuda(:[0-9]{1,3})?")


def restorable(location: str) -> bool:
    """A storage location torch restores (cpu, mps, cuda[:N]): assumed present on the
    loading host (module docstring)."""
    return _RESTORABLE.fullmatch(location) is not None


def storage_class_dtype(module: str, name: str) -> str | None:
    """The element dtype of a storage class global (`torch.FloatStorage` -> float32), with
    `UntypedStorage` as uint8 (its numel counts bytes, FORMATS.md §8.1); None otherwise."""
    if (module, name) in UNTYPED_STORAGES:
        return "uint8"
    return storage_dtype(module, name)


def storage_itemsize(storage_type: Any, rename: Callable[[str, str], tuple[str, str]]) -> int:
    """Bytes per element of a storage class value as a legacy/zip reader counts a record
    (after the reader's own global `rename`); 1 for anything else (UntypedStorage: bytes)."""
    if not isinstance(storage_type, Global):
        return 1
    dtype = storage_dtype(*rename(storage_type.module, storage_type.name))
    return ITEMSIZE[dtype] if dtype else 1


def check_storage_pid(pid: tuple[Any, ...]) -> tuple[Global, str, str, int, str]:
    """torch `_load.persistent_load`, zip flavour (FORMATS.md §2.2), narrowly: (storage type,
    key, location, numel, dtype), or Decline for anything the exact path must word."""
    if len(pid) != 5 or pid[0] not in ("storage", b"storage"):
        raise Decline("persistent id is not a 5-field storage tuple")
    st, key, location, numel = pid[1:]
    if (type(st) is not Global or type(key) is not str or type(location) is not str
            or type(numel) is not int or numel < 0 or not restorable(location)):
        raise Decline("unusual storage persistent id")
    # only torch.storage.UntypedStorage: `torch.UntypedStorage` is not allowlisted by that name
    dtype = "uint8" if st.full == "torch.storage.UntypedStorage" else storage_dtype(st.module, st.name)
    if dtype is None:
        raise Decline(f"storage type {st.full}")
    return st, key, location, numel, dtype


def lane_storage_dtype(st: Any) -> str:
    """A storage class stub's dtype for the lane, which models no packed (sub-byte) dtypes."""
    dtype = storage_class_dtype(st[0], st[1])
    if dtype is None or dtype in PACKED_PER_BYTE:
        raise Decline(f"storage type {st.full}")
    return dtype


# --- views: Tensor.set_ on a storage (FORMATS.md §2.4, §2.6) ----------------------------

# the setter `tensor.requires_grad = True` (_rebuild_tensor_v2) words it this way
NO_GRAD_SETTER = "only Tensors of floating point and complex dtype can require gradients"


class Fail(Exception):
    """torch would raise `type(message)` here (or: we did not model what it would do)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(type_, message)
        self.type = type_
        self.message = message


def unmodelled(what: str) -> Fail:
    return Fail("Unmodelled", f"not modelled: {what}")


# bytes torch may allocate for a tensor beyond what the file stores for it, and still be
# modelled: past it, whether torch.load succeeds is the loader's memory's to say
_MAX_ALLOCATION_MODELLED = 1 << 30


def check_allocation(numel: int, itemsize: int, stored: int) -> None:
    """Some rebuilds make a tensor of their full size before they view the storage (a
    quantized tensor's `_empty_affine_quantized`, a device copy's `to`): a 1 KB file made torch
    allocate 35 TB and fail, or 1.27 GB and succeed. Unmodelled past what the file stores
    plus _MAX_ALLOCATION_MODELLED: a reviewer sees the size."""
    if numel * itemsize > stored + _MAX_ALLOCATION_MODELLED:
        raise unmodelled(f"torch allocates {numel * itemsize:,} bytes for a tensor whose storage "
                         f"holds {stored:,} (whether torch.load succeeds is the loader's memory's "
                         "to say)")


class Capacity:
    """The byte size of a resizable storage, which `Tensor.set_` grows to what a view needs.

    A legacy load allocates every root storage fresh (resizable); a view past its end resizes
    it, and the later block check compares the file's count with the grown size (measured,
    torch 2.13). Slices (legacy views) and zip storages are not resizable.
    """

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


@record(frozen=True, slots=True)
class StorageInfo:
    """What torch's persistent_load returned: a TypedStorage of `dtype` over `nbytes` bytes."""

    key: str
    dtype: str
    nbytes: int                       # at load
    capacity: Capacity | None = None  # resizable: its size now

    @property
    def nbytes_now(self) -> int:
        return self.capacity.nbytes if self.capacity is not None else self.nbytes


# how an interpreter resolves a value to the storage behind it (None: not a storage)
StorageOf: TypeAlias = "Callable[[Any], StorageInfo | None]"


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_seq(v: Any) -> tuple[int, ...] | None:
    """A size/stride argument that set_() accepts (tuple/list/torch.Size of ints), else None."""
    if isinstance(v, Call) and v.attrs.get("type") == "torch.Size":
        seq = v.attrs.get("value")
        return seq if isinstance(seq, tuple) else None
    if isinstance(v, (tuple, list)) and all(is_int(x) and abs(x) < INT64_SAFE for x in v):
        return tuple(v)
    return None


# --- Tensor.set_'s argument parser (torch/csrc/utils/python_arg_parser.cpp), measured -------

# the names it gives arguments: Python's type names; sequences list their elements' types
_PARSER_TYPE_NAMES = {t: t.__name__ for t in (bool, int, float, str, bytes, tuple, list, dict, set,
                                              frozenset, type(None))}
_DESCRIBED_ELEMENTS_MAX = 10_000   # a longer sequence: we do not build a megabyte message

_SET_SIGNATURE = "int storage_offset, tuple of ints size, tuple of ints stride = None)"
_SET_OVERLOADS = (
    " * ()\n * (torch.Storage source)\n"
    f" * (torch.Storage source, {_SET_SIGNATURE}\n"
    "      didn't match because some of the arguments have invalid types: {args}\n"
    " * (Tensor source)\n"
    f" * (Tensor source, {_SET_SIGNATURE}\n"
    "      didn't match because some of the arguments have invalid types: {args}\n")


def matches_int_array(v: Any) -> bool:
    """The parser's type match for an int array: a torch.Size, or a tuple/list that is empty or
    whose *first* element is an int (a bool is not one there); later elements are checked
    only when unpacked (measured: (2, "a") matches, ("a", 2) and (True,) do not)."""
    if isinstance(v, Call):
        return v.attrs.get("type") == "torch.Size"
    return isinstance(v, (tuple, list)) and (not v or is_int(v[0]))


def _described(v: Any) -> str | None:
    """How the parser names an argument in "didn't match": `tuple of (int, str)`, `float`."""
    name = _PARSER_TYPE_NAMES.get(type(v))
    if name is None or not isinstance(v, (tuple, list)):
        return name
    if len(v) > _DESCRIBED_ELEMENTS_MAX:
        return None
    inner = [_PARSER_TYPE_NAMES.get(type(x)) for x in v]
    if None in inner:
        return None
    body = ", ".join(inner)  # type: ignore[arg-type]
    if isinstance(v, list):
        return f"list of [{body}]"
    return f"tuple of ({body},)" if len(inner) == 1 else f"tuple of ({body})"


def _no_set_overload(offset: Any, size: Any, stride: Any) -> Fail:
    got = [_PARSER_TYPE_NAMES.get(type(v)) for v in (offset, size, stride)]
    described = [_described(v) for v in (offset, size, stride)]
    if None in got or None in described:
        return unmodelled("set_() with arguments of these types")
    # every argument but an int offset is marked invalid (measured, whatever its type)
    marked = [d if i == 0 and is_int(offset) else f"!{d}!" for i, d in enumerate(described)]
    args = "(!torch.storage.UntypedStorage!, " + ", ".join(marked) + ")"   # type: ignore[arg-type]
    return Fail("TypeError", "set_() received an invalid combination of arguments - got "
                f"(torch.storage.UntypedStorage, {', '.join(got)}), but expected one of:\n"  # type: ignore[arg-type]
                + _SET_OVERLOADS.format(args=args))


def _unpacked(what: str, values: Any) -> tuple[int, ...]:
    """An int array's elements as the parser unpacks them (bools count as ints here)."""
    if isinstance(values, Call):   # a torch.Size: ints by construction
        seq = int_seq(values)
        if seq is None:
            raise unmodelled("a torch.Size of these values")
        return seq
    for pos, v in enumerate(values, 1):
        if not isinstance(v, int):
            name = _PARSER_TYPE_NAMES.get(type(v))
            if name is None:
                raise unmodelled(f"set_() {what} element of this type")
            raise Fail("TypeError", f"set_(): argument '{what}' failed to unpack the object at pos "
                       f'{pos} with error "type must be tuple of ints,but got {name}"')
        if not -(1 << 63) <= v < 1 << 63:
            raise Fail("TypeError", f"set_(): argument '{what}' failed to unpack the object at pos "
                       f'{pos} with error "Overflow when unpacking long long')
    return tuple(int(v) for v in values)


def set_args(offset: Any, size: Any, stride: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`Tensor.set_(storage, offset, size, stride)`'s argument parsing: (size, stride).

    The parser matches the overload by type first (an int offset, an int array size, an int
    array or None stride; None means contiguous), then unpacks stride before size, element by
    element, then the offset (measured with torch 2.13 over every triple of 13 kinds of
    argument: tests/differential/test_set_args_vs_torch.py).
    """
    if not (is_int(offset) and matches_int_array(size)
            and (stride is None or matches_int_array(stride))):
        raise _no_set_overload(offset, size, stride)
    strides = _unpacked("stride", stride) if stride is not None else ()
    shape = _unpacked("size", size)
    if not -(1 << 63) <= offset < 1 << 63:
        raise Fail("ValueError", "Overflow when unpacking long long")
    if abs(offset) >= INT64_SAFE or any(abs(x) >= INT64_SAFE for x in shape + strides):
        raise unmodelled("set_() with a size, stride or offset near int64 overflow")
    return shape, strides


def numel_overflows(shape: Sequence[int]) -> bool:
    """torch's TensorImpl::compute_numel on sizes >= 0: a running uint64 product whose
    overflow flag sticks at the first step past 2**64 - 1, or a product past int64. So
    (2**32, 2**32, 0) overflows and (2**31, 2**32, 0) is an empty tensor."""
    numel = 1
    for n in shape:
        numel *= n
        if numel >> 64:
            return True
    return numel > INT64_MAX


def numel_unmodelled(shape: Sequence[int], numel: int | None = None) -> bool:
    """The view's element count (`numel`: its product, if known) is one the exact path does
    not model: past int64 (torch refuses it: `numel_overflows`) or from INT64_SAFE on. A
    non-empty view's running product only grows, so its product decides; an empty one's
    count stops at its first zero. Every engine declines or is Unmodelled by this one rule."""
    if numel is None:
        numel = prod(shape)
    return numel >= INT64_SAFE or (not numel and numel_overflows(shape))


def check_view(st: StorageInfo, itemsize: int, offset: Any, size: Any, stride: Any, *,
                quantized: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`Tensor.set_(storage, offset, size, stride)` (FORMATS.md §2.6); grows a resizable storage.
    Returns the view's (shape, stride), as the tensor then has them."""
    shape, strides = set_args(offset, size, stride)
    if not strides and shape:
        # an empty stride means "not given": set_ uses contiguous strides (measured)
        acc, rev = 1, []
        for dim in reversed(shape):
            rev.append(acc)
            acc *= max(dim, 1)
        strides = tuple(reversed(rev))
    if len(shape) != len(strides):
        raise Fail("RuntimeError", f"unequal size length ({len(shape)}) and stride length ({len(strides)})")
    if offset < 0:
        raise Fail("RuntimeError", f"Tensor: invalid storage offset {offset}")
    if any(s < 0 for s in shape):
        raise unmodelled("negative size")
    numel = prod(shape)
    if numel_unmodelled(shape, numel):   # past int64, torch: "numel: integer multiplication overflow"
        raise unmodelled("element count near int64 overflow")
    if numel == 0:
        return shape, strides
    # computeStorageNbytes adds stride * (size - 1) as uint64: a negative stride overflows
    # only on a dimension of size 2 or more (size 1 takes any stride: measured, torch 2.13)
    if any(d < 0 and s > 1 for s, d in zip(shape, strides, strict=True)):
        raise Fail("RuntimeError", f"Storage size calculation overflowed with sizes={list(shape)} and "
                   f"strides={list(strides)}")
    extent = offset + 1 + sum((s - 1) * d for s, d in zip(shape, strides, strict=True))
    if extent * itemsize >= INT64_SAFE:
        raise unmodelled("storage extent near int64 overflow")
    # sub-byte quantized dtypes pack several elements per byte: the bytes needed round up
    # (measured with torch 2.13: quint4x2 needs ceil(elements / 2), quint2x4 ceil(elements / 4))
    per_byte = PACKED_PER_BYTE.get(st.dtype, 1) if quantized else 1
    needed = -(-extent // per_byte) if per_byte > 1 else extent * itemsize
    have = st.nbytes_now
    if needed > have:
        if quantized:  # QTensorImpl's set_storage checks bounds itself, resizable or not
            raise Fail("RuntimeError", f"setStorage: sizes {int_list_text(shape)}, strides "
                       f"{int_list_text(strides)}, storage offset {offset}, and itemsize {itemsize} "
                       f"requiring a storage size of {needed} are out of bounds for storage of size "
                       f"{have}")
        if st.capacity is None:
            raise Fail("RuntimeError", "Trying to resize storage that is not resizable")
        st.capacity.nbytes = needed   # set_ resizes the storage to exactly what the view needs
    return shape, strides


def int_list_text(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


def set_requires_grad(rg: Any, dtype: str) -> bool:
    """`tensor.requires_grad = rg` (in _rebuild_tensor_v2)."""
    if not isinstance(rg, bool):
        raise Fail("RuntimeError", "requires_grad must be a bool")
    if rg and not may_require_grad(dtype):
        raise Fail("RuntimeError", NO_GRAD_SETTER)
    return rg


def may_require_grad(dtype: str | None) -> bool:
    """torch: only tensors of floating point and complex dtype can require gradients."""
    return dtype in FLOATING


# --- the fast forms: Decline instead of torch's words -----------------------------------

def check_rebuild(full: str, args: tuple[Any, ...],
                  storage_info: Callable[[PersId], tuple[str, int] | None]) -> str | None:
    """Decline unless torch's rebuild function would accept `args` without complaint.

    `storage_info(persid) -> (dtype, nbytes)` describes a storage. The rules are torch's
    (`_rebuild_tensor` -> `Tensor.set_`, FORMATS.md §2.4, §2.6), kept deliberately narrow:
    anything outside them is left to the exact interpreter.
    """
    if full == "torch._utils._rebuild_parameter":
        if (len(args) != 3 or type(args[0]) is not Call or type(args[1]) is not bool
                or not is_empty_hooks(args[2])):
            raise Decline("unusual _rebuild_parameter arguments")
        inner: str | None = args[0].attrs.get("dtype")
        if args[1] and not may_require_grad(inner):
            raise Decline("requires_grad on a non-floating tensor")
        return inner
    if full == "torch._utils._rebuild_tensor_v2":
        if len(args) not in (6, 7):
            raise Decline("_rebuild_tensor_v2 arity")
        dtype = None
    else:  # _rebuild_tensor_v3
        if len(args) not in (7, 8) or type(args[6]) is not Global or args[6].module != "torch":
            raise Decline("_rebuild_tensor_v3 arguments")
        dtype = args[6].name
    storage, offset, size, stride, requires_grad, hooks = args[:6]
    metadata = args[7 if dtype else 6] if len(args) > (7 if dtype else 6) else None
    info = storage_info(storage) if type(storage) is PersId else None
    if info is None:
        raise Decline("tensor storage is not a storage")
    storage_dtype, nbytes = info
    if dtype is None:
        dtype = storage_dtype
    itemsize = ITEMSIZE.get(dtype)
    if (itemsize is None or type(offset) is not int or offset < 0
            or type(size) is not tuple or type(stride) is not tuple or len(size) != len(stride)
            or type(requires_grad) is not bool or not is_empty_hooks(hooks)
            or not (metadata is None or (type(metadata) is CheckedDict and not metadata))):
        raise Decline("unusual tensor arguments")
    if requires_grad and (not may_require_grad(dtype) or full.endswith("_v3")):
        # _rebuild_tensor_v3 with requires_grad never loads (torch.empty(requires_grad=True)
        # then set_() on a leaf that requires grad: RuntimeError)
        raise Decline("requires_grad on a non-floating tensor, or in _rebuild_tensor_v3")
    if offset >= INT64_SAFE:
        raise Decline("a storage offset near int64 overflow")
    extent = 1
    empty = False
    for n, st in zip(size, stride, strict=True):   # every dim, also after a zero one
        if type(n) is not int or type(st) is not int or not (
                0 <= n < INT64_SAFE and 0 <= st < INT64_SAFE):
            raise Decline("negative, huge or non-integer size/stride (torch parses int64)")
        empty = empty or n == 0
        extent += (n - 1) * st
    if numel_unmodelled(size):
        raise Decline("an element count near or past int64")
    if not empty and (offset + extent) * itemsize > nbytes:
        raise Decline("tensor view past the end of its storage")
    return dtype


def is_empty_hooks(hooks: Any) -> bool:
    return isinstance(hooks, OrderedDictStub) and not hooks and not hooks.__dict__


def all_of_type(values: Any, kind: type) -> bool:
    return set(map(type, values)) <= {kind}


def view_extents(sizes: Any, strides: Any) -> tuple[list[int], list[bool]]:
    """(1 + sum((n - 1) * stride), numel == 0) per tensor; sizes and strides are checked to be
    ints in [0, MAX_COLUMN_EXTENT), with at most MAX_COLUMN_DIMS dims."""
    flat_n = list(chain.from_iterable(sizes))
    flat_s = list(chain.from_iterable(strides))
    if not (all_of_type(flat_n, int) and all_of_type(flat_s, int)):
        raise Decline("non-integer size or stride")
    if flat_n and (min(flat_n) < 0 or min(flat_s) < 0 or max(flat_n) >= MAX_COLUMN_EXTENT
                   or max(flat_s) >= MAX_COLUMN_EXTENT):
        raise Decline("negative or huge size/stride")
    dims = list(map(len, sizes))
    most = max(dims, default=0)
    if most > MAX_COLUMN_DIMS:
        raise Decline("too many dimensions")
    if most > 2:   # sizes < 2**28: two dims cannot reach INT64_SAFE
        # numel_unmodelled, its first clause over all products in C passes, then the
        # empty views alone
        numels = list(map(prod, sizes))
        if max(numels) >= INT64_SAFE or any(map(numel_unmodelled, compress(sizes, map(not_, numels)))):
            raise Decline("an element count near or past int64 (check_view's rule)")
    # running sums of (n - 1) * stride over every dim, read where each tensor's dims end:
    # a tensor's sum is its end's minus the previous tensor's (C loops, no statement a dim)
    running = list(accumulate(map(mul, map(sub, flat_n, repeat(1)), flat_s), initial=0))
    at_ends = list(map(running.__getitem__, accumulate(dims)))
    extents = list(map(sub, at_ends, chain((-1,), map(sub, at_ends, repeat(1)))))
    return extents, list(map(contains, sizes, repeat(0)))
