"""Plain data pickled by CPython (protocols 0-5, both picklers) comes back equal from the VM."""

from __future__ import annotations

import io
import pickle
from typing import Any

import pytest

from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.values import Call, Global
from tests.core.pickles.test_vm_ops import same

PLAIN_ALL_PROTOCOLS: list[Any] = [
    0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, -(2**31), 2**31, 2**64, -(10**40), 10**4000,
    True, False, None, 0.0, -0.0, 1.5, 1e308, float("inf"), -1e-310,
    "", "a", "é€𝄞", "line\nbreak\\back\r\x1a\x00", "x" * 300, "'\"",
    [], [1, [2, [3, []]]], (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), {}, {"a": 1, 2: "b", (1, 2): [3]},
    {"k" + str(i): i for i in range(2500)}, list(range(2500)),
    {"nested": [{"x": (1.5, None, True)}, ("t", ["u", {"v": -3}])]},
]
# bytes / sets / bytearray are REDUCE calls below these protocols
BINARY_FROM: dict[type, int] = {bytes: 3, set: 4, frozenset: 4, bytearray: 5}
PLAIN_LATER: list[Any] = [b"", b"\x00\xff" * 200, {1, "a", (2, 3)}, frozenset({1, 2}), bytearray(b"ab"),
                          [b"x", {b"k": {frozenset({1})}}]]


def dumps(obj: Any, proto: int, python: bool) -> bytes:
    if python:
        buf = io.BytesIO()
        pickle._Pickler(buf, proto).dump(obj)  # type: ignore[attr-defined]
        return buf.getvalue()
    return pickle.dumps(obj, proto)


@pytest.mark.parametrize("python", [False, True], ids=["_pickle", "pickle.py"])
@pytest.mark.parametrize("proto", range(6))
def test_plain_roundtrip(proto: int, python: bool) -> None:
    for obj in PLAIN_ALL_PROTOCOLS:
        data = dumps(obj, proto, python)
        r = run_vm(data)
        assert r.complete and r.error is None and r.end == len(data)
        assert r.globals == [] and r.calls == []
        if isinstance(obj, float) and obj != obj:
            continue
        assert same(r.root, obj), (proto, obj)
        assert r.protocol == (proto if proto >= 2 else None)


@pytest.mark.parametrize("proto", range(6))
def test_binary_types_roundtrip_or_reduce(proto: int) -> None:
    for obj in PLAIN_LATER:
        data = pickle.dumps(obj, proto)
        r = run_vm(data)
        assert r.complete and r.error is None
        kinds = {type(obj)} | ({bytes, frozenset} if isinstance(obj, list) else set())
        if all(proto >= BINARY_FROM[k] for k in kinds if k in BINARY_FROM):
            assert r.root == obj and r.calls == []
        else:
            assert r.calls and all(isinstance(c.func, Global) for c in r.calls)
            assert {u.module for u in r.globals} <= {"builtins", "_codecs", "copyreg"}


def test_objects_become_calls() -> None:
    data = pickle.dumps(complex(1, 2), 2)
    r = run_vm(data)
    assert isinstance(r.root, Call) and r.root.func == Global("builtins", "complex")
    assert r.root.args == (1.0, 2.0)
    assert r.globals[0].raw_module == "__builtin__"
