"""BUILD on a rebuilt tensor, as torch 2.13's weights-only unpickler runs it (FORMATS.md §3.4).

`Unpickler.load` (torch/_weights_only_unpickler.py) on BUILD, with `inst` the object under
the state:

    if type(inst) is torch.Tensor:            inst.set_(*state)       # "Legacy unpickling"
    elif type(inst) is torch.nn.Parameter:    inst.__setstate__(state)

and `Tensor.__setstate__` (torch/_tensor.py) is: a 4-item state -> `set_(*state)`; a 5-item
one (a legacy Variable) -> `self.data = state[0]`, then the state becomes
`(state[3], state[4], state[2])`; then `self.requires_grad, _, self._backward_hooks = state`.

Strategy: the interpreter's plain dense tensors carry a `TensorView` (`attrs["view"]`): the
storage, dtype, storage offset, shape and stride torch gives them. `build_tensor` /
`build_parameter` replay the code above on it in Python's and torch's order: star-unpacking
and `len()`/indexing of the state as CPython does them on the value torch holds (a storage
iterates its elements, a tensor its sub-tensors along dim 0, a dict its keys), then
`Tensor.set_`'s overloads (`()`, `(Storage)`, `(Tensor)`, `(Storage|Tensor, offset, size,
stride=None)`) with the argument parser of core.torch.rules, the dtype checks, the leaf check
and the view bounds; they return the new view. Measured with torch 2.13 over a generated set of
states (tests/differential/test_tensor_build_vs_torch.py). A refusal's message is torch's
first line (what the report keeps); the overload list of "invalid combination" is not repeated.

Unmodelled (narrowly): BUILD on a quantized, sparse, nested or meta tensor; iterating a set of
two or more items (its order is the hash seed's); states holding values whose type we do not
name; more than 10,000 arguments or elements (torch's line would name each); the int64-edge
sizes and offsets `set_args`/`check_view` leave Unmodelled for every rebuild too.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptguard.core.records import record, replace
from ckptguard.core.torch.dtypes import FLOATING, ITEMSIZE, PACKED_PER_BYTE
from ckptguard.core.torch.rules import (
    NO_GRAD_SETTER,
    Fail,
    StorageInfo,
    StorageOf,
    check_view,
    is_int,
    matches_int_array,
    set_args,
    unmodelled,
)
from ckptguard.core.values import Call, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, TypeAlias


@record(frozen=True, slots=True)
class TensorView:
    """A plain dense tensor as torch holds it: a view of `dtype` on a storage."""

    storage: StorageInfo | None   # None: a fresh storage of its own (`set_()`, Parameter(None))
    persid: PersId | None         # the persistent id that named the storage (the manifest's key)
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    acc, out = 1, []
    for dim in reversed(shape):
        out.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(out))


LEAF_IN_PLACE = "a leaf Variable that requires grad is being used in an in-place operation."
# `Py_TYPE(v)->tp_name` of the values an interpreter names by their class (core.torch.callables
# type_name): a class defined in Python has its bare name there, a C type its dotted one
_TP_NAME = {"torch.Tensor": "Tensor", "torch.nn.parameter.Parameter": "Parameter",
            "collections.Counter": "Counter", "torch.serialization.StorageType": "StorageType",
            "torch.nn.parameter._ParameterMeta": "_ParameterMeta",
            "torch.storage.TypedStorage": "TypedStorage"}
_NAMED = frozenset((
    "NoneType", "bool", "int", "float", "str", "bytes", "bytearray", "tuple", "list", "dict", "set",
    "complex", "type", "function", "builtin_function_or_method", "torch.Size", "torch.dtype",
    "torch.device", "torch.layout", "torch.qscheme", "torch.tensortype", "torch._C._TensorMeta",
    "collections.OrderedDict", "torch.storage.UntypedStorage", *_TP_NAME))
_ITERABLE = frozenset(("str", "bytes", "bytearray", "tuple", "list", "dict", "set", "torch.Size",
                       "collections.OrderedDict", "collections.Counter", "torch.Tensor",
                       "torch.nn.parameter.Parameter", "torch.storage.TypedStorage",
                       "torch.storage.UntypedStorage"))
# C++ names of a dtype in set_'s checks (c10's typeMeta names, GCC) and ScalarType names
CPP_NAME = {
    "float64": "double", "float32": "float", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
    "uint8": "unsigned char", "bool": "bool", "complex128": "c10::complex<double>",
    "complex64": "c10::complex<float>", "complex32": "c10::complex<c10::Half>",
    "qint8": "c10::qint8", "qint32": "c10::qint32", "quint8": "c10::quint8",
    "quint4x2": "c10::quint4x2", "quint2x4": "c10::quint2x4", "float8_e5m2": "c10::Float8_e5m2",
    "float8_e4m3fn": "c10::Float8_e4m3fn", "float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
    "float8_e4m3fnuz": "c10::Float8_e4m3fnuz", "float8_e8m0fnu": "c10::Float8_e8m0fnu",
    "float4_e2m1fn_x2": "c10::Float4_e2m1fn_x2", "bits8": "c10::bits8", "bits16": "c10::bits16",
    "bits1x8": "c10::bits1x8", "bits2x4": "c10::bits2x4", "bits4x2": "c10::bits4x2",
    "uint16": "short unsigned int", "uint32": "unsigned int", "uint64": "long unsigned int",
    **{f"uint{n}": f"c10::dummy_uint1_7_t<{n}>" for n in range(1, 8)},
    **{f"int{n}": f"c10::dummy_int1_7_t<{n}>" for n in range(1, 8)},
}
SCALAR_NAME = {
    "float64": "Double", "float32": "Float", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
    "bool": "Bool", "complex128": "ComplexDouble", "complex64": "ComplexFloat",
    "qint8": "QInt8", "qint32": "QInt32", "quint8": "QUInt8", "quint4x2": "QUInt4x2",
    "quint2x4": "QUInt2x4",
}
_ELEMENTS_MAX = 10_000   # a longer storage or tensor star-unpacked: we do not build the message

TypeName: TypeAlias = "Callable[[Any], str | None]"   # the interpreter's type_name (None: not modelled)


class _Items:
    """What CPython sees of a state: its items when iterated, its length, `state[i]`."""

    def __init__(self, state: Any, tname: TypeName, so: StorageOf) -> None:
        self.state, self.tname, self.so = state, tname, so
        self.t = _named(state, tname)

    def length(self) -> int:
        if self.t not in _ITERABLE:
            raise Fail("TypeError", f"object of type '{tp_name(self.t)}' has no len()")
        if self.t in ("torch.Tensor", "torch.nn.parameter.Parameter"):
            shape = _view(self.state).shape
            if not shape:
                raise Fail("TypeError", "len() of a 0-d tensor")
            return shape[0]
        if self.t == "torch.storage.TypedStorage":   # its elements, without reading them
            st = self.so(self.state)
            if st is None or st.dtype in PACKED_PER_BYTE:
                raise unmodelled("the length of this storage")
            return st.nbytes_now // ITEMSIZE[st.dtype]
        return len(self.items())

    def items(self) -> list[Any]:
        """`[*state]`."""
        v, t = self.state, self.t
        if t not in _ITERABLE:
            raise Fail("TypeError", f"argument after * must be an iterable, not {tp_name(t)}")
        if isinstance(v, (tuple, list, str)):
            return list(v)
        if isinstance(v, dict):
            return list(v)
        if isinstance(v, set):
            if len(v) > 1:
                raise unmodelled("iterating a set of two or more items (its order is the hash seed's)")
            return list(v)
        if t in ("torch.Tensor", "torch.nn.parameter.Parameter"):
            return _sub_tensors(v)
        if t == "torch.storage.TypedStorage":
            return _storage_elements(self.so(v))
        if isinstance(v, Call):
            if t in ("bytes", "torch.Size") and isinstance(v.attrs.get("value"), (bytes, tuple)):
                return list(v.attrs["value"])
            if t in ("collections.OrderedDict", "collections.Counter") and not v.state and (
                    v.args == () or v.opcode == "NEWOBJ"):
                return list(dict(v.setitems))
            if t == "set" and (v.args == () or (isinstance(v.args[0], (tuple, list, str))
                                                and len(set(v.args[0])) <= 1)):
                return list(v.args[0][:1]) if v.args else []
        raise unmodelled(f"iterating a {t} of this form")

    def index(self, i: int) -> Any:
        """`state[i]`, for a state whose len() is 5."""
        v, t = self.state, self.t
        if isinstance(v, dict):
            if i not in v:
                raise Fail("KeyError", str(i))
            return v[i]
        if t == "set":
            raise Fail("TypeError", "'set' object is not subscriptable")
        if t in ("collections.OrderedDict", "collections.Counter"):
            self.items()   # a form whose items we know
            keys = dict(v.setitems)
            if i not in keys:
                if t == "collections.Counter":
                    return 0   # Counter.__missing__
                raise Fail("KeyError", str(i))
            return keys[i]
        return self.items()[i]


def tp_name(t: str) -> str:
    return _TP_NAME.get(t, t)


def parser_name(t: str) -> str:
    """How torch's C++ bindings name a value's type (its tp_name, but a TypedStorage's in full)."""
    return t if t == "torch.storage.TypedStorage" else tp_name(t)


def _named(v: Any, tname: TypeName) -> str:
    t = tname(v)
    if t is None or t not in _NAMED:
        raise unmodelled(f"BUILD on a tensor with a state holding a {t or 'value of this type'}")
    return t


def _view(v: Any) -> TensorView:
    view: TensorView | None = v.attrs.get("view")
    if view is None:
        raise unmodelled("a quantized, sparse, nested or meta tensor in a BUILD")
    return view


def _sub_tensors(v: Call) -> list[Any]:
    """`[*tensor]` = `tensor.unbind(0)`: plain Tensors, one per index of dim 0."""
    view = _view(v)
    if not view.shape:
        raise Fail("TypeError", "iteration over a 0-d tensor")
    if view.shape[0] > _ELEMENTS_MAX:
        raise unmodelled("star-unpacking a tensor of more than 10,000 rows")
    out = []
    for i in range(view.shape[0]):
        part = replace(view, offset=view.offset + i * view.stride[0], shape=view.shape[1:],
                       stride=view.stride[1:])
        # parts of a tensor that requires grad are outputs of unbind: not leaves, requiring grad
        rg = bool(v.attrs.get("requires_grad"))
        c = tensor_call(v, part, "torch.Tensor", rg)
        c.attrs["leaf"] = not rg
        out.append(c)
    return out


def _storage_elements(st: StorageInfo | None) -> list[Any]:
    """`[*typed_storage]`: one Python scalar per element, typed by the storage's dtype (their
    values do not matter: no set_ overload takes a scalar)."""
    if st is None or st.dtype in PACKED_PER_BYTE:
        raise unmodelled("star-unpacking this storage")
    n = st.nbytes_now // ITEMSIZE[st.dtype]
    if n > _ELEMENTS_MAX:
        raise unmodelled("star-unpacking a storage of more than 10,000 elements")
    kind: Any = (complex(0) if st.dtype.startswith("complex") else 0.0 if st.dtype in FLOATING
                 else False if st.dtype == "bool" else 0)
    return [kind] * n


def tensor_call(like: Call, view: TensorView, t: str, requires_grad: bool) -> Call:
    """A tensor node of type `t` viewing `view` (a part, or a BUILD's result)."""
    c = Call(like.func, like.args, like.opcode, like.offset)
    c.attrs.update(like.attrs)
    c.attrs.update(type=t, dtype=view.dtype, shape=view.shape, view=view,
                   requires_grad=requires_grad)
    return c


# --- Tensor.set_(*args) ----------------------------------------------------------------------

def _invalid(names: list[str]) -> Fail:
    if len(names) > _ELEMENTS_MAX:   # torch names every argument: we do not build that line
        return unmodelled("set_() with more than 10,000 arguments")
    return Fail("TypeError", "set_() received an invalid combination of arguments - got "
                f"({', '.join(names)}), but expected one of:")


def tensor_set(inst: Call, args: list[Any], tname: TypeName, so: StorageOf) -> TensorView:
    """`inst.set_(*args)` on a plain dense tensor: its view afterwards, or Fail."""
    view: TensorView = inst.attrs["view"]
    kinds = [_named(a, tname) for a in args]
    names = [parser_name(k) for k in kinds]
    if "torch.storage.UntypedStorage" in kinds:
        raise unmodelled("set_() with an UntypedStorage")
    n = len(args)
    source = kinds[0] if args else None
    is_storage = source == "torch.storage.TypedStorage"
    is_tensor = source in ("torch.Tensor", "torch.nn.parameter.Parameter")
    if n == 0:
        _leaf(inst)
        return TensorView(None, None, view.dtype, 0, (0,), (1,))
    if n == 1 and is_storage:
        st = _storage(args[0], so)
        _storage_dtype(view.dtype, st)
        _leaf(inst)
        return TensorView(st, args[0], view.dtype, 0, (st.nbytes_now // ITEMSIZE[view.dtype],), (1,))
    if n == 1 and is_tensor:
        other = _view(args[0])
        if other.dtype != view.dtype:
            raise Fail("RuntimeError", f"Could not set tensor of type {CPP_NAME[other.dtype]} to a "
                       f"tensor of type {CPP_NAME[view.dtype]}")
        _leaf(inst)
        if args[0].attrs.get("requires_grad"):
            # autograd records the set_: the tensor now requires grad and is no leaf (measured)
            inst.attrs.update(requires_grad=True, leaf=False)
        return other
    if n not in (3, 4) or not (is_storage or is_tensor):
        raise _invalid(names)
    offset, size = args[1], args[2]
    stride = args[3] if n == 4 else None
    if not (is_int(offset) and matches_int_array(size)
            and (stride is None or matches_int_array(stride))):
        raise _invalid(names)
    if is_storage:   # the storage's dtype is checked first, then the ints are unpacked
        st, persid = _storage(args[0], so), args[0]
        _storage_dtype(view.dtype, st)
    set_args(offset, size, stride)   # unpacks stride, size, offset (their refusals)
    if not is_storage:   # (Tensor source, ...): the source's storage, whatever its dtype (measured)
        other = _view(args[0])
        if other.storage is None:
            raise unmodelled("set_() on the fresh storage of another tensor")
        st, persid = other.storage, other.persid
    _leaf(inst)
    if view.dtype in PACKED_PER_BYTE:
        raise unmodelled("set_() on a packed quantized dtype")
    shape, strides = check_view(st, ITEMSIZE[view.dtype], offset, size, stride)
    return TensorView(st, persid, view.dtype, offset, shape, strides)


def _storage(v: Any, so: StorageOf) -> StorageInfo:
    st = so(v)
    if st is None:
        raise unmodelled("a storage we cannot resolve")
    return st


def _storage_dtype(dtype: str, st: StorageInfo) -> None:
    if st.dtype != dtype:
        raise Fail("RuntimeError", f"Expected a Storage of type {CPP_NAME[dtype]} or an UntypedStorage, "
                   f"but got type {SCALAR_NAME[st.dtype]} for argument 1 'storage'")


def _leaf(inst: Call) -> None:
    """The in-place check on a leaf that requires grad (a non-leaf may change in place)."""
    if inst.attrs.get("requires_grad") and inst.attrs.get("leaf", True):
        raise Fail("RuntimeError", LEAF_IN_PLACE)


# --- the two BUILDs ------------------------------------------------------------------------------

def build_tensor(inst: Call, state: Any, tname: TypeName, so: StorageOf) -> None:
    """`inst.set_(*state)` on a torch.Tensor; updates `inst` as torch's object ends up."""
    if "view" not in inst.attrs:
        raise unmodelled("BUILD on a quantized, sparse, nested or meta tensor")
    try:
        args = _Items(state, tname, so).items()
    except Fail as exc:
        if exc.message.startswith("argument after *"):
            raise Fail("TypeError", f"Tensor.set_() {exc.message}") from None
        raise
    _set_view(inst, tensor_set(inst, args, tname, so))


def build_parameter(inst: Call, state: Any, tname: TypeName, so: StorageOf) -> None:
    """`Tensor.__setstate__(inst, state)` on an nn.Parameter; updates `inst` likewise."""
    if "view" not in inst.attrs:
        raise unmodelled("BUILD on a parameter of a quantized, sparse, nested or meta tensor")
    # (`__setstate__`'s leaf check never fails here: a Parameter is made a leaf, and only
    # `set_(tensor)` with one argument, which a Parameter's BUILD cannot pass, makes a non-leaf)
    items = _Items(state, tname, so)
    n = items.length()
    if n == 4:   # whatever has a len() iterates: never the star-argument message
        _set_view(inst, tensor_set(inst, items.items(), tname, so))
        return
    if n == 5:
        data = items.index(0)
        _set_data(inst, data, tname)
        state = (items.index(3), items.index(4), items.index(2))
        items = _Items(state, tname, so)
    count = items.length()
    if count != 3:
        if count < 3:
            raise Fail("ValueError", f"not enough values to unpack (expected 3, got {count})")
        raise Fail("ValueError", "too many values to unpack (expected 3)")
    rg = items.items()[0]
    if not isinstance(rg, bool):
        raise Fail("RuntimeError", "requires_grad must be a bool")
    if rg and inst.attrs.get("dtype") not in FLOATING:
        raise Fail("RuntimeError", NO_GRAD_SETTER)
    inst.attrs["requires_grad"] = rg   # `_backward_hooks` takes any object (measured)


def _set_data(inst: Call, data: Any, tname: TypeName) -> None:
    """`param.data = data`."""
    t = _named(data, tname)
    if t not in ("torch.Tensor", "torch.nn.parameter.Parameter"):
        raise Fail("TypeError", f"Variable data has to be a tensor, but got {parser_name(t)}")
    view = _view(data)
    if inst.attrs.get("requires_grad") and view.dtype not in FLOATING:
        raise Fail("RuntimeError", "data set to a tensor that requires gradients must be floating "
                   "point or complex dtype")
    _set_view(inst, view)


def _set_view(inst: Call, view: TensorView) -> None:
    inst.attrs.update(view=view, dtype=view.dtype, shape=view.shape, built=True)
