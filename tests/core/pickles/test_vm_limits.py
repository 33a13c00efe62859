"""Errors and limits: every LIMIT_* the VM produces, truncation, malformed input, deep nesting."""

from __future__ import annotations

import pytest

from ckptguard.core import records
from ckptguard.core.errors import Code, FormatError, LimitExceeded
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.pickle.vm import hashable_key, run_vm
from ckptguard.core.values import Unhashable
from tests.builders.pickle_asm import asm, op


def depth(value: object) -> int:
    """Nesting depth along first children (values.walk keeps whole paths: quadratic here)."""
    n = 0
    while isinstance(value, (list, tuple)) and value:
        value, n = value[0], n + 1
    return n


def lim(**kw: int):  # type: ignore[no-untyped-def]
    return records.replace(DEFAULT_LIMITS, **kw)


def err(data: bytes, **kw: int) -> tuple[Code, int | None]:
    r = run_vm(data, limits=lim(**kw))
    assert r.error is not None and not r.complete
    return r.error.code, r.error.offset


def test_limit_opcodes_exact() -> None:
    data = asm(*[("BININT1", 1)] * 9, "STOP")
    assert run_vm(data, limits=lim(max_opcodes=10)).complete
    r = run_vm(data, limits=lim(max_opcodes=9))
    assert isinstance(r.error, LimitExceeded) and r.error.code is Code.LIMIT_OPCODES
    assert r.opcode_count == 9 and r.end == 18 and r.error.offset == 18


def test_limit_memo() -> None:
    data = asm("NONE", *[("BINPUT", i) for i in range(5)], "STOP")
    assert run_vm(data, limits=lim(max_memo_entries=5)).complete
    assert err(data, max_memo_entries=4) == (Code.LIMIT_MEMO, 9)
    # re-putting the same index costs nothing
    data = asm("NONE", *[("BINPUT", 0)] * 50, "STOP")
    assert run_vm(data, limits=lim(max_memo_entries=1)).complete
    assert err(asm("NONE", "MEMOIZE", "MEMOIZE", "STOP"), max_memo_entries=1) == (Code.LIMIT_MEMO, 2)


def test_limit_depth_mark() -> None:
    data = asm(*["MARK"] * 5, *["TUPLE"] * 5, "STOP")
    assert run_vm(data, limits=lim(max_depth=5)).complete
    assert err(data, max_depth=4) == (Code.LIMIT_DEPTH, 4)


def test_100k_deep_mark_nesting() -> None:
    data = b"(" * 100_000 + b"t" * 100_000 + b"."
    r = run_vm(data)
    assert r.error is not None and r.error.code is Code.LIMIT_DEPTH
    assert r.error.offset == DEFAULT_LIMITS.max_depth
    r = run_vm(data, limits=lim(max_depth=200_000))     # iterative: no RecursionError either way
    assert r.complete and depth(r.root) == 99_999


def test_100k_deep_list_and_tuple_nesting() -> None:
    # ] ] ] ... a a a : 100k nested lists without any MARK; TUPLE1 x 100k: nested tuples
    r = run_vm(b"]" * 100_001 + b"a" * 100_000 + b".")
    assert r.complete and depth(r.root) == 100_000
    deep = asm("NONE", ("RAW", op("TUPLE1") * 100_000))
    r = run_vm(deep + b".")
    assert r.complete and depth(r.root) == 100_000
    # used as a dict key / set member, it is not hashed (tuple hash recursion crashes CPython)
    r = run_vm(b"}" + deep + b"Ns" + b"(" + deep + b"\x91" + b"\x86.")
    assert r.complete
    d, fs = r.root
    (k,) = d
    (m,) = fs
    assert isinstance(k, Unhashable) and isinstance(m, Unhashable)
    assert hashable_key(((1, 2), "a")) == ((1, 2), "a")


def test_limit_stack() -> None:
    data = asm(*[("BININT1", 1)] * 10, "TUPLE3", "STOP")
    assert run_vm(data, limits=lim(max_stack=10)).complete
    r = run_vm(data, limits=lim(max_stack=9))
    assert r.error is not None and r.error.code is Code.LIMIT_CONTAINER and r.error.offset == 20
    assert r.opcode_count == 10


def test_limit_container() -> None:
    data = asm("EMPTY_LIST", "MARK", *[("BININT1", 1)] * 6, "APPENDS", ("BININT1", 1), "APPEND", "STOP")
    assert run_vm(data, limits=lim(max_container_items=7)).complete
    assert err(data, max_container_items=6)[0] is Code.LIMIT_CONTAINER
    assert err(data, max_container_items=5)[0] is Code.LIMIT_CONTAINER
    for body in (("EMPTY_DICT", "MARK", "NONE", "NONE", ("BININT1", 1), "NONE", "SETITEMS"),
                 ("EMPTY_DICT", "NONE", "NONE", "SETITEM", ("BININT1", 1), "NONE", "SETITEM"),
                 ("EMPTY_SET", "MARK", "NONE", ("BININT1", 1), "ADDITEMS"),
                 ("MARK", "NONE", "NONE", ("BININT1", 1), "NONE", "DICT")):
        assert run_vm(asm(*body, "STOP"), limits=lim(max_container_items=2)).complete
        assert err(asm(*body, "STOP"), max_container_items=1)[0] is Code.LIMIT_CONTAINER


@pytest.mark.parametrize("name", ["BINUNICODE", "BINBYTES", "BINUNICODE8", "BINBYTES8", "BYTEARRAY8",
                                  "BINSTRING", "SHORT_BINUNICODE", "SHORT_BINBYTES", "SHORT_BINSTRING"])
def test_limit_string_and_truncation_before_slicing(name: str) -> None:
    data = asm((name, b"abcdef"), "STOP")
    assert run_vm(data, limits=lim(max_str_bytes=6)).complete
    assert err(data, max_str_bytes=5) == (Code.LIMIT_STRING, 0)
    short = asm((name, b"abcdef", {"length": 200}), "STOP")
    assert err(short)[0] is Code.PICKLE_TRUNCATED


def test_huge_declared_lengths_cost_nothing() -> None:
    for name in ("BINUNICODE8", "BINBYTES8", "BYTEARRAY8"):
        assert err(asm((name, b"x", {"length": 2**64 - 1})))[0] is Code.LIMIT_STRING
    assert err(asm(("LONG4", 1, {"length": 2**31 - 1})))[0] is Code.LIMIT_STRING
    assert err(asm(("LONG4", 1, {"length": 2**20})))[0] is Code.PICKLE_TRUNCATED
    assert err(asm(("BINSTRING", b"x", {"length": -1})))[0] is Code.PICKLE_MALFORMED
    assert err(asm(("LONG4", 1, {"length": -1})))[0] is Code.PICKLE_MALFORMED
    assert err(b"Vabc" * 10)[0] is Code.PICKLE_TRUNCATED          # text without newline
    assert err(b"V" + b"a" * 100 + b"\n.", max_str_bytes=99)[0] is Code.LIMIT_STRING


def test_huge_memo_index_is_cheap() -> None:
    r = run_vm(asm("NONE", ("LONG_BINPUT", 0xFFFFFFF0), ("LONG_BINGET", 0xFFFFFFF0), "TUPLE2", "STOP"))
    assert r.complete and r.root == (None, None)
    r = run_vm(asm("NONE", ("PUT", 10**100), "STOP"))      # text index: still one dict entry
    assert r.complete


def test_huge_integers_do_not_crash() -> None:
    assert err(b"I" + b"9" * 1_000_000 + b"\n.")[0] is Code.PICKLE_MALFORMED
    assert err(b"L" + b"9" * 1_000_000 + b"L\n.")[0] is Code.PICKLE_MALFORMED
    assert err(b"g" + b"9" * 1_000_000 + b"\n.")[0] is Code.PICKLE_MALFORMED
    r = run_vm(asm(("LONG4", 2 ** (8 * 1_000_000 - 1)), "STOP"))   # 1 MB two's complement: linear
    assert r.complete and r.root.bit_length() == 8 * 1_000_000


@pytest.mark.parametrize(("data", "code", "offset"), [
    (b"", Code.PICKLE_TRUNCATED, 0),
    (b"N", Code.PICKLE_TRUNCATED, 1),
    (b"K", Code.PICKLE_TRUNCATED, 0),
    (b"J\x01\x02", Code.PICKLE_TRUNCATED, 0),
    (b"\x80", Code.PICKLE_TRUNCATED, 0),
    (b"\x95\x01", Code.PICKLE_TRUNCATED, 0),
    (b"cos\nsys", Code.PICKLE_TRUNCATED, 0),
    (b"\xff", Code.PICKLE_UNKNOWN_OPCODE, 0),
    (b"N\x00.", Code.PICKLE_UNKNOWN_OPCODE, 1),
    (b".", Code.PICKLE_MALFORMED, 0),                  # STOP on an empty stack
    (b"a.", Code.PICKLE_MALFORMED, 0),
    (b"NNNt.", Code.PICKLE_MALFORMED, 3),              # TUPLE without MARK
    (b"(R.", Code.PICKLE_MALFORMED, 1),
    (b"h\x05.", Code.PICKLE_MALFORMED, 0),             # memo miss
    (b"(NNNd.", Code.PICKLE_MALFORMED, 4),             # odd DICT
    (b"}(Nu.", Code.PICKLE_MALFORMED, 3),              # odd SETITEMS
    (b"(o.", Code.PICKLE_MALFORMED, 1),                # OBJ without class
    (b"X\x02\x00\x00\x00\xff\xfe.", Code.PICKLE_MALFORMED, 0),   # bad UTF-8
    (b"S'abc\n.", Code.PICKLE_MALFORMED, 0),
    (b"Fx\n.", Code.PICKLE_MALFORMED, 0),
    (b"P\xff\n.", Code.PICKLE_MALFORMED, 0),
    (b"Np-1\n.", Code.PICKLE_MALFORMED, 1),
    (b"((N1t0.", Code.PICKLE_MALFORMED, 6),            # POP with empty stack after marks popped
])
def test_errors(data: bytes, code: Code, offset: int) -> None:
    r = run_vm(data, base_offset=0)
    assert r.error is not None and isinstance(r.error, (FormatError, LimitExceeded)), r
    assert (r.error.code, r.error.offset) == (code, offset), r.error
    assert r.end == offset and not r.complete


def test_frame_past_end_is_a_note() -> None:
    data = asm(("PROTO", 4), ("FRAME", 1000), "NONE", "STOP")
    r = run_vm(data)
    assert r.complete and r.notes == [(Code.PICKLE_TRUNCATED, "FRAME of 1000 bytes runs past the end", 2)]


def test_unsupported_protocol_noted() -> None:
    r = run_vm(asm(("PROTO", 9), "NONE", "STOP"))
    assert r.complete and r.protocol == 9 and r.notes[0][0] is Code.PICKLE_PROTOCOL


def test_error_offsets_are_absolute() -> None:
    r = run_vm(b"xxN\xff", start=2, base_offset=500)
    assert r.error is not None and r.error.offset == 503 and r.end == 3 and r.start == 2


def test_keys_that_would_hash_slowly_are_wrapped() -> None:
    # DUP TUPLE2 x 80: a tuple DAG with 2**80 leaves; hashing it would never finish.
    dag = asm(("BININT1", 1), ("RAW", (op("DUP") + op("TUPLE2")) * 80))
    r = run_vm(asm("EMPTY_DICT", ("RAW", dag), "NONE", "SETITEM", "EMPTY_SET", "MARK", ("RAW", dag),
                   "ADDITEMS", "TUPLE2", "STOP"))
    assert r.complete
    d, s = r.root
    assert [type(k) for k in d] == [Unhashable] and [type(m) for m in s] == [Unhashable]
    big = 1 << 100_000
    assert isinstance(hashable_key(big), Unhashable) and isinstance(hashable_key((1, (big,))), Unhashable)
    assert hashable_key(1 << 60) == 1 << 60 and hashable_key((1, (2, "x"))) == (1, (2, "x"))
    # a big int reused as a key through the memo: wrapped every time, never hashed
    r = run_vm(asm("EMPTY_DICT", ("LONG4", big), ("BINPUT", 0), "NONE", "SETITEM",
                   ("RAW", asm(("BINGET", 0), "NONE", "SETITEM") * 100), "STOP"))
    assert r.complete and len(r.root) == 101


def test_notes_are_capped() -> None:
    MAX_NOTES = DEFAULT_LIMITS.max_vm_notes

    r = run_vm(asm(("PROTO", 2), ("RAW", asm(("EXT1", 1), "POP") * (MAX_NOTES + 50)), "NONE", "STOP"))
    assert r.complete and len(r.notes) == MAX_NOTES + 1
    assert r.notes[-1][1].startswith("more notes after this one were not recorded")


def test_long_global_names_not_rescanned() -> None:
    name = "a" * 5_000_000
    data = asm(("PROTO", 4), ("BINUNICODE", name), ("BINPUT", 0), "POP",
               ("RAW", asm(("BINGET", 0), ("BINGET", 0), "STACK_GLOBAL", "POP") * 200), "NONE", "STOP")
    r = run_vm(data)
    assert r.complete and len(r.globals) == 200
    assert {c for c, _m, _o in r.notes} == {Code.PICKLE_NON_ASCII_GLOBAL}


def test_memory_error_is_a_resource_limit_not_a_malformed_pickle(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Under the worker's RLIMIT_AS an allocation fails with MemoryError: that is a resource
    verdict (RESOURCE_LIMIT), never 'the pickle is malformed'."""
    from ckptguard.core.errors import Code, LimitExceeded
    from ckptguard.core.pickle.vm import _Machine, run_vm

    original = _Machine._dispatch

    def exhausted(self):  # type: ignore[no-untyped-def]
        table = original(self)

        def oom(pos: int) -> int:
            raise MemoryError
        table[ord("]")] = oom   # EMPTY_LIST
        return table

    monkeypatch.setattr(_Machine, "_dispatch", exhausted)
    result = run_vm(b"\x80\x02].")
    assert isinstance(result.error, LimitExceeded)
    assert result.error.code == Code.RESOURCE_LIMIT


def test_a_finished_machine_is_freed_without_the_cyclic_gc() -> None:
    """Scans pause the cyclic GC; the handlers' closures formed cycles through the machine,
    so every interpreted pickle stayed in memory until the scan ended (a legacy tar of 90k
    items: 9.8 GB)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        for data in (b"\x80\x02" + b"N" * 1000 + b".", b"\x80\x02(]q\x00h\x00", b"\x80\x02c"):
            result = run_vm(data)
            del result
        assert gc.collect() < 20
    finally:
        gc.enable()
