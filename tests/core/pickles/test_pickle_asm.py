"""tests/pickle_asm.py itself: every opcode assembles to what pickletools decodes."""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

import pytest

from tests.builders.pickle_asm import OPCODES, asm, framed, op

# One sample argument per pickletools argument kind, and what genops decodes it to.
SAMPLES: dict[str, tuple[tuple[Any, ...], Any]] = {
    "decimalnl_short": ((123,), 123),
    "decimalnl_long": ((10**30,), 10**30),
    "floatnl": ((1.5,), 1.5),
    "stringnl": ((b"a'b\n\x00",), "a'b\n\x00"),
    "stringnl_noescape": (("pid",), "pid"),
    "stringnl_noescape_pair": (("os", "system"), "os system"),
    "unicodestringnl": (("é\\\n\r\x1a\x00z",), "é\\\n\r\x1a\x00z"),
    "uint1": ((200,), 200),
    "uint2": ((60000,), 60000),
    "uint4": ((4_000_000_000,), 4_000_000_000),
    "int4": ((-5,), -5),
    "uint8": ((2**40,), 2**40),
    "float8": ((-2.25,), -2.25),
    "long1": ((-(2**70),), -(2**70)),
    "long4": ((2**100,), 2**100),
    "string1": ((b"ab",), "ab"),
    "string4": ((b"abc",), "abc"),
    "bytes1": ((b"\x00\xff",), b"\x00\xff"),
    "bytes4": ((b"xyz",), b"xyz"),
    "bytes8": ((b"q",), b"q"),
    "bytearray8": ((b"ba",), bytearray(b"ba")),
    "unicodestring1": (("é",), "é"),
    "unicodestring4": (("€",), "€"),
    "unicodestring8": (("x",), "x"),
}


def test_table_matches_pickletools() -> None:
    assert {o.name for o in pickletools.opcodes} == set(OPCODES)
    for o in pickletools.opcodes:
        assert op(o.name) == o.code.encode("latin-1")


@pytest.mark.parametrize("name", sorted(OPCODES))
def test_every_opcode_roundtrips_through_genops(name: str) -> None:
    _code, kind, _proto = OPCODES[name]
    if kind is None:
        data = asm(name, "STOP") if name != "STOP" else asm("STOP")
        ops = list(pickletools.genops(data))
        assert ops[0][0].name == name
        assert ops[0][1] is None
        return
    args, expected = SAMPLES[kind]
    data = asm((name, *args), "STOP")
    (first, arg, pos), *_ = pickletools.genops(data)
    assert first.name == name and pos == 0
    assert arg == expected


def test_example_from_brief_matches_real_pickle_layout() -> None:
    data = asm(
        ("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo hi"), "TUPLE1", "REDUCE", "STOP"
    )
    assert data == b"\x80\x02cos\nsystem\nX\x07\x00\x00\x00echo hi\x85R."


def test_plain_data_matches_pickle_module() -> None:
    built = asm(("PROTO", 2), "EMPTY_LIST", "MARK", ("BININT1", 1), ("BINUNICODE", "a"), "APPENDS", "STOP")
    real = pickletools.optimize(pickle.dumps([1, "a"], 2))  # drops the unused BINPUTs
    assert built == real


def test_text_forms() -> None:
    assert asm(("INT", True)) == b"I01\n"
    assert asm(("INT", "00")) == b"I00\n"
    assert pickle.loads(asm(("STRING", "it's"), "STOP")) == "it's"
    assert pickle.loads(asm(("UNICODE", "a\nb\\c"), "STOP")) == "a\nb\\c"
    assert pickle.loads(asm(("LONG", 7), "STOP")) == 7


def test_raw_length_override_and_frame() -> None:
    assert asm(("RAW", b"\x01\x02")) == b"\x01\x02"
    assert asm(("BINUNICODE", "ab", {"length": 9})) == b"X\x09\x00\x00\x00ab"
    body = asm("NONE", "STOP")
    assert pickle.loads(asm(("PROTO", 4)) + framed(body)) is None


def test_bad_items_rejected() -> None:
    with pytest.raises(ValueError):
        asm("NOPE")
    with pytest.raises(ValueError):
        asm(("STOP", 1))
    with pytest.raises(ValueError):
        asm(("GLOBAL", "os"))
