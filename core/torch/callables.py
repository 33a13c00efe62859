"""What torch 2.13's allowlisted callables do with the arguments a pickle gives them.

Strategy: `weights_only` never calls anything; when torch would call an allowlisted
function (REDUCE) or class (NEWOBJ), `call_allowed` checks the arguments the way the
real callee would and returns an inert `Call` node typed with the class torch would
produce (`attrs["type"]`). Errors are reproduced word for word where they were
measured against torch 2.13 (tests/differential); any argument shape not measured
raises `Fail` with type "Unmodelled" — never a guessed "loadable".

Modelled (tests/differential): `_rebuild_tensor`/`_v2`/`_v3` (arity, storage type, set_
checks: size/stride lengths, offset, negative stride, empty stride = contiguous, bounds
on a non-resizable storage, requires_grad, metadata), `_rebuild_parameter[_with_state]`,
`_rebuild_qtensor` (per-tensor / per-channel affine and float qparams, sub-byte packed
bounds), `_rebuild_sparse_tensor`,
`_rebuild_meta_tensor_no_storage`, `_rebuild_from_type_v2` (plain Tensor with attributes,
user-allowlisted subclasses), `_rebuild_nested_tensor` (strided),
`_rebuild_device_tensor_from_cpu_tensor` (a plain dense tensor to cpu, meta or the policy's
devices), `_rebuild_wrapper_subclass` (well-typed arguments: no class a fresh torch allows
defines `__torch_dispatch__`), OrderedDict/Counter/set/complex/bytearray/_codecs.encode/
torch.Size/torch.device/_get_layout, calling a dtype/qscheme/StorageType. Unmodelled:
`_rebuild_device_tensor_from_numpy` of an ndarray (numpy is not allowlisted by default;
anything but an ndarray gets from_numpy's TypeError), a device copy to
an int device or another backend (the host's), legacy Tensor constructors
(torch.FloatTensor(...), NEWOBJ of Tensor/Parameter), odd argument types.
"""

from __future__ import annotations

import math
import re
import struct
from collections import OrderedDict
from collections.abc import Callable

from ckptguard.core.torch.allowlist import (
    CLASSES,
    QSCHEMES,
    REBUILDERS,
    STORAGE_GLOBALS,
    TENSOR_TYPE_GLOBALS,
)
from ckptguard.core.torch.dtypes import (
    DEVICE_TYPES,
    ITEMSIZE,
    LAYOUTS,
    STORAGE_DTYPE,
    TORCH_DTYPE_GLOBALS,
)
from ckptguard.core.torch.rules import (
    INT64_SAFE,
    NO_GRAD_SETTER,
    Fail,
    StorageInfo,
    StorageOf,
    check_allocation,
    check_view,
    int_seq,
    is_int,
    may_require_grad,
    restorable,
    set_args,
    set_requires_grad,
    unmodelled,
)
from ckptguard.core.torch.tensor_build import TensorView, contiguous
from ckptguard.core.values import Call, Global, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, TypeAlias

# how `str(cls)` renders an allowlisted class that is not a builtin
_CLASS_STR = {"builtins.bytearray": "bytearray", "builtins.set": "set", "builtins.complex": "complex"}
# the setter `tensor.requires_grad = True` (_rebuild_tensor_v2) and requires_grad_() /
# `torch.empty(requires_grad=True)` (Parameter, _rebuild_tensor_v3) word it differently
_NO_GRAD = "Only Tensors of floating point and complex dtype can require gradients"
_LEAF_IN_PLACE = "a leaf Variable that requires grad is being used in an in-place operation."
_DEVICE_TYPES = ", ".join(DEVICE_TYPES)
# data descriptors of torch.Tensor / nn.Parameter: setattr on them is not a plain store
# (tests/differential checks this list against torch)
TENSOR_DESCRIPTORS = frozenset("""
H T __class__ __cuda_array_interface__ __dict__ __weakref__ _backward_hooks _base _cdata _grad
_grad_fn _has_symbolic_sizes_strides _post_accumulate_grad_hooks _python_dispatch _version data device
dtype grad grad_dtype grad_fn imag is_cpu is_cuda is_ipu is_leaf is_maia is_meta is_mkldnn is_mps is_mtia
is_nested is_quantized is_sparse is_sparse_csr is_vulkan is_xla is_xpu itemsize layout mH mT name nbytes
ndim output_nr real requires_grad retains_grad shape volatile""".split())
_SPARSE_LAYOUTS = frozenset(("torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr",
                             "torch.sparse_bsc"))
_QDTYPES = frozenset(("qint8", "quint8", "qint32", "quint4x2", "quint2x4"))
_REAL_FLOATING = frozenset(("float64", "float32", "float16", "bfloat16"))
# per-channel qparam tensor dtypes whose behaviour was measured (others: Unmodelled)
_QPARAM_DTYPES = _REAL_FLOATING | frozenset(("int64", "int32", "int16", "int8", "uint8", "bool",
                                             "complex64", "complex128"))




def global_kind(full: str) -> str:
    """`type(obj)` of an allowlisted global, as torch renders it inside `<class '...'>`."""
    if full in CLASSES:
        return CLASSES[full]
    module, _, name = full.rpartition(".")
    if module == "torch" and name in TORCH_DTYPE_GLOBALS:
        return "torch.dtype"
    if module == "torch" and name in QSCHEMES:
        return "torch.qscheme"
    if full in STORAGE_GLOBALS:
        return "torch.serialization.StorageType"
    if full in TENSOR_TYPE_GLOBALS:
        return "torch.tensortype"
    if full == "_codecs.encode":
        return "builtin_function_or_method"
    if full in REBUILDERS or full in ("torch.serialization._get_layout",
                                      "torch._tensor._rebuild_from_type_v2"):
        return "function"
    return "?"


def type_name(v: Any, storage_of: StorageOf) -> str | None:
    """The name inside torch's `<class '...'>` for `type(v)`; None if not modelled."""
    if v is None:
        return "NoneType"
    if isinstance(v, (bool, int, float, str, bytes, list, tuple, dict, set, frozenset)):
        return type(v).__name__
    if isinstance(v, Call):
        t = v.attrs.get("type")
        return t if isinstance(t, str) else None
    if isinstance(v, PersId):
        return "torch.storage.TypedStorage" if storage_of(v) is not None else None
    if isinstance(v, Global):
        kind = global_kind(v.full)
        return None if kind == "?" else kind
    return None


def class_repr(name: str) -> str:
    return f"<class '{name}'>"


# values str_value visits for one message: a memo DAG gives a few hundred bytes 2**40 paths,
# whose message torch itself would never finish printing
_STR_NODES = 100_000


def str_value(v: Any, storage_of: StorageOf, depth: int = 0,
              budget: list[int] | None = None) -> str | None:
    """`str(v)` as torch would print it in a message; None where it depends on data, or where
    printing it would visit more than _STR_NODES values."""
    if budget is None:
        budget = [_STR_NODES]
    budget[0] -= 1
    if depth > 50 or budget[0] < 0:
        return None
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return str(v) if depth == 0 or not isinstance(v, (str, bytes)) else repr(v)
    if isinstance(v, (list, tuple, set, dict)) and len(v) > 10_000:
        return None  # torch would print it all; we do not build megabyte messages
    if isinstance(v, (list, tuple, set)):
        parts = [str_value(x, storage_of, depth + 1, budget) for x in v]
        if any(p is None for p in parts):
            return None
        if isinstance(v, set):
            return "{" + ", ".join(parts) + "}" if parts else "set()"  # type: ignore[arg-type]
        body = ", ".join(parts)  # type: ignore[arg-type]
        if isinstance(v, list):
            return f"[{body}]"
        return f"({body},)" if len(parts) == 1 else f"({body})"
    if isinstance(v, dict):
        items = []
        for k, x in v.items():
            ks = str_value(k, storage_of, depth + 1, budget)
            xs = str_value(x, storage_of, depth + 1, budget)
            if ks is None or xs is None:
                return None
            items.append(f"{ks}: {xs}")
        return "{" + ", ".join(items) + "}"
    ordered = _plain_ordered_dict_items(v)
    if ordered is not None:
        try:   # OrderedDict's repr changed in CPython 3.12: this interpreter's, as torch's
            return str(OrderedDict(ordered))
        except ValueError:   # an int past sys.get_int_max_str_digits
            return None
    if isinstance(v, Global):
        kind = global_kind(v.full)
        if kind == "torch.dtype" or kind == "torch.qscheme":
            return v.full
        if kind == "torch.serialization.StorageType":
            return f"StorageType(dtype=torch.{STORAGE_DTYPE[v.name]})"
        if v.full in CLASSES or kind == "torch.tensortype":
            return class_repr(_CLASS_STR.get(v.full, v.full))
    return None  # functions print their address; tensors print their data


def _plain_ordered_dict_items(v: Any) -> list[tuple[Any, Any]] | None:
    """The items of an OrderedDict whose every key and value is a plain scalar, else None."""
    if not (isinstance(v, Call) and v.attrs.get("type") == "collections.OrderedDict") or v.state:
        return None
    if v.opcode == "REDUCE" and v.args and v.args[0]:   # OrderedDict({...}): items we did not keep
        return None
    items = v.setitems
    scalar = (bool, int, float, str, bytes, type(None))
    if len(items) > 1_000 or not all(type(k) in scalar and type(x) in scalar for k, x in items):
        return None
    return items


def _dtype_of(v: Any) -> str | None:
    if isinstance(v, Global) and v.module == "torch" and v.name in TORCH_DTYPE_GLOBALS:
        return v.name
    return None


def _tensor(t: str, dtype: str | None, shape: tuple[int, ...] | None, func: Global, args: Any,
            opcode: str, offset: int, requires_grad: bool = False, view: TensorView | None = None) -> Call:
    c = Call(func, args, opcode, offset)
    c.attrs.update(type=t, dtype=dtype, shape=shape, requires_grad=requires_grad)
    if view is not None:   # a plain dense tensor: what a BUILD on it changes (core.torch.tensor_build)
        c.attrs["view"] = view
    return c


def _arity(name: str, args: tuple[Any, ...], names: tuple[str, ...], optional: int = 0) -> None:
    """Python's TypeError for a plain positional function `name(*names)`."""
    n, hi = len(args), len(names)
    lo = hi - optional
    if n < lo:
        missing = names[n:lo]
        if len(missing) == 1:
            raise Fail("TypeError", f"{name}() missing 1 required positional argument: '{missing[0]}'")
        quoted = [f"'{m}'" for m in missing]
        # CPython's format_missing: "'a' and 'b'", "'a', 'b', and 'c'"
        text = (f"{quoted[0]} and {quoted[1]}" if len(quoted) == 2
                else ", ".join(quoted[:-1]) + f", and {quoted[-1]}")
        raise Fail("TypeError", f"{name}() missing {len(missing)} required positional arguments: {text}")
    if n > hi:
        span = f"from {lo} to {hi}" if optional else f"{hi}"
        verb = "was" if n == 1 else "were"
        raise Fail("TypeError", f"{name}() takes {span} positional argument{'s' if hi != 1 else ''} "
                   f"but {n} {verb} given")


def _check_metadata(metadata: Any, dtype: str) -> None:
    if metadata is None or metadata == {}:
        return
    if isinstance(metadata, (list, tuple, int, str, float)) and not isinstance(metadata, bool):
        if not metadata:
            return
        raise Fail("AssertionError", f"expected dict, got {type(metadata).__name__}")
    if isinstance(metadata, dict) and set(metadata) <= {"conj", "neg"} and all(
            x is True for x in metadata.values()):
        if "conj" in metadata and not dtype.startswith("complex"):
            raise unmodelled("conj metadata on a real dtype (torch INTERNAL ASSERT)")
        return
    raise unmodelled("tensor metadata other than {'conj': True} / {'neg': True}")


def _storage_arg(v: Any, storage_of: StorageOf, attr: str) -> StorageInfo:
    st = storage_of(v) if isinstance(v, PersId) else None
    if st is not None:
        return st
    if v is None or isinstance(v, (bool, int, float, str, tuple, list, dict)):
        tn = type_name(v, storage_of)
        raise Fail("AttributeError", f"'{tn}' object has no attribute '{attr}'")
    raise unmodelled(f"storage argument of type {type_name(v, storage_of)}")


def _rebuild_tensor(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    _arity("_rebuild_tensor", args, ("storage", "storage_offset", "size", "stride"))
    st = _storage_arg(args[0], so, "dtype")
    shape, stride = check_view(st, ITEMSIZE[st.dtype], args[1], args[2], args[3])
    view = TensorView(st, args[0], st.dtype, args[1], shape, stride)
    return _tensor("torch.Tensor", st.dtype, shape, func, args, opcode, off, view=view)


def _rebuild_tensor_v2(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                       off: int) -> Call:
    _arity("_rebuild_tensor_v2", args, ("storage", "storage_offset", "size", "stride",
                                        "requires_grad", "backward_hooks", "metadata"), 1)
    st = _storage_arg(args[0], so, "dtype")
    shape, stride = check_view(st, ITEMSIZE[st.dtype], args[1], args[2], args[3])
    rg = set_requires_grad(args[4], st.dtype)
    _check_metadata(args[6] if len(args) > 6 else None, st.dtype)
    view = TensorView(st, args[0], st.dtype, args[1], shape, stride)
    return _tensor("torch.Tensor", st.dtype, shape, func, args, opcode, off, rg, view)


def _rebuild_tensor_v3(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                       off: int) -> Call:
    _arity("_rebuild_tensor_v3", args, ("storage", "storage_offset", "size", "stride",
                                        "requires_grad", "backward_hooks", "dtype", "metadata"), 1)
    st = _storage_arg(args[0], so, "_untyped_storage")
    dtype = _dtype_of(args[6])
    if dtype is None or dtype not in ITEMSIZE:
        raise unmodelled("_rebuild_tensor_v3 dtype argument that is not a torch dtype")
    if not isinstance(args[4], bool):
        raise unmodelled("_rebuild_tensor_v3 requires_grad that is not a bool")
    if args[4]:
        # torch.empty(dtype=..., requires_grad=True) refuses the dtype, or else the set_()
        # that follows parses its arguments and refuses to change a leaf requiring grad
        # (measured: before any offset/size/bounds check), so v3 never keeps requires_grad
        if not may_require_grad(dtype):
            raise Fail("RuntimeError", _NO_GRAD)
        set_args(args[1], args[2], args[3])
        raise Fail("RuntimeError", _LEAF_IN_PLACE)
    shape, stride = check_view(st, ITEMSIZE[dtype], args[1], args[2], args[3])
    _check_metadata(args[7] if len(args) > 7 else None, dtype)
    view = TensorView(st, args[0], dtype, args[1], shape, stride)
    return _tensor("torch.Tensor", dtype, shape, func, args, opcode, off, view=view)


def _rebuild_parameter(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                       off: int) -> Call:
    with_state = func.name == "_rebuild_parameter_with_state"
    names = ("data", "requires_grad", "backward_hooks") + (("state",) if with_state else ())
    _arity(func.name, args, names)
    data = args[0]
    dtype: Any
    shape: Any
    if data is None:  # Parameter.__new__: data=None -> torch.empty(0)
        dtype, shape = "float32", (0,)
    elif isinstance(data, Call) and data.attrs.get("type") in ("torch.Tensor",
                                                                "torch.nn.parameter.Parameter"):
        dtype, shape = data.attrs.get("dtype"), data.attrs.get("shape")
    elif isinstance(data, (bool, int, float, str, tuple, list, dict)):
        raise Fail("AttributeError", f"'{type_name(data, so)}' object has no attribute 'detach'")
    else:
        raise unmodelled("Parameter data that is not a plain tensor")
    rg = args[1]
    if not isinstance(rg, bool):
        tn = type_name(rg, so)
        if not (rg is None or isinstance(rg, (int, float, str, tuple, list, dict)) or tn in (
                "function", "builtin_function_or_method", "type")):
            raise unmodelled("the type name of a requires_grad argument")
        raise Fail("TypeError", "_make_subclass(): argument 'require_grad' (position 3) must be bool, "
                   f"not {tn}")
    if rg and not may_require_grad(dtype):
        if dtype not in ITEMSIZE:
            raise unmodelled(f"requires_grad on dtype {dtype}")
        raise Fail("RuntimeError", _NO_GRAD)
    if with_state:
        _set_obj_state(args[3], so)
    # Parameter(data) views what data views (a detached alias): a later BUILD on data does not
    # move it, an earlier one did (`built`: its view is no longer its arguments')
    view = TensorView(None, None, "float32", 0, (0,), (1,)) if data is None else data.attrs.get("view")
    c = _tensor("torch.nn.parameter.Parameter", dtype, shape, func, args, opcode, off, rg, view)
    if data is not None and data.attrs.get("built"):
        c.attrs["built"] = True
    return c


def _set_obj_state(state: Any, so: StorageOf) -> None:
    """torch._utils._set_obj_state: setattr for each item of the dict (and slots) state."""
    if isinstance(state, tuple):
        if len(state) != 2:
            raise unmodelled("an invalid serialized state tuple")
        parts = list(state)
    else:
        parts = [state]
    for part in parts:
        if part is None or part == {} or part == () or part is False or part == 0:
            continue
        if not isinstance(part, dict):
            raise unmodelled("an object state that is not a dict")
        for k in part:
            if not isinstance(k, str):
                raise Fail("TypeError", f"attribute name must be string, not '{type_name(k, so)}'")
            if k in TENSOR_DESCRIPTORS or k.startswith("__"):
                raise unmodelled(f"setting tensor attribute {k!r}")


def _is_tensor(v: Any, dtypes: frozenset[str] | None = None) -> bool:
    return (isinstance(v, Call) and v.attrs.get("type") == "torch.Tensor"
            and (dtypes is None or v.attrs.get("dtype") in dtypes))


def _rebuild_from_type_v2(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                          off: int) -> Call:
    _arity("_rebuild_from_type_v2", args, ("func", "new_type", "args", "state"))
    inner, new_type, inner_args, state = args
    if not isinstance(inner, Global) or inner.full not in _MODELS:
        raise unmodelled("_rebuild_from_type_v2 of a callable that is not a modelled rebuilder")
    ret = call_allowed(inner, inner_args, so, opcode, off)
    if not isinstance(new_type, Global):
        raise unmodelled("_rebuild_from_type_v2 with a new_type that is not a global")
    if new_type.full == "torch.Tensor" and ret.attrs.get("type") == "torch.Tensor":
        _set_obj_state(state, so)
        t = "torch.Tensor"
    elif new_type.full not in ALLOWED_CLASSES and not new_type.full.startswith("torch."):
        # a user-allowlisted Tensor subclass: its __setstate__ is the user's business
        if ret.attrs.get("type") != "torch.Tensor":
            raise unmodelled("_rebuild_from_type_v2 of a non-tensor result")
        t = new_type.full
    else:
        raise unmodelled(f"_rebuild_from_type_v2 to {new_type.full}")
    c = Call(func, args, opcode, off)
    c.attrs.update(ret.attrs)
    c.attrs["type"] = t
    return c


def _rebuild_qtensor(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    _arity("_rebuild_qtensor", args, ("storage", "storage_offset", "size", "stride", "quantizer_params",
                                      "requires_grad", "backward_hooks"))
    q = args[4]
    # torch reads quantizer_params[0] first, then compares it with the qschemes
    if q is None or isinstance(q, (bool, int, float)):
        raise Fail("TypeError", f"'{type_name(q, so)}' object is not subscriptable")
    if isinstance(q, (tuple, list, str)) and not q:
        raise Fail("IndexError", f"{type(q).__name__} index out of range")
    if not isinstance(q, tuple):
        raise unmodelled("_rebuild_qtensor with odd qparams")
    if not isinstance(q[0], Global) or global_kind(q[0].full) != "torch.qscheme" or q[0].name not in (
            "per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams"):
        text = str_value(q[0], so)
        if text is None or isinstance(q[0], (list, tuple, dict)):
            raise unmodelled("_rebuild_qtensor with an odd qscheme")
        raise Fail("RuntimeError", f"Can't deserialize quantized tensor with qscheme {text}")
    scheme = q[0].full
    st = _storage_arg(args[0], so, "dtype")
    shape = int_seq(args[2])
    if shape is None:
        raise unmodelled("_rebuild_qtensor size")
    if scheme == "torch.per_tensor_affine" and len(q) == 3 and isinstance(q[1], float) and is_int(q[2]):
        if st.dtype not in _QDTYPES and st.dtype in ITEMSIZE and all(x >= 0 for x in shape):
            raise Fail("RuntimeError", "Creation of quantized tensor requires quantized dtype like "
                       "torch.quint8")
    elif scheme in ("torch.per_channel_affine", "torch.per_channel_affine_float_qparams") \
            and len(q) == 4 and is_int(q[3]):
        axis = q[3]
        if not 0 <= axis < len(shape):
            raise Fail("ValueError", f"_rebuild_qtensor: per_channel axis {axis} out of range for size "
                       f"{shape}")
        scales, zps = q[1], q[2]
        if not (_is_tensor(scales, _QPARAM_DTYPES) and _is_tensor(zps, _QPARAM_DTYPES)):
            raise unmodelled("per-channel qparams that are not tensors of a measured dtype")
        ns, nz = _numel(scales.attrs.get("shape")), _numel(zps.attrs.get("shape"))
        if ns is None or nz is None or len(scales.attrs["shape"]) != 1 or len(zps.attrs["shape"]) != 1:
            raise unmodelled("per-channel qparams of odd shape")
        if ns != shape[axis] or nz != shape[axis]:
            raise Fail("ValueError", "_rebuild_qtensor: per_channel scales/zero_points length must equal "
                       f"size[axis]={shape[axis]}, got scales={ns}, zero_points={nz}")
        # measured with torch 2.13 over both schemes and every q dtype: any zero-point dtype
        # is accepted, scales must be a real floating dtype
        if scales.attrs.get("dtype") not in _REAL_FLOATING:
            raise Fail("RuntimeError", "scale tensor must be floating point")
    else:
        raise unmodelled(f"_rebuild_qtensor with qscheme {scheme}")
    if any(x < 0 for x in shape) or args[5] is not False or st.dtype not in _QDTYPES:
        raise unmodelled("_rebuild_qtensor with negative sizes, requires_grad or a non-q storage")
    shape, _ = check_view(st, ITEMSIZE[st.dtype], args[1], args[2], args[3], quantized=True)
    check_allocation(math.prod(shape), ITEMSIZE[st.dtype], st.nbytes)   # _empty_affine_quantized(size)
    return _tensor("torch.Tensor", st.dtype, shape, func, args, opcode, off)


def _numel(shape: Any) -> int | None:
    if not isinstance(shape, tuple):
        return None
    n = 1
    for x in shape:
        n *= x
    return n


def _rebuild_sparse_tensor(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                           off: int) -> Call:
    _arity("_rebuild_sparse_tensor", args, ("layout", "data"))
    layout, data = args
    kind = layout.attrs.get("value") if isinstance(layout, Call) and layout.attrs.get(
        "type") == "torch.layout" else None
    if kind is None:
        err = hash_error(layout, so)  # `layout in {torch.sparse_csr, ...}` hashes it
        if err is not None:
            raise Fail("TypeError", err)
    if kind not in _SPARSE_LAYOUTS:
        text = kind if kind is not None else str_value(layout, so)
        if text is None:
            raise unmodelled("the text of a sparse layout argument")
        raise Fail("NotImplementedError", f"rebuilding sparse tensor for layout {text}")
    if kind == "torch.sparse_coo" and isinstance(data, tuple) and len(data) in (3, 4):
        indices, values, size = data[:3]
        coalesced = data[3] if len(data) == 4 else None
        dims = int_seq(size)
        if (_is_tensor(indices, frozenset(("int64",))) and _is_tensor(values) and dims is not None
                and (coalesced is None or isinstance(coalesced, bool))):
            ishape, vshape = indices.attrs.get("shape"), values.attrs.get("shape")
            if (isinstance(ishape, tuple) and isinstance(vshape, tuple) and len(ishape) == 2
                    and len(vshape) >= 1 and vshape[0] == ishape[1]
                    and len(dims) == ishape[0] + len(vshape) - 1 and tuple(dims[ishape[0]:]) == vshape[1:]
                    and all(d >= 0 for d in dims)):
                return _tensor("torch.Tensor", values.attrs.get("dtype"), dims, func, args, opcode, off)
    if kind != "torch.sparse_coo" and isinstance(data, tuple) and len(data) == 4:
        # torch.sparse_compressed_tensor(check_invariants=False) accepts any tensor shapes
        # (measured); the invariants are only checked when the user enables them
        dims = int_seq(data[3])
        if all(_is_tensor(x) for x in data[:3]) and dims is not None and all(d >= 0 for d in dims):
            return _tensor("torch.Tensor", data[2].attrs.get("dtype"), dims, func, args, opcode, off)
    raise unmodelled("a sparse tensor of this layout/shape")


# A nested tensor's sizes, strides and offsets are data, not pickle: torch reads them from
# their records and checks every component against the buffer's storage. The records are
# read through the caller's `ReadRecord` (a few bytes per component), at most this many.
NESTED_META_MAX = 1 << 20
ReadRecord = Callable[[str, int], bytes | None]   # (storage key, nbytes) -> the record's bytes
_NESTED = ("buffer", "sizes", "strides", "storage_offsets")


def rebuild_nested_tensor(func: Global, args: Any, so: StorageOf, opcode: str, off: int,
                          read: ReadRecord | None) -> Call:
    """`_rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)` =
    `torch._nested_view_from_buffer`: each component i is a view of the buffer's storage
    with sizes[i], strides[i] and offset storage_offsets[i], checked in order as ATen's
    `computeStorageNbytes` + `checkInBoundsForStorage` do (measured on torch 2.13, strided
    layout as torch.save writes it: a 1-D contiguous buffer, int64 (n, d) sizes and strides,
    int64 (n,) offsets). Other argument shapes are Unmodelled."""
    if not isinstance(args, tuple):
        raise unmodelled("REDUCE arguments that are not a tuple")
    _arity("_rebuild_nested_tensor", args, _NESTED)
    views = [_plain_view(a, so) for a in args]
    parts = [v for v in views if v is not None]
    if len(parts) != len(views) or read is None:
        raise unmodelled("_rebuild_nested_tensor of these arguments")
    (buf, buf_dtype, buf_shape, buf_stride, buf_off), *meta = parts
    if len(buf_shape) != 1 or buf_off != 0 or (buf_shape[0] > 1 and buf_stride != (1,)):
        raise unmodelled("a nested buffer that is not a whole 1-D storage")
    rows = []
    for (st, dtype, shape, stride, offset), want_dim in zip(meta, (2, 2, 1), strict=True):
        if dtype != "int64" or len(shape) != want_dim or stride != contiguous(shape):
            raise unmodelled("nested metadata that is not a contiguous int64 tensor")
        numel = shape[0] * (shape[1] if want_dim == 2 else 1)
        if (offset + numel) * 8 > NESTED_META_MAX:
            raise unmodelled("nested metadata past the scan's cap")
        raw = read(st.key, st.nbytes)
        if raw is None or len(raw) < (offset + numel) * 8:
            raise unmodelled("reading a nested tensor's metadata record")
        rows.append((shape, struct.unpack_from(f"<{numel}q", raw, offset * 8)))
    (size_shape, sizes), (stride_shape, strides), (offsets_shape, offsets) = rows
    n = size_shape[0]
    d = size_shape[1]
    if stride_shape != size_shape or offsets_shape != (n,):
        raise unmodelled("nested sizes, strides and offsets of different shapes")
    itemsize = ITEMSIZE[buf_dtype]
    for i in range(n):
        _check_component(sizes[i * d:(i + 1) * d], strides[i * d:(i + 1) * d], offsets[i],
                         itemsize, buf.nbytes)
    c = _tensor("torch.Tensor", buf_dtype, None, func, args, opcode, off)
    c.attrs["nested"] = n
    return c


def _plain_view(v: Any, so: StorageOf) -> tuple[StorageInfo, str, tuple[int, ...], tuple[int, ...],
                                                 int] | None:
    """(storage, dtype, shape, stride, storage_offset) of a plain `_rebuild_tensor_v2` result."""
    if not (isinstance(v, Call) and isinstance(v.func, Global) and not v.attrs.get("built")
            and v.func.full == "torch._utils._rebuild_tensor_v2" and v.attrs.get("type") == "torch.Tensor"
            and not v.attrs.get("requires_grad") and isinstance(v.args, tuple) and len(v.args) >= 4):
        return None
    st = so(v.args[0])
    shape, stride, offset = int_seq(v.args[2]), int_seq(v.args[3]), v.args[1]
    if st is None or shape is None or stride is None or not is_int(offset) \
            or len(shape) != len(stride) or st.dtype not in ITEMSIZE:
        return None
    return st, st.dtype, shape, stride, offset


_U64 = 1 << 64


def _check_component(sizes: tuple[int, ...], strides: tuple[int, ...], offset: int, itemsize: int,
                     storage_nbytes: int) -> None:
    """ATen `computeStorageNbytes(sizes, strides, itemsize, storage_offset)`, then
    `checkInBoundsForStorage`'s message. Its arithmetic is size_t: the offset is cast (so
    -1 wraps to a start of 0 and loads), and each product and sum must fit a uint64 exactly
    (`c10::mul_overflows`/`add_overflows`), the bytes an int64 (measured)."""
    size = (offset + 1) % _U64
    overflowed = False
    for s, t in zip(sizes, strides, strict=True):
        if s == 0:
            return
        step = t * (s - 1)
        overflowed |= not 0 <= step < _U64
        size += step % _U64
        overflowed |= size >= _U64
        size %= _U64
    size *= itemsize
    overflowed |= size >= _U64
    size %= _U64
    overflowed |= size > (1 << 63) - 1
    if overflowed:
        raise Fail("RuntimeError", f"Storage size calculation overflowed with sizes={list(sizes)} and "
                   f"strides={list(strides)}")
    if size > storage_nbytes:
        raise Fail("RuntimeError", f"setStorage: sizes {list(sizes)}, strides {list(strides)}, storage "
                   f"offset {offset}, and itemsize {itemsize} requiring a storage size of {size} are "
                   f"out of bounds for storage of size {storage_nbytes}")


def _rebuild_meta(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    _arity("_rebuild_meta_tensor_no_storage", args, ("dtype", "size", "stride", "requires_grad"))
    dtype, size, stride, rg = _dtype_of(args[0]), int_seq(args[1]), int_seq(args[2]), args[3]
    if (dtype is None or size is None or stride is None or len(size) != len(stride)
            or any(x < 0 for x in size + stride) or type(rg) is not bool):
        raise unmodelled("_rebuild_meta_tensor_no_storage with these arguments")
    # torch.empty_strided(size, stride, dtype=dtype, device="meta", requires_grad=rg): a
    # meta Parameter keeps requires_grad; a dtype that cannot require gradients refuses it;
    # a quantized dtype has no meta kernel (NotImplementedError, a dispatcher dump)
    if dtype.startswith(("qint", "quint")):
        raise unmodelled(f"a meta tensor of {dtype}")
    if rg and not may_require_grad(dtype):
        if dtype not in ITEMSIZE:
            raise unmodelled(f"requires_grad on dtype {dtype}")
        raise Fail("RuntimeError", _NO_GRAD)
    return _tensor("torch.Tensor", dtype, size, func, args, opcode, off, requires_grad=rg)


def _simple(type_: str, **attrs: Any) -> Callable[[Global, tuple[Any, ...], StorageOf, str, int], Call]:
    def make(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
        c = Call(func, args, opcode, off)
        c.attrs.update(type=type_, **attrs)
        return c
    return make


def _iterable_arg(v: Any, so: StorageOf) -> None:
    if v is None or isinstance(v, (bool, int, float)):
        raise Fail("TypeError", f"'{type_name(v, so)}' object is not iterable")


def _ordered_dict(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    tname = "collections.OrderedDict" if func.name == "OrderedDict" else "collections.Counter"
    if args == ():
        return _simple(tname)(func, args, so, opcode, off)
    if len(args) == 1:
        if args[0] is None and tname == "collections.Counter":  # Counter.update(None) is a no-op
            return _simple(tname)(func, args, so, opcode, off)
        _iterable_arg(args[0], so)
        if isinstance(args[0], dict) or (isinstance(args[0], (list, tuple)) and not args[0]):
            return _simple(tname)(func, args, so, opcode, off)
    raise unmodelled(f"{func.full} with arguments")


def _set(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int,
         hashing: HashBudget | None = None) -> Call:
    """`set(items)`: every member hashed, within the pickle's `hashing` budget (one memoized
    wide tuple listed 60,000 times is 60,000 hashes of it to torch, one walk here)."""
    if len(args) > 1:
        raise Fail("TypeError", f"set expected at most 1 argument, got {len(args)}")
    if args:
        _iterable_arg(args[0], so)
        if not isinstance(args[0], (list, tuple, set, str)):
            raise unmodelled("set() of a non-list")
        budget = hashing if hashing is not None else HashBudget()
        for x in args[0]:
            err = budget.error(x, so)
            if err is not None:
                raise Fail("TypeError", err)
    return _simple("set")(func, args, so, opcode, off)


def _complex(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    if len(args) > 2:
        raise Fail("TypeError", f"complex() takes at most 2 arguments ({len(args)} given)")
    if all(isinstance(a, float) or (isinstance(a, int) and abs(a) < 1 << 1000) for a in args):
        return _simple("complex")(func, args, so, opcode, off)
    raise unmodelled("complex() of non-numbers")


def _encode(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        try:
            value = args[0].encode("latin-1")
        except UnicodeEncodeError as exc:
            raise Fail("UnicodeEncodeError", str(exc)) from None
        return _simple("bytes", value=value)(func, args, so, opcode, off)
    raise unmodelled("_codecs.encode other than (str, 'latin1')")


def _bytearray(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    if args == () or (len(args) == 1 and isinstance(args[0], Call)
                      and args[0].attrs.get("type") == "bytes"):
        return _simple("bytearray")(func, args, so, opcode, off)
    if len(args) == 1 and isinstance(args[0], str):
        raise Fail("TypeError", "string argument without an encoding")
    raise unmodelled("bytearray() of anything but bytes")


def _size(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    if args == ():
        return _simple("torch.Size", value=())(func, args, so, opcode, off)
    if len(args) == 1:
        seq = args[0]
        if seq is None or isinstance(seq, (bool, int, float)):
            raise Fail("TypeError", f"'{type_name(seq, so)}' object is not iterable")
        if isinstance(seq, (tuple, list)):
            for i, x in enumerate(seq):
                if not is_int(x):
                    tn = type_name(x, so)
                    if tn in ("str", "float", "NoneType", "tuple", "list", "dict", "bool"):
                        if tn == "bool":
                            break
                        raise Fail("TypeError", f"torch.Size() takes an iterable of 'int' (item {i} "
                                   f"is '{tn}')")
                    break
            else:
                if all(abs(x) < INT64_SAFE for x in seq):
                    return _simple("torch.Size", value=tuple(seq))(func, args, so, opcode, off)
    raise unmodelled("torch.Size of anything but a sequence of ints")


_DEVICE_STRING = re.compile(r"([a-zA-Z_]+)(?::([1-9][0-9]*|0))?")
# how torch's python arg parser names a plain Python value's type in its messages
_PLAIN_TYPES = (type(None), bool, int, float, str, list, tuple, dict)
_INVALID_DEVICE = ("device() received an invalid combination of arguments - got ({got}), but expected "
                   "one of:\n * (torch.device device)\n{why} * (str type, int index = -1)\n")


def _plain_type(v: Any) -> str | None:
    return type(v).__name__ if type(v) in _PLAIN_TYPES else None


def _device(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    """`torch.device(*args)` in torch 2.13 on a host without accelerators (measured for every
    device type: tests/differential): the string is parsed and the type checked, no backend
    is needed to construct the object."""
    make = _simple("torch.device")
    kinds = [_plain_type(a) for a in args]
    if len(args) == 0 or len(args) > 2:
        if None in kinds:
            raise unmodelled("torch.device with these arguments")
        raise Fail("TypeError", _INVALID_DEVICE.format(got=", ".join(kinds), why=""))  # type: ignore[arg-type]
    first = args[0]
    if len(args) == 1:
        if isinstance(first, Call) and first.attrs.get("type") == "torch.device":
            return make(func, args, so, opcode, off)   # a copy of a device
        if kinds[0] in ("NoneType", "float", "bool", "dict") or first in ([], ()):
            shown = {"list": "list of []", "tuple": "tuple of ()"}.get(kinds[0], kinds[0])  # type: ignore[arg-type]
            raise Fail("TypeError", _INVALID_DEVICE.format(
                got=kinds[0], why=f"      didn't match because some of the arguments have invalid types: "
                f"(!{shown}!)\n"))
        if kinds[0] != "str":
            # an int means "the current accelerator": the answer depends on the host
            raise unmodelled("torch.device with these arguments")
    else:
        if kinds[0] is None or kinds[1] is None:
            raise unmodelled("torch.device with these arguments")
        if kinds[0] != "str":
            raise Fail("TypeError", f"device(): argument 'type' (position 1) must be str, not {kinds[0]}")
        if kinds[1] not in ("int", "NoneType"):
            raise Fail("TypeError", f"device(): argument 'index' (position 2) must be int, not {kinds[1]}")
    text: str = first
    if "\0" in text:
        raise unmodelled("a device string with a NUL")   # C++ cuts the message there
    if not text:
        raise Fail("RuntimeError", "Device string must not be empty")
    m = _DEVICE_STRING.fullmatch(text)
    if m is None:
        raise Fail("RuntimeError", f"Invalid device string: '{text}'")
    kind, index = m.groups()
    if index is not None and int(index) > 2**31 - 1:   # std::stoi
        raise Fail("RuntimeError", f"Could not parse device index '{index}' in device string '{text}'")
    if kind not in DEVICE_TYPES:
        raise Fail("RuntimeError", f"Expected one of {_DEVICE_TYPES} device type at start of device "
                   f"string: {kind}")
    if len(args) == 2:
        if index is not None and int(index) % 256 != 255:  # DeviceIndex is int8: -1 is "no index"
            raise Fail("RuntimeError", "type (string) must not include an index because index was passed "
                       f"explicitly: {text}")
        if args[1] is not None:
            if not -(1 << 63) <= args[1] < 1 << 63:
                raise Fail("ValueError", "Overflow when unpacking long long")
            if args[1] < 0:
                raise Fail("RuntimeError", "Device index must not be negative")
    return make(func, args, so, opcode, off)


# dtypes whose every conversion into each other `Tensor.to` was measured on CPU (tests/differential)
_CONVERTIBLE = frozenset(("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                          "uint8", "bool", "complex64", "complex128"))
# how torch's arg parser names the type of a `to()` keyword argument it refuses
_TO_ARG_TYPES = {type(None): "NoneType", float: "float", str: "str", int: "int", dict: "dict"}
_NON_LEAF = "you can only change requires_grad flags of leaf variables."
_NON_LEAF_FALSE = (_NON_LEAF + " If you want to use a computed variable in a subgraph that doesn't "
                   "require differentiation use var_no_grad = var.detach().")


def _device_text(v: Any) -> str | None:
    """The string a `torch.device(...)` Call was made from ("cuda:1" for ("cuda", 1))."""
    for _ in range(8):   # torch.device(torch.device(...)) copies
        if not (isinstance(v, Call) and v.attrs.get("type") == "torch.device" and isinstance(v.args, tuple)
                and v.args):
            return None
        if isinstance(v.args[0], str):
            index = v.args[1] if len(v.args) == 2 else None
            return v.args[0] if index is None else f"{v.args[0]}:{index}"
        v = v.args[0]
    return None


def _to_device(device: Any, dtype: Any, so: StorageOf, opcode: str, off: int) -> str:
    """The device type `data.to(dtype=dtype, device=device)` moves a cpu tensor to.

    Measured: the arg parser refuses a wrong-typed dtype or device first, then the device
    string is parsed; a device this host lacks fails, but the cpu, meta and the policy's
    restorable devices (cuda[:N], mps) are loadable; an int (the current accelerator) or
    another backend depends on the host: Unmodelled."""
    text = device if isinstance(device, str) else _device_text(device)
    device_type = ("str" if isinstance(device, str) else "torch.device" if text is not None
                   else "int" if is_int(device) else _TO_ARG_TYPES.get(type(device)))
    dtype_type = "torch.dtype" if _dtype_of(dtype) is not None else _TO_ARG_TYPES.get(type(dtype))
    if device_type is None or dtype_type is None or isinstance(dtype, bool):
        raise unmodelled("Tensor.to() with arguments of these types")
    if device_type not in ("str", "torch.device", "int", "NoneType") or dtype_type not in (
            "torch.dtype", "NoneType"):
        raise Fail("TypeError", "to() received an invalid combination of arguments - got "
                   f"(device={device_type}, dtype={dtype_type}, ), but expected one of:")
    if device is None:
        return "cpu"
    if text is None:
        raise unmodelled("Tensor.to(device=<int>): the current accelerator is the host's")
    _device(Global("torch", "device"), (text,), so, opcode, off)   # torch's parse errors
    kind = text.split(":", 1)[0]
    if kind in ("cpu", "meta") or restorable(text):
        return kind
    raise unmodelled(f"a device copy to {text!r} (the host's backends decide)")


def _rebuild_device_tensor_from_cpu_tensor(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                                           off: int) -> Call:
    """`data.to(dtype=dtype, device=device)`, then `tensor.requires_grad = requires_grad`:
    `to` returns `data` itself when neither dtype nor device changes, else a converted copy
    (a non-leaf if `data` requires grad)."""
    _arity("_rebuild_device_tensor_from_cpu_tensor", args, ("data", "dtype", "device", "requires_grad"))
    data, dtype_arg, device, rg = args
    if data is None or isinstance(data, (bool, int, float, str, tuple, list, dict)):
        raise Fail("AttributeError", f"'{type_name(data, so)}' object has no attribute 'to'")
    if not (_is_tensor(data) and "view" in data.attrs) or data.attrs.get("built"):
        # (the manifest lists a device copy by its data's rebuild arguments, not a BUILD's view)
        raise unmodelled("a device copy of anything but a plain dense tensor as rebuilt")
    kind = _to_device(device, dtype_arg, so, opcode, off)
    source: str = data.attrs["dtype"]
    target = _dtype_of(dtype_arg) or source
    if target in _QDTYPES:
        if kind != "cpu":   # meta: a NotImplementedError that lists this build's backends
            raise unmodelled(f"a quantized copy to a {kind} device (the build's backends decide)")
        raise Fail("RuntimeError", "empty_strided not supported on quantized tensors yet see "
                   "https://github.com/pytorch/pytorch/issues/74540")
    if source not in _CONVERTIBLE or target not in _CONVERTIBLE:
        raise unmodelled(f"a device copy from {source} to {target}")
    copied = target != source or kind != "cpu"
    if not isinstance(rg, bool):
        raise Fail("RuntimeError", "requires_grad must be a bool")
    if copied and data.attrs.get("requires_grad") and may_require_grad(target):   # autograd tracks the copy
        raise Fail("RuntimeError", _NON_LEAF if rg else _NON_LEAF_FALSE)
    if rg and not may_require_grad(target):
        raise Fail("RuntimeError", NO_GRAD_SETTER)
    if not copied and rg != bool(data.attrs.get("requires_grad")):
        # `to` returned data itself: the setter changes every other reference to it too
        raise unmodelled("a device copy that changes requires_grad of the tensor it returns unchanged")
    if copied and kind != "meta":   # `to` makes a new tensor of every element
        storage = data.attrs["view"].storage
        check_allocation(math.prod(data.attrs.get("shape") or ()), ITEMSIZE[target],
                         storage.nbytes if storage is not None else 0)
    return _tensor("torch.Tensor", target, data.attrs.get("shape"), func, args, opcode, off, rg)


def _rebuild_device_tensor_from_numpy(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                                      off: int) -> Call:
    """`torch.from_numpy(data).to(dtype=, device=)`: an ndarray needs numpy globals that a
    fresh torch does not allow; what `from_numpy` says to anything else is modelled."""
    _arity("_rebuild_device_tensor_from_numpy", args, ("data", "dtype", "device", "requires_grad"))
    data = args[0]
    if data is None or isinstance(data, (bool, int, float, str, tuple, list, dict)):
        raise Fail("TypeError", f"expected np.ndarray (got {type_name(data, so)})")
    raise unmodelled("_rebuild_device_tensor_from_numpy of an ndarray (user-allowlisted numpy)")


def _rebuild_wrapper_subclass(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str,
                              off: int) -> Call:
    """`Tensor._make_wrapper_subclass(cls, size, strides=, dtype=, storage_offset=, layout=,
    device=, requires_grad=)`: its arg parser first, then `cls` must be a Tensor subclass
    that defines `__torch_dispatch__` (measured). No class a fresh `import torch` allows
    does, so with well-typed arguments the answer is cls's; other argument shapes, and a
    user-allowlisted class (which may define it), are Unmodelled."""
    _arity("_rebuild_wrapper_subclass", args, ("cls", "dtype", "size", "stride", "storage_offset", "layout",
                                               "device", "requires_grad"))
    cls, dtype, size, stride, storage_offset, layout, device, rg = args
    offset_ok = storage_offset is None or (is_int(storage_offset) and abs(storage_offset) < INT64_SAFE)
    well_typed = (_dtype_of(dtype) in ITEMSIZE and int_seq(size) is not None and offset_ok
                  and (stride is None or int_seq(stride) is not None)
                  and isinstance(layout, Call) and layout.attrs.get("type") == "torch.layout"
                  and (device is None or isinstance(device, str) or _device_text(device) is not None)
                  and isinstance(rg, bool))
    if not well_typed:
        raise unmodelled("_make_wrapper_subclass's parsing of these arguments")
    if cls is None or isinstance(cls, (bool, int, float, str, tuple, list, dict)):
        raise Fail("TypeError", f"cls must be a type (got {type(cls).__name__})")
    if isinstance(cls, Global) and cls.full in ("torch.Tensor", "torch.nn.parameter.Parameter"):
        raise Fail("TypeError", f"{cls.name} must define __torch_dispatch__")
    if isinstance(cls, Global) and cls.full in ALLOWED_CLASSES:
        raise Fail("TypeError", "Creating a Tensor subclass from a class that does not inherit from Tensor "
                   "is not possible. Make sure your class inherits from Tensor.")
    raise unmodelled("_rebuild_wrapper_subclass of a class a fresh torch does not allow")


def _get_layout(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
    _arity("_get_layout", args, ("name",))
    name = args[0]
    if isinstance(name, str) and name in LAYOUTS:
        return _simple("torch.layout", value=name)(func, args, so, opcode, off)
    if isinstance(name, (str, int)) and not isinstance(name, bool):
        raise Fail("KeyError", repr(name))
    raise unmodelled("_get_layout of a non-string")


def _not_callable(kind: str) -> Callable[[Global, tuple[Any, ...], StorageOf, str, int], Call]:
    def fail(func: Global, args: tuple[Any, ...], so: StorageOf, opcode: str, off: int) -> Call:
        raise Fail("TypeError", f"'{kind}' object is not callable")
    return fail


_Model: TypeAlias = "Callable[[Global, tuple[Any, ...], StorageOf, str, int], Call]"
_MODELS: dict[str, _Model] = {
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "collections.OrderedDict": _ordered_dict,
    "collections.Counter": _ordered_dict,
    "builtins.set": _set,
    "builtins.complex": _complex,
    "builtins.bytearray": _bytearray,
    "_codecs.encode": _encode,
    "torch.Size": _size,
    "torch.device": _device,
    "torch.serialization._get_layout": _get_layout,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch._utils._rebuild_qtensor": _rebuild_qtensor,
    "torch._utils._rebuild_sparse_tensor": _rebuild_sparse_tensor,
    "torch._utils._rebuild_meta_tensor_no_storage": _rebuild_meta,
    "torch._utils._rebuild_device_tensor_from_cpu_tensor": _rebuild_device_tensor_from_cpu_tensor,
    "torch._utils._rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
    "torch._utils._rebuild_device_tensor_from_numpy": _rebuild_device_tensor_from_numpy,
}
ALLOWED_CLASSES = frozenset(CLASSES) | TENSOR_TYPE_GLOBALS


def call_allowed(func: Global, args: Any, storage_of: StorageOf, opcode: str, offset: int,
                 hashing: HashBudget | None = None) -> Call:
    """REDUCE of an allowlisted global: check the args as the callee would; return its result.
    `hashing`: the pickle's budget for hashing dict keys and set members (a fresh one if None)."""
    kind = global_kind(func.full)
    callable_ = kind not in ("torch.dtype", "torch.qscheme", "torch.serialization.StorageType")
    if not isinstance(args, tuple):
        # func(*args): CPython checks the star-argument before the call
        if callable_ and (args is None or isinstance(args, (bool, int, float))):
            raise Fail("TypeError", f"{_callee_label(func)} argument after * must be an iterable, not "
                       f"{type_name(args, storage_of)}")
        raise unmodelled("REDUCE arguments that are not a tuple")
    if not callable_:
        raise Fail("TypeError", f"'{kind.rsplit('.', 1)[-1] if 'Storage' in kind else kind}' object "
                   "is not callable")
    model = _MODELS.get(func.full)
    if model is None:
        raise unmodelled(f"a call of {func.full}")
    if model is _set:
        return _set(func, args, storage_of, opcode, offset, hashing)
    return model(func, args, storage_of, opcode, offset)


def _callee_label(func: Global) -> str:
    # CPython's _PyObject_FunctionStr: "module.qualname()", builtins without the module
    return f"{func.name}()" if func.module == "builtins" else f"{func.full}()"


# Hashing a tuple visits every element on every path through it, uncached: a tuple DAG
# built through the memo (each level holding the previous one twice) costs 2**depth, and
# one memoized 10k-element tuple used as a key 200k times costs 2 G. Past this many
# element visits for one pickle, torch (and we, if we hashed it) would take seconds to
# forever: ~100 M visits/s here.
HASH_VISITS_MAX = 1 << 22

HashMemo: TypeAlias = "dict[int, tuple[Any, int]]"   # id(tuple) -> (the tuple, kept alive; its visits)


class HashBudget:
    """One pickle's hashing: the tuples found hashable (walked once, however often they are
    hashed) and the element visits torch's `hash()` would make, dict keys and set members
    together. Past HASH_VISITS_MAX the pickle is Unmodelled: torch would take minutes."""

    __slots__ = ("memo", "visits")

    def __init__(self) -> None:
        self.memo: HashMemo = {}
        self.visits = 0

    def error(self, v: Any, storage_of: StorageOf, times: int = 1) -> str | None:
        """hash_error(v), charging `times` hashes of it."""
        err = hash_error(v, storage_of, memo=self.memo)
        if err is None and isinstance(v, tuple):
            self.visits += times * self.memo[id(v)][1]
            if self.visits > HASH_VISITS_MAX:
                raise unmodelled(f"dict keys and set members whose hashing visits more than "
                                 f"{HASH_VISITS_MAX} tuple elements (torch.load would take minutes "
                                 "or hang)")
        return err


def hash_error(v: Any, storage_of: StorageOf, depth: int = 0,
               memo: HashMemo | None = None) -> str | None:
    """Python's "unhashable type: 'X'" message if `hash(v)` fails in torch, else None.

    Walks each tuple of a DAG once; `memo` holds the tuples found hashable with the number
    of elements `hash()` visits for each."""
    if depth > 100:
        raise unmodelled("hash of a deeply nested tuple")
    if isinstance(v, tuple):
        if memo is None:
            memo = {}
        if id(v) in memo:
            return None
        visits = 1 + len(v)
        for x in v:
            err = hash_error(x, storage_of, depth + 1, memo)
            if err is not None:
                return err
            if isinstance(x, tuple):
                visits = min(visits + memo[id(x)][1], HASH_VISITS_MAX + 1)
        memo[id(v)] = (v, visits)
        return None
    if isinstance(v, (list, dict, set)):
        return f"unhashable type: '{type(v).__name__}'"
    if isinstance(v, Call):
        t = v.attrs.get("type")
        if t in ("collections.OrderedDict", "collections.Counter", "set", "bytearray"):
            # tp_name: C-level OrderedDict keeps its module, Python-level Counter does not
            return f"unhashable type: '{'Counter' if t == 'collections.Counter' else t}'"
        if t in ("torch.Tensor", "torch.nn.parameter.Parameter", "bytes", "complex", "torch.device",
                 "torch.layout"):
            return None
        if t == "torch.Size" or t == "functools.partial" or (isinstance(t, str) and t.startswith(
                ("numpy.dtypes.", "numpy.bool", "numpy.int", "numpy.uint", "numpy.float", "numpy.complex",
                 "numpy.longdouble", "numpy.clongdouble"))):
            return None
        if t in ("collections.defaultdict", "collections.deque", "numpy.ndarray"):
            return f"unhashable type: '{t}'"
        raise unmodelled(f"hash of a {t}")
    if isinstance(v, PersId):
        raise unmodelled("a storage used as a dict key or set member")
    return None
