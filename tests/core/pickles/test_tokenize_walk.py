"""The opcode walk in front of the C-speed paths is exact on every Python.

It rests on no regex construct that CPython 3.11.0-3.11.4 gets wrong (possessive repeats and
atomic groups: gh-100061, gh-106052), and whatever it accepts, pickletools walks the same way:
the same opcodes, the same GLOBALs at the same positions, only opcodes torch accepts."""

from __future__ import annotations

import functools
import io
import pickle
import pickletools
import re
import zipfile
from re import _constants as sre_constants
from re import _parser as sre_parser
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Decline
from ckptguard.core.pickle.fast import tokenize as pickletoken

_UNSOUND_ON_3_11_0_TO_4 = {sre_constants.POSSESSIVE_REPEAT, sre_constants.ATOMIC_GROUP}

# what the walk may let through without asking Python (FORMATS.md §3.4), plus what its loop
# handles itself; NEWOBJ only with newobj=True
_ACCEPTED = {"REDUCE", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK", "TUPLE", "TUPLE1",
             "TUPLE2", "TUPLE3", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_SET", "NONE", "NEWTRUE",
             "NEWFALSE", "BINPERSID", "BININT1", "BINGET", "BINPUT", "BININT2", "BININT",
             "LONG_BINGET", "BINFLOAT", "LONG_BINPUT", "BINUNICODE", "GLOBAL", "PROTO",
             "EMPTY_LIST", "BUILD", "SHORT_BINSTRING", "LONG1", "STOP"}


def _opcodes_in(tree: Any) -> set[Any]:
    found: set[Any] = set()
    for op, arg in tree:
        found.add(op)
        args = arg if isinstance(arg, (list, tuple)) else [arg]
        for a in args:
            if isinstance(a, sre_parser.SubPattern):
                found |= _opcodes_in(a)
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, sre_parser.SubPattern):
                        found |= _opcodes_in(b)
    return found


def test_the_walk_uses_no_construct_3_11_0_to_3_11_4_get_wrong() -> None:
    for run in (pickletoken.run_pattern(False), pickletoken.run_pattern(True)):
        used = _opcodes_in(sre_parser.parse(run.pattern))
        assert sre_constants.MAX_REPEAT in used   # the parse walk itself works
        assert not used & _UNSOUND_ON_3_11_0_TO_4


def test_the_shapes_that_broke_possessive_repeats() -> None:
    """A LONG_BINPUT whose index is out of range and a string cut short stop the run at
    their first byte (the old possessive run skipped into them on 3.11.0-3.11.4)."""
    for data, stop in ((b"Nr\xf0\xff\xff\xff.", 1), (b"NX\x05\x00\x00\x00ab.", 1),
                       (b"X\x01\x00\x00\x00kq\x01h\x02(.", 11)):
        for run in (pickletoken.run_pattern(False), pickletoken.run_pattern(True)):
            assert run.match(data).end() == stop  # type: ignore[union-attr]


def test_a_run_longer_than_one_chunk_is_walked_on() -> None:
    data = b"\x80\x02" + b"N" * (3 * pickletoken._CHUNK + 7) + b"K\x01."
    assert pickletoken.tokenize(data, lambda name: True).end == len(data)
    # empty batches after a SETITEMS: up to 64 in one branch; more are declined, never skipped
    batches = b"\x80\x02}(K\x01K\x02u" + b"(u" * 64 + b"."
    assert pickletoken.tokenize(batches, lambda name: True).end == len(batches)
    with pytest.raises(Decline):
        pickletoken.tokenize(batches[:-1] + b"(u.", lambda name: True)


def _reference(data: bytes, newobj: bool) -> tuple[int, list[int]] | None:
    """pickletools' opcode table, walked by argument length only (decoding the arguments is
    the loader's business, not the walk's): (end, GLOBAL positions), or None if torch's set
    refuses an opcode or the pickle is cut short."""
    globals_at: list[int] = []
    pos, n = 0, len(data)
    while pos < n:
        op = pickletools.code2op.get(chr(data[pos]))
        if op is None or (op.name not in _ACCEPTED and not (newobj and op.name == "NEWOBJ")):
            return None
        if op.name == "GLOBAL":
            globals_at.append(pos)
        if op.name == "STOP":
            return pos + 1, globals_at
        start = pos + 1
        arg = op.arg
        if arg is None:
            pos = start
        elif arg.n >= 0:
            pos = start + arg.n
        elif arg.n == pickletools.UP_TO_NEWLINE:
            lines = 2 if op.name == "GLOBAL" else 1
            pos = start
            for _ in range(lines):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    return None
                pos = nl + 1
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
            if start + 1 > n:
                return None
            pos = start + 1 + data[start]
        elif arg.n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
            if start + 4 > n:
                return None
            pos = start + 4 + int.from_bytes(data[start:start + 4], "little", signed=False)
        else:
            return None
    return None


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40) | st.floats(allow_nan=False)
    | st.text(max_size=300) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    | st.tuples(inner, inner),
    max_leaves=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, cut=st.integers(0, 10_000), flip=st.integers(0, 255),
       at=st.integers(0, 10_000), newobj=st.booleans())
def test_whatever_the_walk_accepts_pickletools_walks_alike(
        value: object, cut: int, flip: int, at: int, newobj: bool) -> None:
    data = bytearray(pickle.dumps(value, protocol=2))
    data[at % len(data)] ^= flip          # a corrupted byte, anywhere (flip 0: intact)
    data = data[: max(1, len(data) - cut % 8)] if cut % 3 == 0 else data   # sometimes cut short
    data = bytes(data)
    try:
        toks = pickletoken.tokenize(data, lambda name: True, newobj=newobj)
    except Decline:
        return
    ref = _reference(data, newobj)
    assert ref is not None, data
    assert toks.end == ref[0]
    assert [g[4] for g in toks.globals] == ref[1]


def test_the_walk_is_the_same_on_every_python() -> None:
    """A pinned input walked to the same end with the same GLOBALs (no engine probe any more)."""
    data = pickle.dumps({"w": [re.compile, 1.5, "x" * 500, (1, 2, 3)]}, protocol=2)
    toks = pickletoken.tokenize(data, lambda name: True)
    assert toks.end == len(data)
    assert [(g[0], g[1]) for g in toks.globals] == [("re", "compile")]


@functools.cache
def _torch_pickles() -> tuple[bytes, ...]:
    """data.pkl of real torch.save files: the shapes the walk's tensor-entry branch is built
    for (1-byte and 4-byte memo indexes, 0 to 4 dims, views, parameters, shared storages)."""
    import torch

    many = {f"layer.{i}.weight": torch.zeros(2, 3) for i in range(300)}   # memo past 255
    base = torch.arange(24.0)
    shapes = {"scalar": torch.tensor(1.5), "vector": torch.ones(5), "cube": torch.ones(2, 2, 2),
              "four": torch.ones(1, 2, 1, 2, dtype=torch.float16),
              "view": base[3:9], "strided": base.view(4, 6)[:, ::2], "again": base,
              "param": torch.nn.Parameter(torch.ones(3)), "wide": torch.zeros(3, 300),
              "big": torch.zeros(70_000, 2)}
    out = []
    for value in (many, shapes, torch.nn.Linear(3, 2).state_dict()):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        with zipfile.ZipFile(buffer) as archive:
            out.append(archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl"))))
    return tuple(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, 2), at=st.integers(0, 1 << 20), flip=st.integers(0, 255),
       cut=st.integers(0, 1 << 20), cut_it=st.booleans())
def test_torch_pickles_corrupted_anywhere_are_walked_as_pickletools_walks_them(
        which: int, at: int, flip: int, cut: int, cut_it: bool) -> None:
    """The tensor-entry branch matches most of a torch pickle: a byte changed anywhere in an
    entry (or the pickle cut inside one) must send the walk back to the one-opcode branch at
    the right place, never past an opcode boundary."""
    data = bytearray(_torch_pickles()[which])
    data[at % len(data)] ^= flip
    if cut_it:
        data = data[:max(1, cut % len(data))]
    blob = bytes(data)
    try:
        toks = pickletoken.tokenize(blob, lambda name: True)
    except Decline:
        assert flip or cut_it, "an intact torch pickle is walked to its end"
        return
    ref = _reference(blob, False)
    assert ref is not None, blob
    assert toks.end == ref[0]
    assert [g[4] for g in toks.globals] == ref[1]
