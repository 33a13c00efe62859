"""Obfuscated imports (issue 18, item 3): a STACK_GLOBAL whose module or name is computed by
calls is folded to the constant it evaluates to and judged as if written; one that cannot
be folded is PICKLE_COMPUTED_IMPORT (unsafe). Every resolved case is checked against
CPython's own unpickler, run with a find_class that hands out only the pure functions the
expression uses and records the global the STACK_GLOBAL finally imports."""

from __future__ import annotations

import base64
import importlib
import pickle
import zlib
from typing import Any

import pytest

from ckptguard.core.errors import Code
from tests.builders.pickle_asm import asm


def codes(an: Any) -> set[Code]:
    return {f.code for f in an.findings}


def messages(an: Any, code: Code) -> str:
    return "\n".join(f.message for f in an.findings if f.code == code)


def g(module: str, name: str) -> list[Any]:
    """A global pushed by STACK_GLOBAL from literal operands."""
    return [("SHORT_BINUNICODE", module), ("SHORT_BINUNICODE", name), "STACK_GLOBAL"]


def call(func: list[Any], *args: list[Any]) -> list[Any]:
    return [*func, "MARK", *[i for a in args for i in a], "TUPLE", "REDUCE"]


def s(text: str) -> list[Any]:
    return [("SHORT_BINUNICODE", text)]


def b(data: bytes) -> list[Any]:
    return [("SHORT_BINBYTES", data)]


def i(n: int) -> list[Any]:
    return [("BININT", n)]


def lst(*items: list[Any]) -> list[Any]:
    return ["EMPTY_LIST", "MARK", *[x for it in items for x in it], "APPENDS"]


def importing(module: list[Any], name: list[Any]) -> bytes:
    """STACK_GLOBAL(module, name)('id'): the computed global is called."""
    return asm(("PROTO", 4), *module, *name, "STACK_GLOBAL", ("SHORT_BINUNICODE", "id"), "TUPLE1",
               "REDUCE", "STOP")


def method(recv: list[Any], name: str, *args: list[Any]) -> list[Any]:
    """recv.name(*args) as getattr(recv, name)(*args)."""
    return call(call(g("builtins", "getattr"), recv, s(name)), *args)


B64_OS = method(call(g("base64", "b64decode"), b(base64.b64encode(b"os"))), "decode")

RESOLVED = {
    "b64decode-decode": (B64_OS, s("system"), ("os", "system")),
    "rot13": (call(g("codecs", "decode"), s("bf"), s("rot13")),
              method(s(""), "join", call(g("builtins", "reversed"), s("metsys"))),
              ("os", "system")),
    "fromhex-methodcaller": (call(call(g("operator", "methodcaller"), s("decode")),
                                  call(g("builtins", "bytes.fromhex"), s(b"subprocess".hex()))),
                             s("getoutput"), ("subprocess", "getoutput")),
    "str-format": (call(g("builtins", "str.format"), s("{}{}"), s("o"), s("s")),
                   call(g("_operator", "add"), s("sys"), s("tem")), ("os", "system")),
    "percent": (call(g("operator", "mod"), s("%s%s"), ["MARK", *s("o"), *s("s"), "TUPLE"]),
                s("popen"), ("os", "popen")),
    "zlib": (method(call(g("zlib", "decompress"), b(zlib.compress(b"builtins"))), "decode"),
             s("exec"), ("builtins", "exec")),
    "unhexlify-codecs": (call(g("_codecs", "decode"), call(g("binascii", "unhexlify"), s("6f73")),
                              s("latin-1")), s("system"), ("os", "system")),
    "ascii-lowercase-slices": (call(g("operator", "add"),
                                    call(g("operator", "getitem"), g("string", "ascii_lowercase"),
                                         call(g("builtins", "slice"), i(14), i(15))),
                                    call(g("operator", "getitem"), g("string", "ascii_lowercase"),
                                         call(g("builtins", "slice"), i(18), i(19)))),
                               s("system"), ("os", "system")),
    "attrgetter-lower": (call(call(call(g("operator", "attrgetter"), s("lower")), s("OS"))),
                         s("system"), ("os", "system")),
    "map-chr": (method(s(""), "join", call(g("builtins", "map"), g("builtins", "chr"),
                                           lst(i(111), i(115)))), s("system"), ("os", "system")),
    "reduce-add": (call(g("functools", "reduce"), g("operator", "add"), lst(s("p"), s("t"), s("y"))),
                   s("spawn"), ("pty", "spawn")),
    "partial-replace": (call(call(g("functools", "partial"), g("builtins", "str.replace"),
                                  s("oXs")), s("X"), s("")), s("system"), ("os", "system")),
    "slice-reverse": (call(g("operator", "getitem"), s("so"),
                           call(g("builtins", "slice"), ["NONE"], ["NONE"], i(-1))),
                      s("system"), ("os", "system")),
}


def cpython_import(data: bytes) -> tuple[str, str]:
    """What CPython's unpickler imports last, handing out only pure stdlib functions."""
    pure = {("base64", "b64decode"), ("codecs", "decode"), ("_codecs", "decode"),
            ("builtins", "reversed"), ("builtins", "getattr"), ("operator", "methodcaller"),
            ("builtins", "bytes.fromhex"), ("builtins", "str.format"), ("_operator", "add"),
            ("operator", "mod"), ("zlib", "decompress"), ("binascii", "unhexlify"),
            ("operator", "add"), ("operator", "getitem"), ("string", "ascii_lowercase"),
            ("builtins", "slice"), ("operator", "attrgetter"), ("builtins", "map"),
            ("builtins", "chr"), ("functools", "reduce"), ("functools", "partial"),
            ("builtins", "str.replace")}
    seen: list[tuple[str, str]] = []

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in pure:
                obj: Any = importlib.import_module(module)
                for part in name.split("."):
                    obj = getattr(obj, part)
                return obj
            seen.append((module, name))
            return lambda *a: None

    import io
    Recorder(io.BytesIO(data)).load()
    assert len(seen) == 1, seen
    return seen[0]


@pytest.mark.parametrize("case", sorted(RESOLVED))
def test_computed_import_is_resolved_and_judged(judge: Any, case: str) -> None:
    module, name, expected = RESOLVED[case]
    data = importing(module, name)
    assert cpython_import(data) == expected          # the fold's answer is CPython's
    an, verdict = judge(data)
    assert verdict == "unsafe", [f.message for f in an.findings]
    assert an.globals[expected].status == "dangerous"
    assert Code.PICKLE_COMPUTED_GLOBAL in codes(an)
    assert Code.PICKLE_COMPUTED_IMPORT not in codes(an)
    assert f"resolved to {expected[0]}.{expected[1]}" in messages(an, Code.PICKLE_COMPUTED_GLOBAL)


def test_the_resolved_name_is_reported_in_the_dangerous_call(judge: Any) -> None:
    an, _ = judge(importing(B64_OS, s("system")))
    assert "calls os.system('id')" in messages(an, Code.PICKLE_DANGEROUS_CALL)
    assert "base64.b64decode(b'b3M=')" in messages(an, Code.PICKLE_COMPUTED_GLOBAL)


def test_resolved_to_a_benign_global_is_not_unsafe(judge: Any) -> None:
    """Folding names what the pickle imports; it does not by itself make the file unsafe."""
    data = importing(call(g("codecs", "decode"), s("pbyyrpgvbaf"), s("rot13")), s("OrderedDict"))
    an, verdict = judge(data)
    assert cpython_import(data) == ("collections", "OrderedDict")
    assert verdict == "suspicious" and an.globals[("collections", "OrderedDict")].status != "dangerous"


def test_non_str_result_is_refused_by_pickle_not_an_import(judge: Any) -> None:
    """codecs.decode('6f73', 'hex') is bytes: pickle raises "STACK_GLOBAL requires str"."""
    data = importing(call(g("binascii", "unhexlify"), s("6f73")), s("system"))
    with pytest.raises(pickle.UnpicklingError, match="STACK_GLOBAL requires str"):
        cpython_refuses(data)
    an, _ = judge(data)
    assert Code.PICKLE_COMPUTED_IMPORT not in codes(an)
    assert "not str (pickle refuses it)" in messages(an, Code.PICKLE_NON_ASCII_GLOBAL)


def cpython_refuses(data: bytes) -> None:
    class Pure(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == ("binascii", "unhexlify"):
                import binascii
                return binascii.unhexlify
            raise AssertionError(f"imported {module}.{name}")

    import io
    Pure(io.BytesIO(data)).load()


UNRESOLVED = {
    "unknown-function": (call(g("mylib.codec", "decode"), s("b3M=")), "mylib.codec.decode"),
    "persistent-id": (["MARK", *s("x"), "TUPLE", "BINPERSID"], "persistent id"),
    "imported-object": (g("os", "name"), "os.name"),
    "set-order": (method(s(""), "join", ["MARK", *s("o"), *s("s"), "FROZENSET"]), "frozenset"),
    "size-cap": (call(g("operator", "mul"), s("o"), i(10**6)), "size cap"),
    "ext-code": ([("EXT1", 5)], "extension code"),
}


@pytest.mark.parametrize("case", sorted(UNRESOLVED))
def test_unresolvable_computed_import_is_unsafe(judge: Any, case: str) -> None:
    module, what = UNRESOLVED[case]
    an, verdict = judge(importing(module, s("system")))
    assert verdict == "unsafe"
    assert Code.PICKLE_COMPUTED_IMPORT in codes(an), (what, [f.message for f in an.findings])
    assert "cannot be resolved statically" in messages(an, Code.PICKLE_COMPUTED_IMPORT)


def test_list_changed_by_an_earlier_call_is_not_folded(judge: Any) -> None:
    """l = list('collections'); list.__setitem__(l, slice(None), ['o', 's']); ''.join(l):
    folding l as written would name a benign module; the call may have changed it."""
    letters = lst(*[s(c) for c in "collections"])
    data = asm(("PROTO", 4), *letters, ("BINPUT", 1), "POP",
               *call(g("builtins", "list.__setitem__"), [("BINGET", 1)],
                     call(g("builtins", "slice"), ["NONE"]), lst(s("o"), s("s"))), "POP",
               *method(s(""), "join", [("BINGET", 1)]), ("SHORT_BINUNICODE", "OrderedDict"),
               "STACK_GLOBAL", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and Code.PICKLE_COMPUTED_IMPORT in codes(an)
    assert ("collections", "OrderedDict") not in an.globals


def test_list_appended_after_the_call_is_not_folded(judge: Any) -> None:
    """''.join(l) ran when REDUCE did; an APPEND to the memoized l afterwards changes what a
    fold at STACK_GLOBAL time would see, not what the real call returned."""
    join = [*call(g("builtins", "getattr"), s(""), s("join")), ("BINGET", 1), "TUPLE1", "REDUCE"]
    data = asm(("PROTO", 4), *lst(s("o")), ("BINPUT", 1), "POP", *join, ("BINPUT", 2), "POP",
               ("BINGET", 1), ("SHORT_BINUNICODE", "s"), "APPEND", "POP",
               ("BINGET", 2), ("SHORT_BINUNICODE", "system"), "STACK_GLOBAL", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and Code.PICKLE_COMPUTED_IMPORT in codes(an)
    assert ("os", "system") not in an.globals          # CPython imports o.system


def test_nested_pickle_behind_a_decoder_is_judged(judge: Any) -> None:
    """pickle.loads(base64.b64decode(b'...')): the inner payload is folded out and judged."""
    inner = asm(("PROTO", 2), ("GLOBAL", "subprocess", "getoutput"), ("BINUNICODE", "id"),
                "TUPLE1", "REDUCE", "STOP")
    data = asm(("PROTO", 4), *call(g("pickle", "loads"),
                                   call(g("base64", "b64decode"), [("BINBYTES", base64.b64encode(inner))])),
               "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert an.globals[("subprocess", "getoutput")].status == "dangerous"


def test_getattr_with_a_computed_name_is_resolved(judge: Any) -> None:
    """getattr(__import__('os'), b'c3lzdGVt'.decode()) names os.system in the call finding."""
    name = method(call(g("base64", "b64decode"), b(b"c3lzdGVt")), "decode")
    data = asm(("PROTO", 4), *call(call(g("builtins", "getattr"), call(g("builtins", "__import__"),
                                                                      s("os")), name), s("id")),
               "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert "callable computed by another call: os.system" in messages(an, Code.PICKLE_DANGEROUS_CALL)
