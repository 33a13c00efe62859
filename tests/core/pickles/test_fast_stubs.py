"""The fast path vouches only for what torch's restricted unpickler would load, never
runs anything, and declines everything else."""

from __future__ import annotations

import pickle
import pickletools
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Decline
from ckptguard.core.pickle.fast.stubs import fast_load, tokenize
from ckptguard.core.pickle.fast.tokenize import memo_index_cap
from ckptguard.core.torch.rules import check_rebuild
from ckptguard.core.values import Call, Global, PersId
from tests.builders.pickle_asm import asm

ALLOWED = frozenset({"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                     "torch._utils._rebuild_parameter", "torch.FloatStorage", "torch.float32",
                     "torch._utils._rebuild_tensor_v3", "torch.storage.UntypedStorage"})


def _ok_pid(pid: tuple[Any, ...]) -> None:
    if len(pid) != 5 or pid[0] != "storage" or type(pid[1]) is not Global:
        raise Decline("pid")


def _info(p: PersId) -> tuple[str, int]:
    return ("float32", p.pid[4] * 4)


def _load(data: bytes, allowed: frozenset[str] = ALLOWED) -> Any:
    return fast_load(data, allowed=allowed.__contains__, check_pid=_ok_pid,
                     check_call=lambda f, a: check_rebuild(f, a, _info))


def _tensor_pickle(*, size: tuple[int, ...] = (2,), stride: tuple[int, ...] = (1,),
                   offset: int = 0, numel: int = 2, requires_grad: bool = False) -> bytes:
    dims = [("BININT1", n) for n in size]
    strides = [("BININT1", n) for n in stride]
    return asm(
        ("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
        ("BINPUT", 0), "MARK", ("BINUNICODE", "w"),
        ("GLOBAL", "torch._utils", "_rebuild_tensor_v2"), "MARK",
        "MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", "FloatStorage"),
        ("BINUNICODE", "0"), ("BINUNICODE", "cpu"), ("BININT1", numel), "TUPLE", "BINPERSID",
        ("BININT1", offset), "MARK", *dims, "TUPLE", "MARK", *strides, "TUPLE",
        "NEWTRUE" if requires_grad else "NEWFALSE",
        ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
        "TUPLE", "REDUCE", "SETITEMS", "STOP")


def test_clean_state_dict_pickle_builds_the_graph() -> None:
    result = _load(_tensor_pickle())
    (name, call), = result.root.items()
    assert name == "w" and isinstance(call, Call)
    assert call.func == Global("torch._utils", "_rebuild_tensor_v2")
    storage = call.args[0]
    assert isinstance(storage, PersId)
    assert storage.pid == ("storage", Global("torch", "FloatStorage"), "0", "cpu", 2)
    assert [g[:2] for g in result.tokens.globals] == [
        ("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
        ("torch", "FloatStorage"), ("collections", "OrderedDict")]
    assert result.persids == [storage]


@pytest.mark.parametrize("opname,item", [
    ("STACK_GLOBAL", ("RAW", b"\x93")), ("MEMOIZE", "MEMOIZE"), ("FRAME", ("FRAME", 4)),
    ("INT", ("INT", 5)), ("DICT", ("RAW", b"(d")), ("BINBYTES", ("BINBYTES", b"x")),
    ("SHORT_BINUNICODE", ("SHORT_BINUNICODE", "x")), ("EXT1", ("EXT1", 1)),
    ("POP", "POP"), ("DUP", "DUP"), ("LIST", ("RAW", b"(l")),
])
def test_opcodes_torch_refuses_are_declined(opname: str, item: Any) -> None:
    data = asm(("PROTO", 2), "EMPTY_DICT", item, "STOP")
    with pytest.raises(Decline):
        tokenize(data, ALLOWED.__contains__)


def test_unlisted_global_is_declined_before_any_unpickling(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    data = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", f"touch {canary}"),
               "TUPLE1", "REDUCE", "STOP")
    with pytest.raises(Decline, match=r"os\.system"):
        _load(data)
    assert not canary.exists()


def test_even_an_allowed_dangerous_global_is_only_a_stub(tmp_path: Path) -> None:
    """find_class never returns a real object: calling the stub declines."""
    canary = tmp_path / "pwned"
    data = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", f"touch {canary}"),
               "TUPLE1", "REDUCE", "STOP")
    with pytest.raises(Decline, match=r"call of os\.system"):
        fast_load(data, allowed=lambda full: True, check_pid=_ok_pid)
    assert not canary.exists()


def test_setitem_on_a_list_is_declined() -> None:
    # torch: "Can only SETITEM for dict, collections.OrderedDict, collections.Counter"
    data = asm(("PROTO", 2), "EMPTY_LIST", "MARK", ("BININT1", 1), "APPENDS",
               ("BININT1", 0), ("BININT1", 7), "SETITEM", "STOP")
    assert pickle.loads(data) == [7]  # the C unpickler alone would accept it
    with pytest.raises(Decline):
        _load(data)


def test_lists_still_load_through_the_rewrite() -> None:
    data = asm(("PROTO", 2), "EMPTY_LIST", ("BINPUT", 0), "MARK", ("BININT1", 1),
               ("BININT1", 2), "APPENDS", ("BINGET", 0), "TUPLE2", "STOP")
    root = _load(data).root
    assert root == ([1, 2], [1, 2]) and root[0] is root[1]


def test_huge_memo_index_costs_nothing() -> None:
    data = asm(("PROTO", 2), "NONE", ("LONG_BINPUT", 0xFFFFFFF0), "STOP")
    with pytest.raises(Decline, match="memo"):
        _load(data)


def _sparse_memo_pickle(size: int, index: int) -> bytes:
    """`size` bytes of pickle whose one memo entry is at `index`: (a long string without a
    b"r", None put at the index)."""
    def pickle_of(text: str) -> bytes:
        return asm(("PROTO", 2), ("BINUNICODE", text), "NONE", ("LONG_BINPUT", index),
                   "TUPLE2", "STOP")
    return pickle_of("a" * (size - len(pickle_of(""))))


def test_a_memo_index_no_pickler_writes_is_declined() -> None:
    """The C memo is an array of 16 bytes per index: an index near the pickle's size (the
    old cap) made an 8 MB pickle cost 128 MB. Now it goes to the exact interpreters."""
    data = _sparse_memo_pickle(8 << 20, (8 << 20) - 64)
    assert b"r" not in data[:-10]
    with pytest.raises(Decline, match="memo"):
        _load(data)


def test_the_scan_of_a_sparse_memo_stays_small() -> None:
    """End to end: the scan of that pickle costs a few times the pickle, not the index x 16."""
    import tracemalloc

    from ckptguard.core.scan import scan_bytes

    data = _sparse_memo_pickle(8 << 20, (8 << 20) - 64)
    tracemalloc.start()
    try:
        report = scan_bytes(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.verdict == "safe" and report.weights_only.policy_accepts
    assert peak < 6 * len(data), f"{peak:,} bytes traced for an {len(data):,}-byte pickle"


def test_every_memo_index_a_pickler_writes_passes() -> None:
    """1.1 M memo entries (past the floor): every LONG_BINPUT index the pickler wrote is
    under the cap, and the walk takes the pickle."""
    data = pickle.dumps([f"k{i}" for i in range(1_100_000)], protocol=2)
    # the list is entry 0, then one entry per string: the last string's LONG_BINPUT ends the
    # last batch (APPENDS, STOP)
    assert data[-7] == pickle.LONG_BINPUT[0] and data[-2:] == pickle.APPENDS + pickle.STOP
    last = int.from_bytes(data[-6:-2], "little")
    assert last == 1_100_000 > 1 << 20
    tokenize(data, lambda name: False)   # no Decline
    assert last < memo_index_cap(data)


def test_the_cap_is_counted_only_when_an_index_past_the_floor_needs_it() -> None:
    """Counting a pickle's b"r" bytes is a pass over all of it (~40 ms per 100 MB): a pickle
    whose memo indexes stay under the floor, as a big torch.save pickle's mostly do, never
    pays it."""
    data = pickle.dumps([f"k{i}" for i in range(600_000)], protocol=2)
    assert len(data) // 5 + 256 > 1 << 20   # large enough that the cap would count
    with mock.patch("ckptguard.core.pickle.fast.tokenize.memo_index_cap",
                    side_effect=AssertionError("counted")):
        tokenize(data, lambda name: False)


def test_past_the_floor_the_run_takes_the_indexes_the_pickle_could_number() -> None:
    """A pickle of 2.2 M memo entries: once the loop meets an index past 2**20 it counts the
    cap (~2.2 M) and the run takes indexes below 2**21 from there (a million-tensor pickle
    would otherwise reach the loop at every PUT). An index past the cap, even below 2**22,
    still reaches the loop and is declined."""
    count = 2_200_000
    batches = (b"(" + b"".join(b"Nr" + i.to_bytes(4, "little") for i in range(start, start + 1000))
               + b"e" for start in range(1, count, 1000))   # as pickle writes a list
    data = b"\x80\x02]q\x00" + b"".join(batches) + b"."
    assert 1 << 21 <= memo_index_cap(data) < 2_500_000
    from ckptguard.core.pickle.fast import tokenize as walk

    with mock.patch.object(walk, "run_pattern", wraps=walk.run_pattern) as patterns:
        assert tokenize(data, lambda name: False).end == len(data)
    assert [c.args[1] for c in patterns.call_args_list] == [20, 21]   # index bits of the run
    past = data[:-1] + b"(Nr" + (2_500_000).to_bytes(4, "little") + b"e."
    with pytest.raises(Decline, match="memo index out of range"):
        tokenize(past, lambda name: False)


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=6),
    max_leaves=60)


@settings(max_examples=200, deadline=None)
@given(value=_VALUES, copies=st.integers(1, 3))
def test_the_memo_cap_holds_for_what_picklers_write(value: Any, copies: int) -> None:
    """With no floor, the cap is still above every index the C and Python picklers write
    (protocol 2, torch.save's, and the highest): the rule, not the floor, keeps real
    pickles on the fast path."""
    obj = [value] * copies + [[value, value]]
    for dumps in (pickle.dumps, pickle._dumps):  # type: ignore[attr-defined]
        for protocol in (2, pickle.HIGHEST_PROTOCOL):
            data = dumps(obj, protocol=protocol)
            indexes = [arg for op, arg, _ in pickletools.genops(data)
                       if op.name in ("BINPUT", "LONG_BINPUT", "PUT")]
            with mock.patch("ckptguard.core.pickle.fast.tokenize._MAX_MEMO_INDEX_FLOOR", 0):
                cap = memo_index_cap(data)
            assert max(indexes, default=-1) < cap


@pytest.mark.parametrize("kwargs", [
    {"size": (3,), "numel": 2},                 # view past the storage
    {"offset": 1, "numel": 2},                  # offset pushes it past
    {"size": (2, 2), "stride": (2,)},           # size/stride length mismatch
])
def test_tensor_arguments_torch_rejects_are_declined(kwargs: dict[str, Any]) -> None:
    with pytest.raises(Decline):
        _load(_tensor_pickle(**kwargs))


def test_zero_numel_allows_any_offset() -> None:
    _load(_tensor_pickle(size=(0,), offset=9))


def test_truncated_pickle_is_declined() -> None:
    data = _tensor_pickle()
    for cut in (1, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(Decline):
            _load(data[:cut])


@pytest.mark.torch
def test_real_torch_state_dict_loads_fast(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    data = zipfile.ZipFile(path).read("m/data.pkl")
    result = _load(data, ALLOWED)
    assert set(result.root) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert result.root.__dict__["_metadata"][""]["version"] == 1  # BUILD applied like torch
    assert [p.pid[2] for p in result.persids] == ["0", "1", "2", "3"]
    assert result.tokens.end == len(data)
