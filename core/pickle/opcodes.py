"""The pickle opcode table (protocols 0-5) and decoders for the text-form arguments.

Strategy: one `OpInfo` per opcode byte, written out here (not imported from
pickletools, which is a documentation module) and checked against
`pickletools.opcodes` by tests/core/pickles/test_vm_opcodes.py. The VM (core/pickle/vm.py) reads
binary arguments itself, inline, for speed; the text forms of protocol 0 (INT, LONG,
FLOAT, STRING, UNICODE, GET/PUT) are decoded here exactly as CPython's
`pickle._Unpickler` does, raising only `FormatError`.

    OPCODES[ord("X")]                      -> OpInfo(0x58, "BINUNICODE", "unicodestring4", 1)
    decode_int_line(b"01", offset=7)       -> True
    decode_long_line(b"123L", offset=7)    -> 123
"""

from __future__ import annotations

import codecs

from ckptguard.core.errors import Code, FormatError
from ckptguard.core.records import record

# CPython's default int<->str conversion cap (sys.int_info.default_max_str_digits).
# Fixed here so a process that disables the cap (0) cannot make us quadratic.
MAX_INT_DIGITS = 4300


@record(frozen=True, slots=True)
class OpInfo:
    """One opcode: its byte, pickletools name, pickletools argument kind, first protocol."""

    code: int
    name: str
    arg: str | None
    proto: int

    @property
    def fixed_size(self) -> int | None:
        """Bytes of a fixed-size argument (0 for none); None when the length is variable."""
        return _FIXED.get(self.arg, None) if self.arg is not None else 0


_FIXED: dict[str | None, int] = {
    "uint1": 1, "uint2": 2, "int4": 4, "uint4": 4, "uint8": 8, "float8": 8,
}

# (byte, name, argument kind, protocol) in pickletools' order.
_TABLE: tuple[tuple[bytes, str, str | None, int], ...] = (
    (b"I", "INT", "decimalnl_short", 0),
    (b"J", "BININT", "int4", 1),
    (b"K", "BININT1", "uint1", 1),
    (b"M", "BININT2", "uint2", 1),
    (b"L", "LONG", "decimalnl_long", 0),
    (b"\x8a", "LONG1", "long1", 2),
    (b"\x8b", "LONG4", "long4", 2),
    (b"S", "STRING", "stringnl", 0),
    (b"T", "BINSTRING", "string4", 1),
    (b"U", "SHORT_BINSTRING", "string1", 1),
    (b"B", "BINBYTES", "bytes4", 3),
    (b"C", "SHORT_BINBYTES", "bytes1", 3),
    (b"\x8e", "BINBYTES8", "bytes8", 4),
    (b"\x96", "BYTEARRAY8", "bytearray8", 5),
    (b"\x97", "NEXT_BUFFER", None, 5),
    (b"\x98", "READONLY_BUFFER", None, 5),
    (b"N", "NONE", None, 0),
    (b"\x88", "NEWTRUE", None, 2),
    (b"\x89", "NEWFALSE", None, 2),
    (b"V", "UNICODE", "unicodestringnl", 0),
    (b"\x8c", "SHORT_BINUNICODE", "unicodestring1", 4),
    (b"X", "BINUNICODE", "unicodestring4", 1),
    (b"\x8d", "BINUNICODE8", "unicodestring8", 4),
    (b"F", "FLOAT", "floatnl", 0),
    (b"G", "BINFLOAT", "float8", 1),
    (b"]", "EMPTY_LIST", None, 1),
    (b"a", "APPEND", None, 0),
    (b"e", "APPENDS", None, 1),
    (b"l", "LIST", None, 0),
    (b")", "EMPTY_TUPLE", None, 1),
    (b"t", "TUPLE", None, 0),
    (b"\x85", "TUPLE1", None, 2),
    (b"\x86", "TUPLE2", None, 2),
    (b"\x87", "TUPLE3", None, 2),
    (b"}", "EMPTY_DICT", None, 1),
    (b"d", "DICT", None, 0),
    (b"s", "SETITEM", None, 0),
    (b"u", "SETITEMS", None, 1),
    (b"\x8f", "EMPTY_SET", None, 4),
    (b"\x90", "ADDITEMS", None, 4),
    (b"\x91", "FROZENSET", None, 4),
    (b"0", "POP", None, 0),
    (b"2", "DUP", None, 0),
    (b"(", "MARK", None, 0),
    (b"1", "POP_MARK", None, 1),
    (b"g", "GET", "decimalnl_short", 0),
    (b"h", "BINGET", "uint1", 1),
    (b"j", "LONG_BINGET", "uint4", 1),
    (b"p", "PUT", "decimalnl_short", 0),
    (b"q", "BINPUT", "uint1", 1),
    (b"r", "LONG_BINPUT", "uint4", 1),
    (b"\x94", "MEMOIZE", None, 4),
    (b"\x82", "EXT1", "uint1", 2),
    (b"\x83", "EXT2", "uint2", 2),
    (b"\x84", "EXT4", "int4", 2),
    (b"c", "GLOBAL", "stringnl_noescape_pair", 0),
    (b"\x93", "STACK_GLOBAL", None, 4),
    (b"R", "REDUCE", None, 0),
    (b"b", "BUILD", None, 0),
    (b"i", "INST", "stringnl_noescape_pair", 0),
    (b"o", "OBJ", None, 1),
    (b"\x81", "NEWOBJ", None, 2),
    (b"\x92", "NEWOBJ_EX", None, 4),
    (b"\x80", "PROTO", "uint1", 2),
    (b".", "STOP", None, 0),
    (b"\x95", "FRAME", "uint8", 4),
    (b"P", "PERSID", "stringnl_noescape", 0),
    (b"Q", "BINPERSID", None, 1),
)

BY_NAME: dict[str, OpInfo] = {name: OpInfo(code[0], name, arg, proto) for code, name, arg, proto in _TABLE}

# Indexed by opcode byte; None for the 188 bytes no protocol defines.
OPCODES: tuple[OpInfo | None, ...] = tuple(
    next((info for info in BY_NAME.values() if info.code == b), None) for b in range(256)
)

def _bad(message: str, offset: int) -> FormatError:
    return FormatError(Code.PICKLE_MALFORMED, message, offset=offset)


def _decimal(text: bytes, offset: int, *, base: int) -> int:
    # int() refuses > 4300 digits only if the process keeps the default cap; check first.
    if len(text) > MAX_INT_DIGITS + 8:
        raise _bad(f"integer literal of {len(text)} characters exceeds {MAX_INT_DIGITS} digits", offset)
    try:
        return int(text, base)
    except ValueError as exc:
        raise _bad(f"invalid integer literal {text[:40]!r}", offset) from exc


def decode_int_line(line: bytes, *, offset: int) -> int:
    """INT's argument (`line` without its newline): b"00"/b"01" are False/True (pickle.load_int)."""
    if line == b"00":
        return False
    if line == b"01":
        return True
    return _decimal(line, offset, base=0)


def decode_long_line(line: bytes, *, offset: int) -> int:
    """LONG's argument: decimal digits with an optional trailing L (pickle.load_long)."""
    if line[-1:] == b"L":
        line = line[:-1]
    return _decimal(line, offset, base=0)


def decode_index_line(line: bytes, *, offset: int) -> int:
    """GET/PUT's argument: a non-negative decimal memo index (pickle.load_get/load_put)."""
    value = _decimal(line, offset, base=10)
    if value < 0:
        raise _bad(f"negative memo index {value}", offset)
    return value


def decode_float_line(line: bytes, *, offset: int) -> float:
    """FLOAT's argument: repr() of a float (pickle.load_float)."""
    try:
        return float(line)
    except ValueError as exc:
        raise _bad(f"invalid float literal {line[:40]!r}", offset) from exc


def decode_py2_str(raw: bytes) -> str | bytes:
    """A Python 2 str (STRING/BINSTRING/SHORT_BINSTRING): ASCII or UTF-8 text, else the bytes.

    CPython decodes with the caller's `encoding` (ASCII by default, torch uses UTF-8);
    bytes that are neither stay bytes, which is what `encoding="bytes"` would give.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def decode_string_line(line: bytes, *, offset: int) -> str | bytes:
    """STRING's argument: a quoted, backslash-escaped Python 2 str literal (pickle.load_string)."""
    if len(line) < 2 or line[0] != line[-1] or line[0] not in b"\"'":
        raise _bad("the STRING opcode argument must be quoted", offset)
    try:
        raw: bytes = codecs.escape_decode(line[1:-1])[0]  # type: ignore[attr-defined]
    except ValueError as exc:
        raise _bad(f"invalid escape in STRING: {exc}", offset) from exc
    return decode_py2_str(raw)


def decode_unicode_line(line: bytes, *, offset: int) -> str:
    """UNICODE's argument: raw-unicode-escape text (pickle.load_unicode)."""
    try:
        return str(line, "raw-unicode-escape")
    except UnicodeDecodeError as exc:
        raise _bad(f"invalid UNICODE argument: {exc.reason}", offset) from exc
