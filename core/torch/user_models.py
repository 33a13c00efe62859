"""Callables a user allowlists (`torch.serialization.add_safe_globals`) whose effect we modelled.

numpy's dtypes, arrays and scalars (what `np.random.get_state()` and numpy values in a
checkpoint pickle), `collections.defaultdict`/`deque` and `functools.partial`: the result's
type and which BUILD states torch's unpickler would apply to it. Split from
core.torch.callables (torch's own allowlisted callables), which dispatches here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ckptguard.core.torch.rules import StorageOf, is_int, unmodelled
from ckptguard.core.values import Call, Global

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

# -- user-allowlisted callables whose result type we know (numpy, collections, functools) --
# numpy 2.x (the version next to torch 2.13 here): `type(np.dtype(spec))` for the spec strings
# numpy's own `dtype.__reduce__` writes, with an optional byte-order prefix; the scalar type
# `numpy._core.multiarray.scalar(dtype, bytes)` makes; the itemsize. Measured
# (tests/core/torch_rules/test_numpy_vs_torch.py checks the table against numpy).
NUMPY_DTYPES: dict[str, tuple[str, str, int]] = {
    "b1": ("BoolDType", "numpy.bool", 1),
    "i1": ("Int8DType", "numpy.int8", 1), "i2": ("Int16DType", "numpy.int16", 2),
    "i4": ("Int32DType", "numpy.int32", 4), "i8": ("Int64DType", "numpy.int64", 8),
    "u1": ("UInt8DType", "numpy.uint8", 1), "u2": ("UInt16DType", "numpy.uint16", 2),
    "u4": ("UInt32DType", "numpy.uint32", 4), "u8": ("UInt64DType", "numpy.uint64", 8),
    "f2": ("Float16DType", "numpy.float16", 2), "f4": ("Float32DType", "numpy.float32", 4),
    "f8": ("Float64DType", "numpy.float64", 8), "f16": ("LongDoubleDType", "numpy.longdouble", 16),
    "c8": ("Complex64DType", "numpy.complex64", 8), "c16": ("Complex128DType", "numpy.complex128", 16),
    "c32": ("CLongDoubleDType", "numpy.clongdouble", 32),
    "O": ("ObjectDType", "", 8), "O8": ("ObjectDType", "", 8),
    "M8": ("DateTime64DType", "", 8), "m8": ("TimeDelta64DType", "", 8),
}
_FLEXIBLE = {"S": "BytesDType", "U": "StrDType", "V": "VoidDType"}
_NUMPY_SPEC = re.compile(r"([<>|=]?)([SUV])([0-9]{1,6})|([<>|=]?)([a-zA-Z][0-9]{0,2})")
NUMPY_RECONSTRUCT = frozenset(("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct"))
NUMPY_SCALAR = frozenset(("numpy._core.multiarray.scalar", "numpy.core.multiarray.scalar"))


def numpy_dtype_class(spec: Any) -> str | None:
    """`numpy.dtypes.X` for `type(numpy.dtype(spec))`; None for a spec not in the table."""
    m = _NUMPY_SPEC.fullmatch(spec) if isinstance(spec, str) and spec.isascii() else None
    if m is None:
        return None
    if m.group(2):
        return f"numpy.dtypes.{_FLEXIBLE[m.group(2)]}"
    entry = NUMPY_DTYPES.get(m.group(5))
    return f"numpy.dtypes.{entry[0]}" if entry else None


def _user_numpy_dtype(func: Global, args: tuple[Any, ...], so: StorageOf) -> Call | None:
    # numpy.dtype(spec[, align[, copy]]): numpy writes (spec, False, True)
    if not 1 <= len(args) <= 3 or not all(isinstance(a, bool) for a in args[1:]):
        return None
    cls = numpy_dtype_class(args[0])
    if cls is None:
        return None
    c = Call(func, args, "REDUCE", -1)
    m = _NUMPY_SPEC.fullmatch(args[0])
    assert m is not None
    entry = NUMPY_DTYPES.get(m.group(5) or "")
    # the (elsize, alignment, flags) numpy writes in the BUILD state (datetimes: not modelled)
    size = int(m.group(3)) if m.group(2) else -1
    tail = {"S": (size, 1, 0), "U": (4 * size, 4, 8), "V": (size, 1, 0)}.get(m.group(2) or "")
    if entry and entry[1]:
        tail = (-1, -1, 0)
    elif cls == "numpy.dtypes.ObjectDType":
        tail = (-1, -1, 63)
    c.attrs.update(type=cls, build="state", scalar=entry[1] if entry else "",
                   itemsize=entry[2] if entry else tail[0] if tail else None, tail=tail)
    return c


def _user_reconstruct(func: Global, args: tuple[Any, ...], so: StorageOf) -> Call | None:
    # numpy's ndarray.__reduce__: _reconstruct(ndarray, (0,), b'b'); BUILD then sets the data
    # (numpy writes shape (0,) and dtype b'b'; others are left unmodelled: numpy refuses
    # dtypes it does not understand and arrays too big for memory)
    if (len(args) == 3 and isinstance(args[0], Global) and args[0].full == "numpy.ndarray"
            and args[1] == (0,) and isinstance(args[2], Call)
            and args[2].attrs.get("type") == "bytes" and args[2].attrs.get("value") == b"b"):
        c = Call(func, args, "REDUCE", -1)
        c.attrs.update(type="numpy.ndarray", build="state")
        return c
    return None


def _user_scalar(func: Global, args: tuple[Any, ...], so: StorageOf) -> Call | None:
    # numpy's scalar.__reduce__: scalar(dtype, raw bytes) for fixed-size numeric types
    if len(args) != 2 or not isinstance(args[0], Call) or not args[0].attrs.get("scalar"):
        return None
    raw = args[1]
    if not (isinstance(raw, Call) and raw.attrs.get("type") == "bytes"
            and len(raw.attrs.get("value", b"")) == args[0].attrs.get("itemsize")):
        return None
    c = Call(func, args, "REDUCE", -1)
    c.attrs.update(type=args[0].attrs["scalar"])
    return c


def user_model(func: Global, args: Any, callables: Callable[[Any], bool], so: StorageOf) -> Call | None:
    """The result of a user-allowlisted callable we have measured, else None.

    `callables(v)` says whether `v` is a global torch can call (a class or function). The
    result's attrs: "type" (what `type(result)` prints), "build": "state" when BUILD
    (`__setstate__`) accepts the state numpy writes, "partial" for functools.partial's own
    check; no "build" when BUILD on it is not modelled.
    """
    if not isinstance(args, tuple):
        return None
    full = func.full
    if full == "numpy.dtype":
        return _user_numpy_dtype(func, args, so)
    if full in NUMPY_RECONSTRUCT:
        return _user_reconstruct(func, args, so)
    if full in NUMPY_SCALAR:
        return _user_scalar(func, args, so)
    c = Call(func, args, "REDUCE", -1)
    if full == "collections.defaultdict" and len(args) <= 1 and (not args or args[0] is None
                                                                  or callables(args[0])):
        c.attrs.update(type="collections.defaultdict")
        return c
    if full == "collections.deque" and len(args) <= 2 and (
            not args or isinstance(args[0], (list, tuple))) and (
            len(args) < 2 or args[1] is None or (is_int(args[1]) and 0 <= args[1] < 1 << 62)):
        c.attrs.update(type="collections.deque")
        return c
    if full == "functools.partial" and args and callables(args[0]):
        c.attrs.update(type="functools.partial", build="partial")
        return c
    return None


def check_partial_state(state: Any, callables: Callable[[Any], bool]) -> None:
    """`functools.partial.__setstate__`: only the state CPython itself writes is modelled."""
    if not (isinstance(state, tuple) and len(state) == 4 and callables(state[0])
            and isinstance(state[1], tuple) and (state[2] is None or isinstance(state[2], dict))
            and (state[3] is None or isinstance(state[3], dict))
            and all(isinstance(k, str) for d in state[2:] if d for k in d)):
        raise unmodelled("functools.partial BUILD with this state")


_NUMPY_MAX_DIMS = 64
_NUMPY_MAX_BYTES = 1 << 62


def check_numpy_state(inst: Call, state: Any) -> None:
    """`__setstate__` of a numpy dtype / ndarray: only the states numpy itself writes."""
    t = inst.attrs.get("type")
    if t == "numpy.ndarray":
        # numpy's limits: at most 64 dimensions, no array past the address space
        if (isinstance(state, tuple) and len(state) == 5 and state[0] == 1 and type(state[0]) is int
                and isinstance(state[1], tuple) and len(state[1]) <= _NUMPY_MAX_DIMS
                and all(is_int(x) and 0 <= x < 1 << 31 for x in state[1])
                and isinstance(state[2], Call) and isinstance(state[3], bool)):
            numel = 1
            for x in state[1]:
                numel *= x
            dt, data = state[2].attrs, state[4]
            if dt.get("type") == "numpy.dtypes.ObjectDType":
                # object arrays pickle their items as a list; raw bytes would be pointers
                if type(data) is list and len(data) == numel:
                    return
            elif (dt.get("tail") and isinstance(data, Call) and data.attrs.get("type") == "bytes"
                    and len(data.attrs.get("value", b"")) == numel * dt["itemsize"]
                    and numel * dt["itemsize"] < _NUMPY_MAX_BYTES):
                return
        raise unmodelled("ndarray BUILD with this state")
    if (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and type(state[0]) is int
            and state[1] in ("<", ">", "|", "=") and state[2:5] == (None, None, None)
            and inst.attrs.get("tail") is not None and state[5:] == inst.attrs["tail"]
            and all(type(x) is int for x in state[5:])):
        return
    raise unmodelled(f"BUILD of a {t} with this state")
