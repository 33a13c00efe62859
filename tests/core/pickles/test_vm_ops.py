"""Every opcode, built with pickle_asm, through run_vm; plain data checked against pickle.loads."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.pickle.opcodes import BY_NAME
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.values import Buffer, Call, ExtRef, Global, PersId
from tests.builders.pickle_asm import asm, framed


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (True is not 1, b'' is not '')."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


ONE = ("BININT1", 1)
TWO = ("BININT1", 2)
THREE = ("BININT1", 3)

# Plain data: pickle.loads is the oracle for the root value.
PLAIN: dict[str, list[Any]] = {
    "INT": [("INT", 5)],
    "BININT": [("BININT", -5)],
    "BININT1": [("BININT1", 200)],
    "BININT2": [("BININT2", 60000)],
    "LONG": [("LONG", 10**30)],
    "LONG1": [("LONG1", -(2**70))],
    "LONG4": [("LONG4", 2**100)],
    "STRING": [("STRING", b"it's\n")],
    "BINSTRING": [("BINSTRING", b"abc")],
    "SHORT_BINSTRING": [("SHORT_BINSTRING", b"ab")],
    "BINBYTES": [("BINBYTES", b"\x00\xff")],
    "SHORT_BINBYTES": [("SHORT_BINBYTES", b"xy")],
    "BINBYTES8": [("BINBYTES8", b"z")],
    "BYTEARRAY8": [("BYTEARRAY8", b"ba")],
    "NONE": ["NONE"],
    "NEWTRUE": ["NEWTRUE"],
    "NEWFALSE": ["NEWFALSE"],
    "UNICODE": [("UNICODE", "é\n\\€")],
    "SHORT_BINUNICODE": [("SHORT_BINUNICODE", "é")],
    "BINUNICODE": [("BINUNICODE", "\udc80x")],      # surrogatepass, like torch
    "BINUNICODE8": [("BINUNICODE8", "€")],
    "FLOAT": [("FLOAT", -1.25)],
    "BINFLOAT": [("BINFLOAT", 1e-300)],
    "EMPTY_LIST": ["EMPTY_LIST"],
    "APPEND": ["EMPTY_LIST", ONE, "APPEND"],
    "APPENDS": ["EMPTY_LIST", "MARK", ONE, TWO, "APPENDS"],
    "LIST": ["MARK", ONE, TWO, "LIST"],
    "EMPTY_TUPLE": ["EMPTY_TUPLE"],
    "TUPLE": ["MARK", ONE, TWO, THREE, "TUPLE"],
    "TUPLE1": [ONE, "TUPLE1"],
    "TUPLE2": [ONE, TWO, "TUPLE2"],
    "TUPLE3": [ONE, TWO, THREE, "TUPLE3"],
    "EMPTY_DICT": ["EMPTY_DICT"],
    "DICT": ["MARK", ("BINUNICODE", "a"), ONE, ONE, TWO, "DICT"],
    "SETITEM": ["EMPTY_DICT", ("BINUNICODE", "a"), ONE, "SETITEM"],
    "SETITEMS": ["EMPTY_DICT", "MARK", ("BINUNICODE", "a"), ONE, TWO, THREE, "SETITEMS"],
    "EMPTY_SET": ["EMPTY_SET"],
    "ADDITEMS": ["EMPTY_SET", "MARK", ONE, TWO, "ADDITEMS"],
    "FROZENSET": ["MARK", ONE, TWO, "FROZENSET"],
    "POP": [ONE, TWO, "POP"],
    "DUP": [ONE, "DUP", "TUPLE2"],
    "MARK": ["MARK", "TUPLE"],
    "POP_MARK": [ONE, "MARK", TWO, THREE, "POP_MARK"],
    "GET": ["EMPTY_LIST", ("PUT", 3), "POP", ("GET", 3)],
    "PUT": [ONE, ("PUT", 0), "POP", ("GET", 0)],
    "BINGET": [ONE, ("BINPUT", 7), TWO, "POP", ("BINGET", 7), "TUPLE2"],
    "BINPUT": ["EMPTY_LIST", ("BINPUT", 1), ("BINGET", 1), "APPEND"],   # a cycle
    "LONG_BINGET": [ONE, ("LONG_BINPUT", 70000), "POP", ("LONG_BINGET", 70000)],
    "LONG_BINPUT": [ONE, ("LONG_BINPUT", 2**32 - 1), "POP", ("LONG_BINGET", 2**32 - 1)],
    "MEMOIZE": [ONE, "MEMOIZE", TWO, "MEMOIZE", "POP", "POP", ("BINGET", 1)],
    "PROTO": [("PROTO", 5), "NONE"],
    "STOP": ["NONE"],
    "FRAME": [("PROTO", 4), ("RAW", framed(asm(ONE, "TUPLE1")))],
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_opcode_matches_pickle_loads(name: str) -> None:
    data = asm(*PLAIN[name], "STOP")
    r = run_vm(data)
    assert r.error is None and r.complete and r.end == len(data)
    assert name in r.opcodes_used
    expected = pickle._loads(data)   # type: ignore[attr-defined]  # the reference (_pickle's memo is an array)
    if name == "BINPUT":            # a self-containing list: compare the shape
        assert type(r.root) is list and r.root[0] is r.root
    else:
        assert same(r.root, expected), (r.root, expected)
    assert r.globals == [] and r.calls == [] and r.notes == []


def g(mod: str, name: str) -> tuple[str, str, str]:
    return ("GLOBAL", mod, name)


def test_global_and_reduce() -> None:
    r = run_vm(asm(("PROTO", 3), g("os", "system"), ("BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP"))
    (use,) = r.globals
    assert (use.module, use.name, use.raw_module, use.raw_name, use.opcode, use.offset) == (
        "os", "system", "os", "system", "GLOBAL", 2)
    (call,) = r.calls
    assert r.root is call and call.func == Global("os", "system") and call.args == ("id",)
    assert call.opcode == "REDUCE" and call.offset == len(asm(("PROTO", 3), g("os", "system"),
                                                                ("BINUNICODE", "id"), "TUPLE1"))
    assert {"PROTO", "GLOBAL", "BINUNICODE", "TUPLE1", "REDUCE", "STOP"} == r.opcodes_used
    assert r.protocol == 3 and r.opcode_count == 6


def test_stack_global() -> None:
    r = run_vm(asm(("PROTO", 4), ("SHORT_BINUNICODE", "builtins"), ("SHORT_BINUNICODE", "eval"),
                   "STACK_GLOBAL", "STOP"))
    assert r.root == Global("builtins", "eval")
    uses = [(u.module, u.name, u.opcode, u.offset) for u in r.globals]
    assert uses == [("builtins", "eval", "STACK_GLOBAL", 18)]


def test_build_setitems_appends_on_call() -> None:
    data = asm(g("collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
               ("BINUNICODE", "k"), ONE, "SETITEM",
               "MARK", ("BINUNICODE", "k2"), TWO, "SETITEMS",
               ONE, "APPEND", "MARK", TWO, THREE, "APPENDS",
               "MARK", THREE, "ADDITEMS",
               "EMPTY_DICT", "BUILD", ("BINUNICODE", "s"), "BUILD", "STOP")
    r = run_vm(data)
    call = r.root
    assert isinstance(call, Call) and r.error is None
    assert call.setitems == [("k", 1), ("k2", 2)]
    assert call.appends == [1, 2, 3, 3]
    assert call.state == [{}, "s"]


def test_inst_obj_newobj_newobj_ex() -> None:
    r = run_vm(asm("MARK", ONE, ("INST", "subprocess", "Popen"), "STOP"))
    (call,) = r.calls
    assert call.opcode == "INST" and call.func == Global("subprocess", "Popen") and call.args == (1,)
    assert r.globals[0].opcode == "INST"

    r = run_vm(asm("MARK", g("os", "system"), ("BINUNICODE", "id"), "OBJ", "STOP"))
    (call,) = r.calls
    assert call.opcode == "OBJ" and call.func == Global("os", "system") and call.args == ("id",)

    r = run_vm(asm(("PROTO", 2), g("copy_reg", "_reconstructor"), ONE, "TUPLE1", "NEWOBJ", "STOP"))
    (call,) = r.calls
    assert call.opcode == "NEWOBJ" and call.func == Global("copyreg", "_reconstructor")

    r = run_vm(asm(("PROTO", 4), g("m", "C"), "EMPTY_TUPLE", "EMPTY_DICT", ("BINUNICODE", "a"), ONE,
                   "SETITEM", "NEWOBJ_EX", "STOP"))
    (call,) = r.calls
    assert call.opcode == "NEWOBJ_EX" and call.args == () and call.kwargs == {"a": 1}
    assert r.opcodes_used >= {"NEWOBJ_EX", "SETITEM"}


def test_persid_binpersid() -> None:
    r = run_vm(asm(("PERSID", "storage0"), "STOP"))
    assert isinstance(r.root, PersId) and r.root.pid == "storage0" and r.persids == [r.root]
    r = run_vm(asm("MARK", ("BINUNICODE", "storage"), ONE, "TUPLE", "BINPERSID", "STOP"))
    assert isinstance(r.root, PersId) and r.root.pid == ("storage", 1) and r.root.offset == 16
    assert r.persids == [r.root]


@pytest.mark.parametrize(("name", "code"), [("EXT1", 5), ("EXT2", 600), ("EXT4", 70000)])
def test_ext(name: str, code: int) -> None:
    r = run_vm(asm(("PROTO", 2), (name, code), "STOP"))
    assert isinstance(r.root, ExtRef) and r.root.code == code and r.root.offset == 2
    assert r.notes == [(Code.PICKLE_EXTENSION_CODE, f"extension code {code}", 2)]


def test_buffers() -> None:
    r = run_vm(asm(("PROTO", 5), "NEXT_BUFFER", "STOP"))
    assert isinstance(r.root, Buffer) and not r.root.readonly
    r = run_vm(asm(("PROTO", 5), "NEXT_BUFFER", "READONLY_BUFFER", "STOP"))
    assert isinstance(r.root, Buffer) and r.root.readonly and r.root.offset == 2
    assert [n[0] for n in r.notes] == [Code.PICKLE_OUT_OF_BAND_BUFFER] * 2
    r = run_vm(asm(("BYTEARRAY8", b"x"), "READONLY_BUFFER", "STOP"))
    assert r.root == bytearray(b"x")         # not copied (a memo'd one could be re-made read-only often)


def test_every_opcode_is_exercised() -> None:
    covered = set(PLAIN) | {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ",
                            "NEWOBJ_EX", "PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER",
                            "READONLY_BUFFER"}
    assert covered == set(BY_NAME)


def test_base_offset_and_start() -> None:
    body = asm(g("os", "system"), "STOP")
    data = b"junk" + body + b"trailer"
    r = run_vm(data, start=4, base_offset=1000)
    assert r.complete and r.start == 4 and r.end == 4 + len(body)
    assert r.globals[0].offset == 1004


def test_unhashable_keys_wrapped() -> None:
    from ckptguard.core.values import Unhashable

    r = run_vm(asm("EMPTY_DICT", "EMPTY_LIST", ONE, "SETITEM", "MARK", "EMPTY_LIST", "FROZENSET", "TUPLE1",
                   "STOP"))
    assert r.error is None
    root = r.root
    assert isinstance(root, tuple) and isinstance(root[0], frozenset)
    (member,) = root[0]
    assert isinstance(member, Unhashable) and member.value == []
    r = run_vm(asm("EMPTY_DICT", "EMPTY_LIST", "TUPLE1", ONE, "SETITEM", "STOP"))
    ((k, v),) = r.root.items()
    assert isinstance(k, Unhashable) and k.value == ([],) and v == 1


def test_python2_names_mapped_by_protocol() -> None:
    r = run_vm(asm(("PROTO", 2), g("__builtin__", "eval"), g("copy_reg", "_reconstructor"),
                   g("__builtin__", "xrange"), "STOP"))
    assert [(u.module, u.name) for u in r.globals] == [
        ("builtins", "eval"), ("copyreg", "_reconstructor"), ("builtins", "range")]
    assert r.globals[0].raw_module == "__builtin__"
    r = run_vm(asm(g("__builtin__", "eval"), "STOP"))          # no PROTO: protocol 0
    assert r.globals[0].module == "builtins" and r.protocol is None
    r = run_vm(asm(("PROTO", 3), g("__builtin__", "eval"), "STOP"))
    assert r.globals[0].module == "__builtin__"


def test_gc_state_restored() -> None:
    import gc

    assert gc.isenabled()
    run_vm(b"N.")
    run_vm(b"\xff")                 # error path too
    assert gc.isenabled()
    gc.disable()
    try:
        run_vm(b"N.")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_memoryview_and_bytearray_input() -> None:
    assert run_vm(memoryview(b"xxK\x05."), start=2).root == 5
    assert run_vm(bytearray(b"K\x05.")).root == 5  # type: ignore[arg-type]
