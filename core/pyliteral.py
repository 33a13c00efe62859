"""A tiny Python-literal parser for .npy headers: no eval, no `ast`, capped.

Strategy: numpy reads the header with `ast.literal_eval` (FORMATS.md §7). We accept
the subset numpy's writer produces and hand-edited files plausibly contain, with
`literal_eval`'s meaning: dicts, tuples, lists, parenthesised values, str (prefixes
r/u, implicit concatenation, all escapes but \\N{...}), bytes, ints (any base, `_`,
unary +/-), floats, True/False/None, comments and backslash continuations. Anything
else (sets, complex, calls, names) is a `LiteralError`. Size and nesting are capped
before anything is built, so hostile input costs O(len) time and bounded memory.
The hypothesis test in tests/property/test_format_props.py checks it against
`ast.literal_eval`.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 64


class LiteralError(ValueError):
    """The text is not a literal this parser accepts."""


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\f\r\n]+|\\\r?\n|\#[^\r\n]*)
  | (?P<str>(?:[rRuUbB]|[bB][rR]|[rR][bB])?(?:'''|\"\"\"|'|"))
  | (?P<num>(?:0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+
            |(?=\.?\d)(?:\d(?:_?\d)*)?(?:\.(?:\d(?:_?\d)*)?)?(?:[eE][+-]?\d(?:_?\d)*)?)
            (?P<suffix>[jJlL])?)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>[{}()\[\],:+-])
""", re.VERBOSE)

_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
                   "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\n": ""}
_NAMES: dict[str, Any] = {"True": True, "False": False, "None": None}


def parse_literal(text: str, *, max_len: int = 10_000, allow_long_suffix: bool = False) -> Any:
    """Parse one literal. `allow_long_suffix`: accept Python 2 `3L` (numpy filters it).

    >>> parse_literal("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }")
    {'descr': '<f4', 'fortran_order': False, 'shape': (3,)}
    """
    if len(text) > max_len:
        raise LiteralError(f"literal of {len(text)} characters (cap {max_len})")
    if "\x00" in text:   # CPython compiles no source with a NUL, even inside a string
        raise LiteralError("source code string cannot contain null bytes")
    tokens = _tokenize(text.lstrip(" \t"), allow_long_suffix)
    pos, value = _value(tokens, 0, 0)
    if _is_op(tokens, pos, ","):
        # eval mode accepts a bare tuple: "1, 2" and "1,"
        items = [value]
        pos += 1
        while pos < len(tokens):
            pos, item = _value(tokens, pos, 1)
            items.append(item)
            if not _is_op(tokens, pos, ","):
                break
            pos += 1
        value = tuple(items)
    if pos != len(tokens):
        raise LiteralError(f"unexpected {tokens[pos][1]!r} after the literal")
    return value


def _indented(text: str, bol: int) -> bool:
    """CPython 3.11's tokenizer at the beginning of a line outside brackets (tokenizer.c,
    "Get indentation level"): is this line indented? Spaces and tabs count, a form feed resets
    the column, backslash continuations are skipped and the first one seen with a non-zero
    column fixes the indentation; a line with nothing but a comment or a newline is blank and
    never indented; the end of the text is not blank. In `eval` mode (literal_eval), any
    indentation is an IndentationError."""
    col = cont_col = 0
    i, n = bol, len(text)
    while i < n:
        ch = text[i]
        if ch == " ":
            col += 1
        elif ch == "\t":
            col = (col // 8 + 1) * 8
        elif ch == "\f":
            col = 0
        elif ch == "\\" and text.startswith(("\\\n", "\\\r\n"), i):
            cont_col = cont_col or col
            i += 2 if text[i + 1] == "\n" else 3
            continue
        else:
            break
        i += 1
    if i < n and text[i] in "#\r\n":
        return False
    return (cont_col or col) > 0


def _tokenize(text: str, allow_long: bool) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    depth = 0
    ended = False
    n = len(text)
    last_ws = ""   # the last token, when it was white space
    if _indented(text, 0):
        raise LiteralError("unexpected indent")
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise LiteralError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup
        last_ws = ""
        if kind == "ws":
            ws = last_ws = m.group()
            if depth == 0 and not ws.startswith(("\\", "#")) and ("\n" in ws or "\r" in ws):
                ended = ended or bool(out)   # NEWLINE outside brackets ends the expression
                # every physical line that starts here begins at the left margin or is blank
                for nl in re.finditer(r"\r\n?|\n", ws):
                    if _indented(text, pos + nl.end()):
                        raise LiteralError("unexpected indent")
            pos = m.end()
            continue
        if ended:
            raise LiteralError("text after the end of the expression")
        if kind == "str":
            prefix = m.group("str").rstrip("'\"")
            quote = m.group("str")[len(prefix):]
            pos, token = _string(text, m.end(), prefix.lower(), quote)
            out.append(token)
            continue
        if kind == "num":
            raw = m.group("num")
            if raw == "" or raw == ".":
                raise LiteralError(f"unexpected character {text[pos]!r} at {pos}")
            out.append(("num", _number(raw, allow_long)))
        elif kind == "name":
            if m.group() not in _NAMES:
                raise LiteralError(f"name {m.group()!r} is not a literal")
            out.append(("const", _NAMES[m.group()]))
        else:
            op = m.group()
            if op in "{([":
                depth += 1
                if depth > MAX_DEPTH:
                    raise LiteralError(f"nesting deeper than {MAX_DEPTH}")
            elif op in "})]":
                depth -= 1
            out.append(("op", op))
        pos = m.end()
    if re.fullmatch(r"\\\r?\n", last_ws):   # not a comment's backslash: that one is text
        raise LiteralError("line continuation at the end of the text")
    return out


def _number(raw: str, allow_long: bool) -> int | float:
    suffix = raw[-1] if raw[-1] in "jJlL" else ""
    body = raw[: len(raw) - len(suffix)]
    if suffix in ("j", "J"):
        raise LiteralError("complex numbers are not supported")
    if suffix and (not allow_long or suffix != "L"):
        raise LiteralError(f"invalid number {raw!r}")
    if body[:2].lower() in ("0x", "0o", "0b"):
        return int(body.replace("_", ""), 0)
    if "." in body or "e" in body.lower():
        if suffix:
            raise LiteralError(f"invalid number {raw!r}")
        try:
            return float(body.replace("_", ""))
        except ValueError as exc:
            raise LiteralError(f"invalid number {raw!r}") from exc
    if len(body) > 1 and body[0] == "0" and body.strip("0_"):
        raise LiteralError(f"leading zeros in {raw!r}")
    if len(body) > 4300:   # CPython's int-from-str digit cap
        raise LiteralError("integer too long")
    return int(body.replace("_", ""))


def _string(text: str, pos: int, prefix: str, quote: str) -> tuple[int, tuple[str, Any]]:
    raw = "r" in prefix
    is_bytes = "b" in prefix
    chunks: list[str] = []
    n = len(text)
    triple = len(quote) == 3
    while True:
        if pos >= n:
            raise LiteralError("unterminated string")
        if text.startswith(quote, pos):
            pos += len(quote)
            break
        ch = text[pos]
        if ch == "\n" and not triple:
            raise LiteralError("newline in a single-quoted string")
        if ch == "\\":
            if pos + 1 >= n:
                raise LiteralError("unterminated string")
            if raw:
                chunks.append(text[pos : pos + 2])
                pos += 2
                continue
            pos = _escape(text, pos + 1, chunks, is_bytes)
            continue
        if is_bytes and ord(ch) > 127:
            raise LiteralError("bytes can only contain ASCII literal characters")
        chunks.append(ch)
        pos += 1
    s = "".join(chunks)
    if is_bytes:
        return pos, ("bytes", s.encode("latin1"))
    return pos, ("str", s)


def _escape(text: str, pos: int, chunks: list[str], is_bytes: bool) -> int:
    ch = text[pos]
    if ch in _SIMPLE_ESCAPES:
        chunks.append(_SIMPLE_ESCAPES[ch])
        return pos + 1
    if ch == "\r":   # backslash + CRLF is a line continuation in a string, too
        return pos + 2 if text.startswith("\r\n", pos) else pos + 1
    if ch in "01234567":
        m = re.match(r"[0-7]{1,3}", text[pos:])
        assert m is not None
        value = int(m.group(), 8)
        if is_bytes:
            value &= 0xFF
        chunks.append(chr(value))
        return pos + len(m.group())
    widths = {"x": 2} if is_bytes else {"x": 2, "u": 4, "U": 8}
    if ch in widths:
        digits = text[pos + 1 : pos + 1 + widths[ch]]
        if len(digits) != widths[ch] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
            raise LiteralError(f"truncated \\{ch} escape")
        value = int(digits, 16)
        if value > 0x10FFFF:
            raise LiteralError("illegal Unicode character")
        chunks.append(chr(value))
        return pos + 1 + widths[ch]
    if ch == "N" and not is_bytes:
        raise LiteralError("\\N{...} escapes are not supported")
    chunks.append("\\" + ch)   # unknown escapes stay as they are (with a warning in CPython)
    return pos + 1


def _value(tokens: list[tuple[str, Any]], pos: int, depth: int) -> tuple[int, Any]:
    if depth > MAX_DEPTH:
        raise LiteralError(f"nesting deeper than {MAX_DEPTH}")
    if pos >= len(tokens):
        raise LiteralError("unexpected end of literal")
    kind, tok = tokens[pos]
    if kind in ("str", "bytes"):
        parts = [tok]
        pos += 1
        while pos < len(tokens) and tokens[pos][0] in ("str", "bytes"):
            if tokens[pos][0] != kind:
                raise LiteralError("cannot mix bytes and nonbytes literals")
            parts.append(tokens[pos][1])
            pos += 1
        return pos, (b"".join(parts) if kind == "bytes" else "".join(parts))
    if kind in ("num", "const"):
        return pos + 1, tok
    if tok in ("+", "-"):
        if pos + 1 < len(tokens) and tokens[pos + 1][0] == "op" and tokens[pos + 1][1] in "+-":
            raise LiteralError("nested unary operators are not literals")
        pos, operand = _value(tokens, pos + 1, depth + 1)
        if isinstance(operand, bool) or not isinstance(operand, int | float):
            raise LiteralError("unary +/- applies to numbers only")
        return pos, (-operand if tok == "-" else operand)
    if tok == "(":
        return _sequence(tokens, pos + 1, depth, ")", as_tuple=True)
    if tok == "[":
        return _sequence(tokens, pos + 1, depth, "]", as_tuple=False)
    if tok == "{":
        return _dict(tokens, pos + 1, depth)
    raise LiteralError(f"unexpected {tok!r}")


def _is_op(tokens: list[tuple[str, Any]], pos: int, op: str) -> bool:
    return pos < len(tokens) and tokens[pos] == ("op", op)


def _sequence(tokens: list[tuple[str, Any]], pos: int, depth: int, close: str, *,
              as_tuple: bool) -> tuple[int, Any]:
    items: list[Any] = []
    saw_comma = False
    while not _is_op(tokens, pos, close):
        pos, item = _value(tokens, pos, depth + 1)
        items.append(item)
        if _is_op(tokens, pos, ","):
            pos += 1
            saw_comma = True
        elif not _is_op(tokens, pos, close):
            raise LiteralError(f"expected ',' or {close!r}")
    pos += 1
    if not as_tuple:
        return pos, items
    if len(items) == 1 and not saw_comma:
        return pos, items[0]          # (x) is just x
    return pos, tuple(items)


def _dict(tokens: list[tuple[str, Any]], pos: int, depth: int) -> tuple[int, Any]:
    out: dict[Any, Any] = {}
    while not _is_op(tokens, pos, "}"):
        pos, key = _value(tokens, pos, depth + 1)
        if not _is_op(tokens, pos, ":"):
            raise LiteralError("expected ':' in a dict (sets are not supported)")
        pos, value = _value(tokens, pos + 1, depth + 1)
        try:
            out[key] = value
        except TypeError as exc:   # literal_eval raises TypeError too: unhashable key
            raise LiteralError(f"unhashable dict key {type(key).__name__}") from exc
        if _is_op(tokens, pos, ","):
            pos += 1
        elif not _is_op(tokens, pos, "}"):
            raise LiteralError("expected ',' or '}'")
    return pos + 1, out
