"""Property tests of core.vm.run_vm: any bytes -> a result, never an exception, bounded work."""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import pickle
import zipfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import FormatError, LimitExceeded
from core.limits import DEFAULT_LIMITS
from core.opcodes import BY_NAME
from core.vm import VmResult, run_vm
from tests.pickle_asm import asm

SMALL = dataclasses.replace(DEFAULT_LIMITS, max_opcodes=20_000, max_str_bytes=1 << 20, max_depth=500,
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
