"""Build pickles from opcode names, not hex.

    asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo hi"),
        "TUPLE1", "REDUCE", "STOP")  -> bytes

An item is an opcode name (no argument), a tuple `(name, arg...)`, or `("RAW", b"...")`
for bytes written as they are (malformed input). Names and codes come from
`pickletools.opcodes`, so they are exactly CPython's. Arguments are encoded as CPython's
pickler would write them:

    INT 5 / True          -> b"I5\\n" / b"I01\\n"     LONG 10**30      -> b"L1000...0L\\n"
    STRING b"a'b" or "x"  -> quoted + escaped line   UNICODE "é\\n"    -> raw-unicode-escape line
    BINUNICODE "x"        -> u32 length + utf-8      LONG1/LONG4 n    -> length + two's complement
    GLOBAL "os", "system" -> b"cos\\nsystem\\n"        FRAME n          -> u64 n
    INT/LONG/GET/PUT/FLOAT/PERSID also take a `str`: the line is written verbatim (no newline).

Length-prefixed arguments accept a trailing `{"length": n}` to lie about the length:
`("BINUNICODE", "ab", {"length": 10**9})`.
"""

from __future__ import annotations

import codecs
import pickle
import pickletools
import struct
from typing import Any

# name -> (code byte, argument kind name or None, protocol), straight from pickletools.
OPCODES: dict[str, tuple[bytes, str | None, int]] = {
    op.name: (op.code.encode("latin-1"), op.arg.name if op.arg is not None else None, op.proto)
    for op in pickletools.opcodes
}


def op(name: str) -> bytes:
    """The one-byte code of opcode `name`."""
    return OPCODES[name][0]


def _line(value: Any, fmt: str = "{}") -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8") + b"\n"       # what pickle writes for GLOBAL names
    if isinstance(value, bytes):
        return value + b"\n"
    return fmt.format(value).encode("ascii") + b"\n"


def _prefixed(payload: bytes, fmt: str, length: int | None) -> bytes:
    n = len(payload) if length is None else length
    return struct.pack(fmt, n) + payload


def _unicode_nl(s: str) -> bytes:
    # Same escaping as pickle._Pickler.save_str for protocol 0.
    s = (
        s.replace("\\", "\\u005c")
        .replace("\0", "\\u0000")
        .replace("\n", "\\u000a")
        .replace("\r", "\\u000d")
        .replace("\x1a", "\\u001a")
    )
    return s.encode("raw-unicode-escape") + b"\n"


def _string_nl(value: str | bytes) -> bytes:
    raw = value.encode("latin-1") if isinstance(value, str) else value
    # escape_encode already escapes the quote character.
    return b"'" + codecs.escape_encode(raw)[0] + b"'\n"  # type: ignore[attr-defined]


def _as_bytes(value: str | bytes | bytearray, *, utf8: bool) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass") if utf8 else value.encode("latin-1")
    return bytes(value)


def encode_arg(kind: str, args: tuple[Any, ...], length: int | None = None) -> bytes:
    """Encode the argument(s) of an opcode whose pickletools argument kind is `kind`."""
    a: Any = args[0] if args else None
    if kind == "decimalnl_short":
        if isinstance(a, bool):
            return b"01\n" if a else b"00\n"
        return _line(a)
    if kind == "decimalnl_long":
        return _line(a, "{}L")
    if kind == "floatnl":
        return _line(a, "{!r}")
    if kind == "stringnl":
        return _string_nl(a)
    if kind == "stringnl_noescape":
        return _line(a)
    if kind == "stringnl_noescape_pair":
        return _line(args[0]) + _line(args[1])
    if kind == "unicodestringnl":
        return _unicode_nl(a)
    if kind == "uint1":
        return struct.pack("<B", a)
    if kind == "uint2":
        return struct.pack("<H", a)
    if kind == "uint4":
        return struct.pack("<I", a)
    if kind == "int4":
        return struct.pack("<i", a)
    if kind == "uint8":
        return struct.pack("<Q", a)
    if kind == "float8":
        return struct.pack(">d", a)
    if kind == "long1":
        return _prefixed(pickle.encode_long(a), "<B", length)
    if kind == "long4":
        return _prefixed(pickle.encode_long(a), "<i", length)
    if kind == "string1":
        return _prefixed(_as_bytes(a, utf8=False), "<B", length)
    if kind == "string4":
        return _prefixed(_as_bytes(a, utf8=False), "<i", length)
    if kind == "bytes1":
        return _prefixed(_as_bytes(a, utf8=False), "<B", length)
    if kind == "bytes4":
        return _prefixed(_as_bytes(a, utf8=False), "<I", length)
    if kind in ("bytes8", "bytearray8"):
        return _prefixed(_as_bytes(a, utf8=False), "<Q", length)
    if kind == "unicodestring1":
        return _prefixed(_as_bytes(a, utf8=True), "<B", length)
    if kind == "unicodestring4":
        return _prefixed(_as_bytes(a, utf8=True), "<I", length)
    if kind == "unicodestring8":
        return _prefixed(_as_bytes(a, utf8=True), "<Q", length)
    raise ValueError(f"unknown argument kind {kind!r}")


def asm(*items: str | tuple[Any, ...]) -> bytes:
    """Assemble opcodes into a pickle (see module docstring)."""
    out = bytearray()
    for item in items:
        if isinstance(item, str):
            item = (item,)
        name, *rest = item
        if name == "RAW":
            out += bytes(rest[0])
            continue
        length: int | None = None
        if rest and isinstance(rest[-1], dict):
            length = rest.pop()["length"]
        try:
            code, kind, _proto = OPCODES[name]
        except KeyError:
            raise ValueError(f"unknown opcode {name!r}") from None
        out += code
        if kind is None:
            if rest:
                raise ValueError(f"{name} takes no argument")
            continue
        need = 2 if kind == "stringnl_noescape_pair" else 1
        if len(rest) != need:
            raise ValueError(f"{name} takes {need} argument(s), got {len(rest)}")
        out += encode_arg(kind, tuple(rest), length)
    return bytes(out)


def framed(body: bytes) -> bytes:
    """`body` preceded by a FRAME opcode announcing its exact length."""
    return asm(("FRAME", len(body))) + body
