"""The opcode walk in front of the C-speed paths is exact on every Python.

It rests on no regex construct that CPython 3.11.0-3.11.4 gets wrong (possessive repeats and
atomic groups: gh-100061, gh-106052), and whatever it accepts, pickletools walks the same way:
the same opcodes, the same GLOBALs at the same positions, only opcodes torch accepts."""

from __future__ import annotations

import functools
import pickle
import pickletools
import random
import re
from re import _constants as sre_constants
from re import _parser as sre_parser
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core import records
from ckptguard.core.errors import Decline
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.fast import tokenize as pickletoken
from tests.builders.torchsave import torch_data_pkl

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
    """A LONG_BINPUT whose index is out of range, a string cut short and a tensor entry that
    fails after its first opcodes stop the run at an opcode boundary (the old possessive run
    skipped into them on 3.11.0-3.11.4); a MARK outside an entry is the loop's."""
    for data, stop in ((b"Nr\xf0\xff\xff\xff.", 1), (b"NX\x05\x00\x00\x00ab.", 1),
                       (b"X\x01\x00\x00\x00kq\x01h\x02(.", 10)):
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
    """pickletools' walk of `data` (`_opcode_starts`): (end after STOP, GLOBAL positions), or
    None if torch's set refuses an opcode or the pickle is cut short before its STOP."""
    starts = _opcode_starts(data, newobj=newobj)
    stop = next((s for s in starts if s < len(data) and data[s] == 0x2E), None)
    if stop is None:
        return None
    return stop + 1, [s for s in starts if s < stop and data[s] == 0x63]


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
    return tuple(map(torch_data_pkl, (many, shapes, torch.nn.Linear(3, 2).state_dict())))


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


# opcodes spliced into torch pickles below: ones torch refuses or the walk leaves to Python,
# memo forms at the bounds of the walk's LONG_BINPUT branch, strings whose bytes look like
# opcodes, ints, empty batches
_SPLICED = (b"cos\nsystem\n", b"\x8c\x02os\x8c\x06system\x93", b"ios\nsystem\n", b"o", b"\x81",
            b"\x82\x01", b"\x83\x01\x00", b"\x84\x01\x00\x00\x00", b"P0\n", b"Q", b"\x94",
            b"\x95\x08\x00\x00\x00\x00\x00\x00\x00", b"q\x07", b"r\xff\xff\x0f\x00", b"r\x00\x00\x10\x00",
            b"r\x07\x00\x00\x00", b"h\x07", b"j\x07\x00\x00\x00", b"K\x01", b"M\x01\x00",
            b"J\x01\x00\x00\x00", b"X\x03\x00\x00\x00q((", b"X\x05\x00\x00\x00q(", b"(", b")", b"t",
            b"R", b"e", b"u", b"(u", b"(e", b"b", b"]", b"}", b"\x88", b"N", b".", b"0", b"1", b"2",
            b"\x8f", b"\x90", b"s", b"a")
# one-byte opcodes torch refuses (POP, POP_MARK, DUP, MEMOIZE, OBJ, STACK_GLOBAL, ADDITEMS,
# FROZENSET, LIST, DICT): spliced as often as all the rest, each in place of an accepted one
_REFUSED_1 = (b"0", b"1", b"2", b"\x94", b"o", b"\x93", b"\x90", b"\x91", b"l", b"d")
# what the walk's loop handles in Python: never inside a step of the regex run
_PYTHON_SIDE = {"GLOBAL", "PROTO", "BUILD", "EMPTY_LIST", "EMPTY_DICT", "STOP", "SHORT_BINSTRING",
                "LONG1"}
# ... and, outside a tensor entry, MARK and what closes one (the loop keeps the open MARKs)
_LOOP_SIDE = _PYTHON_SIDE | {"MARK", "TUPLE", "APPENDS", "SETITEMS"}


def _opcode_starts(data: bytes, *, newobj: bool = True) -> list[int]:
    """Where pickletools' opcodes start, walked by argument length only (decoding the
    arguments is the loader's business, not the walk's), up to the first opcode that is
    unknown, refused by torch (NEWOBJ: unless `newobj`) or cut short; then where the last
    whole opcode ends."""
    starts, pos, n = [], 0, len(data)
    while pos < n:
        op = pickletools.code2op.get(chr(data[pos]))
        if op is None or (op.name not in _ACCEPTED and not (newobj and op.name == "NEWOBJ")):
            break
        starts.append(pos)
        arg = op.arg
        if arg is None or arg.n >= 0:
            pos += 1 + (arg.n if arg is not None else 0)
        elif op.name == "GLOBAL":
            nl = data.find(b"\n", data.find(b"\n", pos + 1) + 1)
            pos = nl + 1 if data.find(b"\n", pos + 1) >= 0 and nl >= 0 else n + 1
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
            pos = pos + 2 + data[pos + 1] if pos + 2 <= n else n + 1
        else:
            pos = pos + 5 + int.from_bytes(data[pos + 1:pos + 5], "little") if pos + 5 <= n else n + 1
    if pos <= n:
        starts.append(pos)
    return starts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, 2), seed=st.integers(0, 1 << 32), newobj=st.booleans())
def test_each_step_of_the_walk_is_whole_opcodes_torch_accepts(which: int, seed: int,
                                                             newobj: bool) -> None:
    """Not only where the walk ends: each step of its run (the tensor-entry branch or the
    one-opcode branch) starts and ends where pickletools' opcodes do, and every opcode inside
    it is one torch accepts that the walk may pass without Python (LONG_BINPUT below 2**20,
    a MARK directly before APPENDS/SETITEMS only after a batch of the same kind). Positions
    come from a seeded generator: hypothesis favours small integers, and most of the memo
    forms (4-byte indexes) sit far into a torch pickle."""
    rng = random.Random(seed)
    pkl = _torch_pickles()[which]
    offsets = [pos for _op, _arg, pos in pickletools.genops(pkl)]
    first = rng.randrange(2, max(3, len(offsets) - 60))     # ~60 opcodes after PROTO
    last = min(first + 60, len(offsets) - 1)
    data = bytearray(pkl[:2] + pkl[offsets[first]:offsets[last]])
    starts = [2 + o - offsets[first] for o in offsets[first:last]]
    # up to 6 splices, each replacing the opcode at an opcode start or going in before it
    # (from the end back, so the starts still hold), a memo opcode re-encoded with a 4-byte
    # index at the bounds of the walk's LONG_BINPUT branch, then maybe one byte changed
    for i in sorted(rng.sample(range(len(starts)), rng.randrange(min(7, len(starts)))), reverse=True):
        end = starts[i + 1] if i + 1 < len(starts) else len(data)
        if data[starts[i]] in b"qrhj" and rng.random() < 0.5:   # a memo opcode re-encoded
            index = rng.choice((data[starts[i] + 1], 0xFFFFF, 0x100000, 0xFFFFFFFF))
            data[starts[i]:end] = (b"r" if data[starts[i]] in b"qr" else b"j") + index.to_bytes(4, "little")
            continue
        spliced = rng.choice(_SPLICED if rng.random() < 0.5 else _REFUSED_1)
        data[starts[i]:end if rng.random() < 0.5 else starts[i]] = spliced
    if rng.random() < 0.5:
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    blob = bytes(data[:rng.randrange(3, len(data) + 1)] if rng.random() < 0.3 else data)
    branches = pickletoken._TENSOR_ENTRY + (rb"|\x81|" if newobj else rb"|") + pickletoken._ONE_OPCODE
    step = re.compile(rb"(?:" + branches + rb")")
    starts = _opcode_starts(blob)
    allowed = _ACCEPTED - _PYTHON_SIDE | ({"NEWOBJ"} if newobj else set())
    pos = 2
    while pos in starts and pos < len(blob):
        m = step.match(blob, pos)
        if m is None:   # the loop's Python side steps over it (or declines there)
            op = pickletools.code2op.get(chr(blob[pos]))
            if op is None or op.name not in _LOOP_SIDE - {"STOP"}:
                return
            pos = next((s for s in starts if s > pos), len(blob) + 1)
            continue
        assert m.end() in starts, (blob, pos, m.end())
        for at in (s for s in starts if pos <= s < m.end()):
            name = pickletools.code2op[chr(blob[at])].name
            assert name in allowed, (blob, at, name)
            if name == "LONG_BINPUT":
                assert int.from_bytes(blob[at + 1:at + 5], "little") < 1 << 20, (blob, at)
            if name == "MARK" and blob[at + 1:at + 2] in (b"e", b"u"):
                assert at > pos and blob[at - 1] == blob[at + 1], (blob, at)
        pos = m.end()


def _counting(data: bytes) -> Limits:
    """Caps one byte under the pickle's size: the walk must count its opcodes."""
    return records.replace(DEFAULT_LIMITS, max_opcodes=len(data) - 1, max_container_items=len(data) - 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, newobj=st.booleans())
def test_the_opcode_count_is_pickletools_count(value: object, newobj: bool) -> None:
    """A pickle larger than the opcode cap has its opcodes counted (run by run, in blocks):
    the count is exactly pickletools' (so a pickle is declined only past the cap)."""
    data = pickle.dumps(value, protocol=2)
    try:
        toks = pickletoken.tokenize(data, lambda name: True, newobj=newobj, limits=_counting(data))
    except Decline:
        return
    assert toks.opcodes == len(_opcode_starts(data[:toks.end], newobj=newobj)) - 1   # - the end


def test_the_opcode_count_of_torch_pickles_and_long_runs() -> None:
    batches = pickle.dumps({i: [i] for i in range(2000)}, protocol=2)   # ends "u(u": an empty batch
    for data in (*_torch_pickles(), b"\x80\x02" + b"N" * (5 * pickletoken._CHUNK + 3) + b".",
                 batches):
        toks = pickletoken.tokenize(data, lambda name: True, limits=_counting(data))
        assert toks.opcodes == len(_opcode_starts(data)) - 1, len(data)   # starts: + the end
    assert pickletoken.tokenize(data, lambda name: True).opcodes is None   # not needed: not counted
