"""An .npy header, read as numpy reads it: no eval (core.pyliteral), numpy's own
`descr_to_dtype`. Below the formats: the region judge (core.regions) reads the header of an
.npy it meets in bytes torch never reads, to know whether numpy would unpickle its data."""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptguard.core.errors import Code, FormatError, LimitExceeded
from ckptguard.core.pyliteral import LiteralError, parse_literal

EXPECTED_KEYS = frozenset({"descr", "fortran_order", "shape"})


def declared_header(head: bytes) -> tuple[tuple[int, int], int, int] | None:
    """(version, where the header text starts, its length) as an .npy's first 12 bytes
    declare them; None where numpy stops first (a version it does not read, too few bytes)."""
    if len(head) < 10 or head[6:8] not in (b"\x01\x00", b"\x02\x00", b"\x03\x00"):
        return None
    if head[6] == 1:
        return (1, 0), 10, int.from_bytes(head[8:10], "little")
    if len(head) < 12:
        return None
    return (head[6], 0), 12, int.from_bytes(head[8:12], "little")


def parse_npy_header(raw: bytes, version: tuple[int, int], max_header: int, *,
                     offset: int = 0) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """The header bytes -> (shape, fortran_order, dtype), exactly numpy's acceptance."""
    def bad(msg: str) -> FormatError:
        return FormatError(Code.NPY_BAD_HEADER, msg, offset=offset)

    try:
        text = raw.decode("latin1" if version < (3, 0) else "utf8")
    except UnicodeDecodeError as exc:
        raise bad(f"header is not UTF-8: {exc.reason}") from exc
    if len(text) > max_header:
        raise LimitExceeded(Code.LIMIT_HEADER, f"Header info length ({len(text)}) is large and "
                            "may not be safe to load securely", offset=offset)
    try:
        d = parse_literal(text, max_len=max_header, allow_long_suffix=version <= (2, 0))
    except LiteralError as exc:
        raise bad(f"Cannot parse header: {exc}") from exc
    if not isinstance(d, dict):
        raise bad(f"Header is not a dictionary: {short(d)}")
    if d.keys() != EXPECTED_KEYS:
        raise bad(f"Header does not contain the correct keys: {short(sorted(map(repr, d)))}")
    shape = d["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(x, int) for x in shape):
        raise bad(f"shape is not valid: {short(shape)}")
    if not isinstance(d["fortran_order"], bool):
        raise bad(f"fortran_order is not a valid bool: {short(d['fortran_order'])}")
    try:
        dtype = descr_to_dtype(d["descr"], 0)
    except RecursionError as exc:
        raise bad("descr nests too deeply") from exc
    except Exception as exc:  # numpy.dtype raises TypeError/ValueError/KeyError/... on bad descrs
        raise bad(f"descr is not a valid dtype descriptor: {short(d['descr'])} "
                  f"({type(exc).__name__})") from exc
    return tuple(int(x) for x in shape), d["fortran_order"], dtype


def descr_to_dtype(descr: Any, depth: int) -> np.dtype[Any]:
    """numpy.lib.format.descr_to_dtype on a parsed literal (padding fields dropped)."""
    if depth > 32:
        raise RecursionError("descr nesting")
    if isinstance(descr, str):
        return np.dtype(descr)
    if isinstance(descr, tuple):
        return np.dtype((descr_to_dtype(descr[0], depth + 1), descr[1]))
    titles: list[Any] = []
    names: list[Any] = []
    formats: list[np.dtype[Any]] = []
    offsets: list[int] = []
    offset = 0
    for field in descr:
        if len(field) == 2:
            name, sub = field
            dt = descr_to_dtype(sub, depth + 1)
        else:
            name, sub, shape = field
            dt = np.dtype((descr_to_dtype(sub, depth + 1), shape))
        is_pad = name == "" and dt.type is np.void and dt.names is None
        if not is_pad:
            title, name = name if isinstance(name, tuple) else (None, name)
            titles.append(title)
            names.append(name)
            formats.append(dt)
            offsets.append(offset)
        offset += dt.itemsize
    return np.dtype({"names": names, "formats": formats, "titles": titles,
                     "offsets": offsets, "itemsize": offset})


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
