"""Property tests of core.pickle.vm.run_vm: any bytes -> a result, never an exception, bounded work."""

from __future__ import annotations

import functools
import io
import math
import pickle
import zipfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core import records
from ckptguard.core.errors import FormatError, LimitExceeded
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.pickle.opcodes import BY_NAME
from ckptguard.core.pickle.result import VmResult
from ckptguard.core.pickle.vm import run_vm
from tests.builders.pickle_asm import asm

SMALL = records.replace(DEFAULT_LIMITS, max_opcodes=20_000, max_str_bytes=1 << 20, max_depth=500,
                        max_memo_entries=5_000, max_stack=20_000, max_container_items=20_000)
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(data: bytes, result: VmResult, start: int = 0) -> None:
    assert result.complete is (result.error is None)
    assert result.error is None or isinstance(result.error, (FormatError, LimitExceeded))
    assert start <= result.end <= len(data)
    assert 0 <= result.opcode_count <= SMALL.max_opcodes
    assert all(start <= u.offset < len(data) for u in result.globals)
    assert all(start <= c.offset < len(data) for c in result.calls)
    assert all(0 <= off < len(data) + 1 for _c, _m, off in result.notes)
    assert result.opcodes_used <= set(BY_NAME)


@functools.cache
def corpus() -> tuple[bytes, ...]:
    import torch

    objs: list[Any] = [
        {"a": [1, 2.5, "x", None, True], "b": (b"y", {3}, frozenset([4]))},
        [10**30, -7, "é", bytearray(b"z"), {"k": {"n": [()]}}],
        complex(1, 2),
    ]
    out = [pickle.dumps(o, p) for o in objs for p in range(6)]
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0), "h": torch.ones(2, dtype=torch.float16), "n": 3}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        out.append(zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl"))))
    out.append(asm(("PROTO", 4), ("SHORT_BINUNICODE", "os"), "MEMOIZE", ("SHORT_BINUNICODE", "system"),
                   "MEMOIZE", "STACK_GLOBAL", ("BINUNICODE", "id"), "TUPLE1", "REDUCE", ("EXT1", 3),
                   "NEXT_BUFFER", "READONLY_BUFFER", "MARK", ("INST", "a", "b"), "STOP"))
    return tuple(out)


@PROPS
@given(st.binary(max_size=2000))
def test_random_bytes_never_raise(data: bytes) -> None:
    check(data, run_vm(data, limits=SMALL))


@PROPS
@given(st.binary(max_size=300), st.integers(0, 400), st.integers(0, 2**40))
def test_random_bytes_with_start_and_base(data: bytes, start: int, base: int) -> None:
    r = run_vm(data, start=start, base_offset=base, limits=SMALL)
    assert r.start == start and (r.error is not None or r.complete)
    if r.error is not None and r.error.offset is not None:
        assert r.error.offset >= base


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(corpus())))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 9))]
        else:
            del data[pos:]
    return bytes(data)


@PROPS
@given(mutated())
def test_mutated_real_pickles_never_raise(data: bytes) -> None:
    check(data, run_vm(data, limits=SMALL))


_NO_ARG = [name for name, info in BY_NAME.items() if info.arg is None]
_ARGS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "decimalnl_short": st.tuples(st.integers(-5, 300)),
    "decimalnl_long": st.tuples(st.integers(-(10**30), 10**30)),
    "floatnl": st.tuples(st.floats(allow_nan=False)),
    "stringnl": st.tuples(st.binary(max_size=8)),
    "stringnl_noescape": st.tuples(st.sampled_from(["0", "storage", "x y"])),
    "stringnl_noescape_pair": st.tuples(st.sampled_from(["os", "builtins", "a.b", "é"]),
                                        st.sampled_from(["system", "eval", "c.d", " "])),
    "unicodestringnl": st.tuples(st.text(max_size=8)),
    "uint1": st.tuples(st.integers(0, 8)),
    "uint2": st.tuples(st.integers(0, 8)),
    "uint4": st.tuples(st.integers(0, 8) | st.just(2**32 - 1)),
    "int4": st.tuples(st.integers(-8, 8)),
    "uint8": st.tuples(st.integers(0, 64)),
    "float8": st.tuples(st.floats()),
    "long1": st.tuples(st.integers(-(2**60), 2**60)),
    "long4": st.tuples(st.integers(-(2**60), 2**60)),
}
for _kind in ("string1", "string4", "bytes1", "bytes4", "bytes8", "bytearray8"):
    _ARGS[_kind] = st.tuples(st.binary(max_size=8))
for _kind in ("unicodestring1", "unicodestring4", "unicodestring8"):
    _ARGS[_kind] = st.tuples(st.sampled_from(["os", "system", "builtins", "eval", "", "é"]))


@st.composite
def opcode_item(draw: st.DrawFn) -> str | tuple[Any, ...]:
    name = draw(st.sampled_from(sorted(BY_NAME)))
    arg = BY_NAME[name].arg
    if arg is None:
        return name
    return (name, *draw(_ARGS[arg]))


@PROPS
@given(st.lists(opcode_item(), max_size=60), st.booleans())
def test_random_opcode_programs_never_raise(items: list[Any], stop: bool) -> None:
    data = asm(*items, *(["STOP"] if stop else []))
    r = run_vm(data, limits=SMALL)
    check(data, r)
    # every GLOBAL/INST opcode that ran left a GlobalUse
    assert sum(u.opcode in ("GLOBAL", "INST") for u in r.globals) <= sum(
        1 for i in items if isinstance(i, tuple) and i[0] in ("GLOBAL", "INST"))


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: (st.lists(children, max_size=4) | st.tuples(children, children)
                      | st.dictionaries(st.text(max_size=3) | st.integers(), children, max_size=4)),
    max_leaves=20,
)


def _equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


@PROPS
@given(plain, st.integers(3, 5))
def test_plain_data_roundtrips(obj: Any, proto: int) -> None:
    r = run_vm(pickle.dumps(obj, proto))
    assert r.complete and r.calls == [] and _equal(r.root, obj)


@PROPS
@given(plain)
def test_plain_data_roundtrips_protocol0(obj: Any) -> None:
    r = run_vm(pickle.dumps(obj, 0))
    assert r.complete
    if not r.calls:                             # bytes are _codecs.encode calls below protocol 3
        assert _equal(r.root, obj)


class _Reference(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """CPython's pure-Python unpickler (the brief's reference) with nothing importable."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.seen: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.seen.append((module, name))
        return _Stub

    def persistent_load(self, pid: Any) -> Any:
        return ("pid", pid)


def _anything(*a: Any, **k: Any) -> Any:
    return _Stub()


class _Stub:
    """What every global resolves to: callable, buildable, appendable, on class and instance."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    __call__ = __setstate__ = append = extend = add = __setitem__ = _anything


@PROPS
@given(st.lists(opcode_item(), max_size=40))
def test_random_programs_agree_with_pickle_py(items: list[Any]) -> None:
    data = asm(*items, "STOP")
    try:
        ref = _Reference(data)
        expected = ref.load()
    except Exception:
        return                                  # the reference refuses: we may be more lenient
    r = run_vm(data, limits=SMALL)
    assert r.complete, r.error
    assert r.end == data.index(b".", 0) + 1 or r.end <= len(data)
    assert [(u.raw_module, u.raw_name) for u in r.globals] == ref.seen
    if not (ref.seen or r.persids or r.notes):
        assert _equal_loose(r.root, expected)


def _equal_loose(a: Any, b: Any) -> bool:
    """Equality that tolerates NaN, identical shared/cyclic containers, and Unhashable keys."""
    from ckptguard.core.values import Unhashable

    todo = [(a, b)]
    seen: set[tuple[int, int]] = set()
    while todo:
        x, y = todo.pop()
        if (id(x), id(y)) in seen:
            continue
        seen.add((id(x), id(y)))
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if not (x == y or (x != x and y != y)):
                return False
        elif isinstance(x, (list, tuple)):
            if len(x) != len(y):
                return False
            todo.extend(zip(x, y, strict=True))
        elif isinstance(x, dict):
            if len(x) != len(y) or any(isinstance(k, Unhashable) for k in x):
                return len(x) == len(y)
            if x.keys() != y.keys():
                return False
            todo.extend((x[k], y[k]) for k in x)
        elif isinstance(x, (set, frozenset)):
            if len(x) != len(y):
                return False
        elif x != y:
            return False
    return True


_CONSTS: list[tuple[Any, ...]] = [
    ("INT", 7), ("INT", True), ("BININT", -3), ("BININT1", 9), ("BININT2", 700), ("LONG", 10**20),
    ("LONG1", -(2**40)), ("LONG4", 5), ("FLOAT", 2.5), ("BINFLOAT", -0.0), ("NONE",), ("NEWTRUE",),
    ("NEWFALSE",), ("BINBYTES", b"b"), ("SHORT_BINBYTES", b""), ("BINBYTES8", b"q"),
    ("BYTEARRAY8", b"ba"), ("STRING", b"s'"), ("BINSTRING", b"t"), ("SHORT_BINSTRING", b"u"),
]
_STRS: list[tuple[Any, ...]] = [("UNICODE", "os"), ("SHORT_BINUNICODE", "system"), ("BINUNICODE", "k"),
                                ("BINUNICODE8", "builtins")]


@st.composite
def valid_program(draw: st.DrawFn) -> list[Any]:
    """A stack-aware random program that CPython's unpickler mostly accepts."""
    out: list[Any] = []
    stack: list[str] = []            # kinds: v str list dict set tuple call mark
    memo: dict[int, str] = {}

    def frame() -> list[str]:
        k = len(stack) - stack[::-1].index("mark") if "mark" in stack else 0
        return stack[k:]

    for _ in range(draw(st.integers(1, 40))):
        top = frame()
        choices = ["const", "str", "empty", "mark", "global"]
        if top:
            choices += ["put", "dup", "pop", "tuple1", "build"]
        if len(top) >= 2:
            choices += ["tuple2"]
            if top[-2:] == ["str", "str"]:
                choices.append("stack_global")
            if top[-2] in ("call", "v") and top[-1] == "tuple":
                choices += ["reduce", "newobj"]
            if top[-2] == "list":
                choices.append("append")
            if top[-2] == "set":
                choices.append("additems1")
        if len(top) >= 3 and top[-3] == "dict" and top[-2] == "str":
            choices.append("setitem")
        if "mark" in stack:
            choices += ["close", "pop_mark", "inst"]
            below = stack[: len(stack) - len(top) - 1]
            if below and below[-1] in ("list", "call"):
                choices.append("appends")
            if below and below[-1] == "set" and all(k in ("str", "v") for k in top):
                choices.append("additems")
            if top and top[0] == "call":
                choices.append("obj")
        if memo:
            choices.append("get")
        c = draw(st.sampled_from(choices))
        if c == "const":
            out.append(draw(st.sampled_from(_CONSTS)))
            stack.append("v")
        elif c == "str":
            out.append(draw(st.sampled_from(_STRS)))
            stack.append("str")
        elif c == "empty":
            name, kind = draw(st.sampled_from([("EMPTY_LIST", "list"), ("EMPTY_DICT", "dict"),
                                               ("EMPTY_SET", "set"), ("EMPTY_TUPLE", "tuple")]))
            out.append(name)
            stack.append(kind)
        elif c == "mark":
            out.append("MARK")
            stack.append("mark")
        elif c == "global":
            out.append(("GLOBAL", draw(st.sampled_from(["os", "__builtin__", "a.b"])),
                        draw(st.sampled_from(["system", "eval", "c"]))))
            stack.append("call")
        elif c == "put":
            idx = draw(st.integers(0, 5) | st.just(2**32 - 2))
            out.append(draw(st.sampled_from([("PUT", idx), ("BINPUT", idx % 256), ("LONG_BINPUT", idx),
                                             ("MEMOIZE",)])))
            key = {"PUT": idx, "BINPUT": idx % 256, "LONG_BINPUT": idx}.get(out[-1][0], len(memo))
            memo[key] = stack[-1]
        elif c == "get":
            idx = draw(st.sampled_from(sorted(memo)))
            out.append(draw(st.sampled_from([("GET", idx), ("LONG_BINGET", idx)]
                                            + ([("BINGET", idx)] if idx < 256 else []))))
            stack.append(memo[idx])
        elif c == "dup":
            out.append("DUP")
            stack.append(stack[-1])
        elif c == "pop":
            out.append("POP")
            stack.pop()
        elif c in ("tuple1", "tuple2"):
            n = int(c[-1])
            out.append(c.upper())
            del stack[-n:]
            stack.append("tuple")
        elif c == "build":
            out.append("NONE")
            out.append("BUILD")
        elif c == "stack_global":
            out.append("STACK_GLOBAL")
            stack[-2:] = ["call"]
        elif c in ("reduce", "newobj"):
            out.append(c.upper())
            stack[-2:] = ["v"]
        elif c == "append":
            out.append("APPEND")
            stack.pop()
        elif c == "additems1":
            stack.pop()
            out.extend(["POP", "MARK", ("BININT1", 1), "ADDITEMS"])
        elif c == "setitem":
            out.append("SETITEM")
            del stack[-2:]
        elif c in ("close", "pop_mark", "inst", "appends", "additems", "obj"):
            n = len(top)
            del stack[len(stack) - n - 1:]
            if c == "close":
                name, kind = draw(st.sampled_from([("TUPLE", "tuple"), ("LIST", "list")]))
                out.append(name)
                stack.append(kind)
            elif c == "pop_mark":
                out.append("POP_MARK")
            elif c == "inst":
                out.append(("INST", "m", "C"))
                stack.append("v")
            elif c == "obj":
                out.append("OBJ")
                stack.append("v")
            else:
                out.append(c.upper())
    while "mark" in stack:
        stack[len(stack) - stack[::-1].index("mark") - 1:] = ["tuple"]
        out.append("TUPLE")
    if not stack:
        out.append("NONE")
    return out


@PROPS
@given(valid_program())
def test_valid_programs_agree_with_pickle_py(items: list[Any]) -> None:
    data = asm(*items, "STOP")
    try:
        ref = _Reference(data)
        expected = ref.load()
    except Exception:
        return
    r = run_vm(data, limits=SMALL)
    assert r.complete, r.error
    assert [(u.raw_module, u.raw_name) for u in r.globals] == ref.seen
    if not ref.seen:
        assert _equal_loose(r.root, expected)
