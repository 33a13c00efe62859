"""core.torch.weights_only without torch: API contract, limits, messages, never-raise property."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.limits import Limits
from ckptguard.core.torch.allowlist import ALLOWED_GLOBALS, BASELINE_USER_GLOBALS, safe_globals_hint
from ckptguard.core.torch.rules import BLOCKED_MODULES
from ckptguard.core.torch.torch_error import TorchError, wo_message
from ckptguard.core.torch.weights_only import emulate, unsafe_globals
from ckptguard.core.values import Call, Global, PersId
from tests.builders.pickle_asm import asm
from tests.core.torch_rules.cases import CASES, F16, g, pid, pk, s, v2


class Records:
    def __init__(self, records: dict[str, bytes]) -> None:
        self.records = records
        self.calls: list[tuple[str, int]] = []

    def check(self, key: str, nbytes: int) -> TorchError | None:
        self.calls.append((key, nbytes))
        if f"data/{key}" not in self.records:
            return TorchError("RuntimeError", f"missing data/{key}")
        return None


def test_tables() -> None:
    assert len(ALLOWED_GLOBALS) == 144
    assert BLOCKED_MODULES == {"sys", "os", "posix", "nt"}
    assert "torch.nested._internal.nested_tensor._rebuild_njt" in BASELINE_USER_GLOBALS
    assert "torch._dynamo.decorators._DimRange" not in BASELINE_USER_GLOBALS


def test_plain_pickle_loads_with_inert_values() -> None:
    res = emulate(pickle.dumps({"a": [1, 2.5, "x", None, True], "b": (1,)}, protocol=2))
    assert res.loadable and res.error is None and res.protocol == 2
    assert res.root == {"a": [1, 2.5, "x", None, True], "b": (1,)}


def test_tensor_graph_storages_and_end() -> None:
    data = pk("EMPTY_LIST", "MARK", *v2(pid(key="0")), *v2(pid(key="1", numel=2), size=(2,)),
              *v2(pid(key="0")), "APPENDS")
    rec = Records({"data/0": F16, "data/1": b"\0" * 8})
    res = emulate(data + b"trailing", resolver=rec, base_offset=1000)
    assert res.loadable and res.end == len(data)
    assert [(u.key, u.dtype, u.numel, u.nbytes, u.location) for u in res.storages] == [
        ("0", "float32", 4, 16, "cpu"), ("1", "float32", 2, 8, "cpu")]
    assert all(u.offset >= 1000 for u in res.storages)
    assert rec.calls == [("0", 16), ("1", 8)]  # a repeated key is not looked up again
    t0 = res.root[0]
    assert isinstance(t0, Call) and t0.func == Global("torch._utils", "_rebuild_tensor_v2")
    assert isinstance(t0.args[0], PersId) and t0.attrs["shape"] == (4,)


def test_failure_offset_and_storages_so_far() -> None:
    data = pk("EMPTY_LIST", *v2(pid()), "APPEND", g("os.system"))
    res = emulate(data, resolver=Records({"data/0": F16}), base_offset=7)
    assert not res.loadable and res.error is not None
    assert res.error.type == "UnpicklingError"
    assert res.error.offset == 7 + data.index(b"cos\n")
    assert res.end == data.index(b"cos\n")
    assert [u.key for u in res.storages] == ["0"]


def test_resolver_error_is_returned_verbatim() -> None:
    res = emulate(pk(*v2(pid(key="3"))), resolver=Records({}))
    assert res.error == TorchError("RuntimeError", "missing data/3", res.error.offset if res.error else None)


def test_wrapped_messages() -> None:
    unsup = emulate(pk(g("builtins.eval"))).error
    assert unsup is not None and unsup.wrapped().startswith("Weights only load failed. This file can still")
    assert "WeightsUnpickler error: Unsupported global: GLOBAL eval was not" in unsup.wrapped()
    blocked = emulate(pk(g("os.system"))).error
    assert blocked is not None and "Please file an issue" not in blocked.wrapped()
    njt = emulate(pk(g("torch._dynamo.decorators._DimRange"))).error
    assert njt is not None and njt.wrapped().endswith("trusted source.\n")
    other = TorchError("KeyError", "5")
    assert other.wrapped() == "5"
    assert wo_message("x").endswith("torch.load.html.")


def test_allow_adds_user_globals_but_not_blocked() -> None:
    data = pk(g("argparse.Namespace"), "EMPTY_TUPLE", "NEWOBJ", "EMPTY_DICT", *s("a"), ("BININT1", 1),
              "SETITEM", "BUILD")
    assert not emulate(data).loadable
    assert emulate(data, allow=frozenset({"argparse.Namespace"})).loadable
    res = emulate(pk(g("os.system")), allow=frozenset({"os.system"}))
    assert res.error is not None and "is blocked" in res.error.message


def test_limits_end_the_run_as_limit_exceeded() -> None:
    small = Limits(max_opcodes=10)
    res = emulate(pk(*(["NONE"] * 20)), limits=small)
    assert res.error is not None and res.error.type == "LimitExceeded"
    deep = emulate(asm(("PROTO", 2), *(["MARK"] * 50), "STOP"), limits=Limits(max_depth=10))
    assert deep.error is not None and deep.error.type == "LimitExceeded"
    big = emulate(asm(("PROTO", 2), ("BINUNICODE", "a" * 2000), "STOP"), limits=Limits(max_str_bytes=1000))
    assert big.error is not None and big.error.type == "LimitExceeded"


def test_deep_tuple_nesting_never_raises() -> None:
    data = asm(("PROTO", 2), "EMPTY_DICT", "NONE", *(["TUPLE1"] * 5000), "NONE", "SETITEM", "STOP")
    res = emulate(data)
    assert res.error is None or res.error.type in ("Unmodelled", "LimitExceeded")


def test_unsafe_globals_walk() -> None:
    data = pk(g("os.system"), g("torch.float32"), g("__builtin__.intern"), g("builtins.frozenset"),
              g("argparse.Namespace"))
    assert unsafe_globals(data) == ["argparse.Namespace", "builtins.frozenset", "os.system", "sys.intern"]
    assert unsafe_globals(data, frozenset({"os.system"})) == ["argparse.Namespace", "builtins.frozenset",
                                                              "sys.intern"]
    err = unsafe_globals(asm(("PROTO", 2), ("INT", 1), "STOP"))
    assert isinstance(err, TorchError) and err.message == "Unsupported operand 73"
    assert isinstance(unsafe_globals(b""), TorchError)


def test_safe_globals_hint() -> None:
    assert safe_globals_hint(["numpy.dtype", "argparse.Namespace", "builtins.slice", "numpy.dtype"]) == (
        "import argparse, numpy; torch.serialization.add_safe_globals("
        "[argparse.Namespace, slice, numpy.dtype])")
    assert safe_globals_hint(["builtins.set"]) == "torch.serialization.add_safe_globals([set])"


def test_every_case_is_decided_without_raising() -> None:
    for case in CASES:
        res = emulate(case.pkl, allow=frozenset(case.allow), resolver=Records(case.records))
        assert res.loadable == (res.error is None), case.name
        assert isinstance(unsafe_globals(case.pkl), (list, TorchError))


_SEEDS = [c.pkl for c in CASES if len(c.pkl) > 3]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(data: bytes) -> None:
    res = emulate(b"\x80\x02" + data)
    assert res.loadable == (res.error is None)
    unsafe_globals(b"\x80\x02" + data)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                         max_size=4), st.integers(0, 10_000))
def test_mutated_pickles_never_raise(seed: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    buf = bytearray(seed)
    for pos, value in flips:
        buf[pos % len(buf)] = value
    data = bytes(buf[: max(1, cut % (len(buf) + 1))])
    res = emulate(data, resolver=Records({"data/0": F16}))
    assert res.loadable == (res.error is None)
    if res.error is not None:
        assert isinstance(res.error.type, str) and isinstance(res.error.wrapped(), str)
    emulate(data, legacy=True)
    unsafe_globals(data)


def test_user_factory_function_result_type_is_not_guessed() -> None:
    data = pk(g("mylib.make_thing"), "EMPTY_TUPLE", "REDUCE", "EMPTY_DICT", "BUILD")
    res = emulate(data, allow=frozenset({"mylib.make_thing"}))
    assert res.error is not None and res.error.type == "Unmodelled"
    cls = pk(g("mylib.Thing"), "EMPTY_TUPLE", "REDUCE", "EMPTY_DICT", "BUILD")
    assert emulate(cls, allow=frozenset({"mylib.Thing"})).loadable


def test_baseline_user_global_calls_are_not_claimed() -> None:
    data = pk(g("torch.nested._internal.nested_tensor._rebuild_njt"), "EMPTY_TUPLE", "REDUCE")
    res = emulate(data)
    assert res.error is not None and res.error.type == "Unmodelled"


def test_memoryview_input_and_offsets() -> None:
    data = b"junk" + pk("EMPTY_DICT", ("BINPUT", 0), g("os.system"))
    res = emulate(memoryview(data)[4:], base_offset=4)
    assert res.error is not None and res.error.offset == data.index(b"cos")


def test_truncated_huge_string_is_a_short_read_not_a_limit() -> None:
    data = asm(("PROTO", 2), ("BINUNICODE", "ab", {"length": 10**6}))
    res = emulate(data, limits=Limits(max_str_bytes=1000))
    assert res.error is not None and res.error.type == "EOFError"


def test_hostile_sizes_stay_cheap_and_unclaimed() -> None:
    many = ["MARK", *[("LONG1", 2**61)] * 20000, "TUPLE"]
    data = pk(*v2(pid(), size=(1,)))
    assert emulate(data, resolver=Records({"data/0": F16})).loadable
    big = pk(g("torch._utils._rebuild_tensor_v2"), "MARK", *pid(), ("BININT1", 0), *many, *many,
             "NEWFALSE", g("collections.OrderedDict"), "EMPTY_TUPLE", "REDUCE", "TUPLE", "REDUCE")
    res = emulate(big, resolver=Records({"data/0": F16}))
    assert res.error is not None and res.error.type == "Unmodelled"
    cplx = pk(g("builtins.complex"), ("LONG1", 10**400), "TUPLE1", "REDUCE")
    res = emulate(cplx)
    assert res.error is not None and res.error.type == "Unmodelled"
    huge_list = pk("EMPTY_LIST", "MARK", *[("BININT1", 1)] * 20000, "APPENDS", "EMPTY_TUPLE", "REDUCE")
    res = emulate(huge_list)
    assert res.error is not None and res.error.type == "Unmodelled"
