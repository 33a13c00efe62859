"""Past a cap of `Limits`, every engine gives one report (helper hunt, fast-path walk).

The exact interpreters (core.pickle.vm, core.torch.weights_only) stop at the interpreter
caps (MARK nesting, stack, opcodes, memo entries, container items, one string) with a
LIMIT_* finding and verdict invalid. The C unpickler behind the fast paths (core.pickle.fast.
stubs behind the general path, core.pickle.fast.column_stubs behind the torch-zip lane)
checks none of them, so the opcode walk in front of it (core.pickle.fast.tokenize) declines
every pickle that might reach one: MARK nesting counted exactly, the others bounded from the
bytes walked. Once a 20 KB pickle nested past max_depth was `safe` through the fast paths and
`invalid` through the exact ones; the other caps need tens of megabytes by default, so they
are shown with smaller limits.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core import records
from ckptguard.core.errors import Decline, LimitExceeded
from ckptguard.core.judge import SMALL_PICKLE_BYTES
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.fast.tokenize import tokenize
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.torch.weights_only import emulate
from tests.agreement import assert_agree
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout
from tests.builders.torchsave import torch_data_pkl


def _marks(depth: int, pad: int = 0) -> bytes:
    """{'pad': 'x' * pad, 'a': ((...(),...),)} built with `depth` nested MARK ... TUPLE."""
    return (b"\x80\x02}q\x00(X\x03\x00\x00\x00padX" + pad.to_bytes(4, "little") + b"x" * pad
            + b"X\x01\x00\x00\x00a" + b"(" * depth + b"t" * depth + b"u.")


@pytest.mark.parametrize("container", ["pickle", "torch-zip"])
def test_mark_nesting_past_max_depth_gets_one_report(container: str) -> None:
    pkl = _marks(DEFAULT_LIMITS.max_depth + 1)
    assert len(pkl) >= SMALL_PICKLE_BYTES   # large enough for the fast paths to run first
    report = assert_agree(pkl if container == "pickle" else torch_layout("archive", pkl))
    assert report["verdict"] == "invalid"
    assert "LIMIT_DEPTH" in {f["code"] for f in report["findings"]}


def test_mark_nesting_is_counted_not_bounded() -> None:
    """Up to the cap exactly, the walk and the exact interpreters take the pickle; one MARK
    more, both stop (the dict's own batch is the first level)."""
    limits = records.replace(DEFAULT_LIMITS, max_depth=50)
    for depth, within in ((49, True), (50, False)):
        pkl = _marks(depth)
        assert (_exact_caps_hit(pkl, limits) == []) is within
        if within:
            assert tokenize(pkl, lambda name: True, limits=limits).end == len(pkl)
        else:
            with pytest.raises(Decline, match="max_depth"):
                tokenize(pkl, lambda name: True, limits=limits)


def _flat(count: int) -> bytes:
    return b"\x80\x02]q\x00(" + b"N" * count + b"e."


_N = 2 * SMALL_PICKLE_BYTES
# cap -> (a pickle just past a cap of 1,000, that cap's field)
_PAST_A_CAP = {
    "max_depth": (_marks(1_001, _N), "max_depth"),
    "max_stack": (b"\x80\x02" + b"N" * _N + b".", "max_stack"),
    # each tuple closes its own MARK and leaves one item: the list's batch holds them all
    "max_stack, in tuples": (b"\x80\x02]q\x00(" + b"(NNNNt" * (_N // 6) + b"e.", "max_stack"),
    "max_opcodes": (_flat(_N), "max_opcodes"),
    "max_container_items": (_flat(_N), "max_container_items"),
    "max_memo_entries": (b"\x80\x02]q\x00(" + b"".join(b"Nr" + i.to_bytes(4, "little")
                                                      for i in range(1, 1_500)) + b"e.",
                         "max_memo_entries"),
    "max_str_bytes": (b"\x80\x02X" + _N.to_bytes(4, "little") + b"x" * _N + b".", "max_str_bytes"),
}


@pytest.mark.parametrize("cap", sorted(_PAST_A_CAP))
def test_a_pickle_past_any_interpreter_cap_gets_one_report(cap: str) -> None:
    pkl, field = _PAST_A_CAP[cap]
    assert len(pkl) >= SMALL_PICKLE_BYTES
    limits = records.replace(DEFAULT_LIMITS, **{field: 1_000})
    report = assert_agree(pkl, limits=limits)
    assert report["verdict"] == "invalid"
    assert any(f["code"].startswith("LIMIT_") for f in report["findings"])


def test_a_memo_is_bounded_by_its_largest_index() -> None:
    """With a cap above the walk's 2**20 floor the bound is the largest index the walk saw:
    a pickler's memo of exactly the cap's size is walked, one entry more is declined."""
    count = (1 << 20) + 20
    pkl = (b"\x80\x02]q\x00(" + b"".join(b"Nr" + i.to_bytes(4, "little") for i in range(1, count))
           + b"e.")
    at_cap = records.replace(DEFAULT_LIMITS, max_memo_entries=count)
    assert tokenize(pkl, lambda name: True, limits=at_cap).end == len(pkl)
    with pytest.raises(Decline, match="max_memo_entries"):
        tokenize(pkl, lambda name: True, limits=records.replace(at_cap, max_memo_entries=count - 1))


# ---- the property: whatever the walk accepts under some limits, no exact interpreter stops
# at a cap of those limits (so the fast paths can never answer where they would say invalid)

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40) | st.floats(allow_nan=False)
    | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=3), inner, max_size=6)
    | st.tuples(inner, inner) | st.lists(inner, max_size=6).map(tuple),
    max_leaves=60)

_small_limits = st.builds(
    lambda depth, stack, opcodes, memo, items, string: records.replace(
        DEFAULT_LIMITS, max_depth=depth, max_stack=stack, max_opcodes=opcodes,
        max_memo_entries=memo, max_container_items=items, max_str_bytes=string),
    st.integers(1, 12), st.integers(1, 400), st.integers(1, 1_500), st.integers(1, 300),
    st.integers(1, 400), st.integers(255, 600))


def _exact_caps_hit(data: bytes, limits: Limits) -> list[str]:
    hit = []
    vm = run_vm(data, limits=limits)
    if isinstance(vm.error, LimitExceeded):
        hit.append(f"vm: {vm.error.message}")
    wo = emulate(data, limits=limits)
    if wo.error is not None and wo.error.type == "LimitExceeded":
        hit.append(f"weights_only: {wo.error}")
    return hit


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, limits=_small_limits, copies=st.integers(1, 3))
def test_what_the_walk_accepts_no_exact_interpreter_stops_at_a_cap(
        value: Any, limits: Limits, copies: int) -> None:
    data = pickle.dumps([value] * copies if copies > 1 else value, protocol=2)
    try:
        tokenize(data, lambda name: True, limits=limits)
    except Decline:
        return
    assert _exact_caps_hit(data, limits) == [], limits


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, limits=_small_limits)
def test_every_engine_gives_one_report_under_any_limits(value: Any, limits: Limits) -> None:
    """The general engine tries the fast path first on every pickle, the exact engine never."""
    assert_agree(pickle.dumps(value, protocol=2), limits=limits)


# ---- and the bounds leave real checkpoints on the fast paths under the default limits

@pytest.mark.torch
def test_a_training_checkpoint_is_walked_under_the_default_limits() -> None:
    """Model, optimizer state (a dict per parameter), param groups, a schedule, nested lists
    and tuples: every MARK outside a tensor entry is counted, none reaches a cap."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(40)))
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
                  "history": [(i, float(i), "x" * 200, [i, i + 1, i + 2, i + 3]) for i in range(3_000)],
                  "shape": (1, 2, 3, 4, 5, 6)}
    data = torch_data_pkl(checkpoint)
    toks = tokenize(data, lambda name: True, limits=DEFAULT_LIMITS)
    assert toks.end == len(data)


def test_a_string_cap_under_what_the_walk_takes_unchecked_declines_every_pickle() -> None:
    """The regex takes strings of up to 255 bytes without Python (short BINUNICODE,
    SHORT_BINSTRING, LONG1): under such a cap only the exact interpreters can check them."""
    pkl = pickle.dumps(["a" * 100], protocol=2)
    assert tokenize(pkl, lambda name: True).end == len(pkl)
    with pytest.raises(Decline, match="string cap"):
        tokenize(pkl, lambda name: True, limits=records.replace(DEFAULT_LIMITS, max_str_bytes=254))


@pytest.mark.torch
@pytest.mark.parametrize("max_depth", [1, 2, 3, 4])
def test_the_runs_own_nesting_counts_against_max_depth(max_depth: int) -> None:
    """A tensor entry nests two MARKs inside the state_dict's batch, a flat tuple one: the walk
    takes them in one regex branch only where that nesting fits under the cap, and
    otherwise walks each MARK itself. Views of one storage (its key from the memo), shapes of
    4 dims (MARK ... TUPLE), a list of 4-tuples."""
    torch = pytest.importorskip("torch")
    base = torch.arange(48.0)
    data = torch_data_pkl({"a": base[:24].view(1, 2, 3, 4), "b": base[24:], "c": base[1:5],
                      "rows": [(1, 2, 3, 4), (5, 6, 7, 8)]})
    limits = records.replace(DEFAULT_LIMITS, max_depth=max_depth)
    hit = _exact_caps_hit(data, limits)
    try:
        tokenize(data, lambda name: True, limits=limits)
    except Decline:
        assert hit, "declined, but no exact interpreter stops at a cap"
        return
    assert not hit


def _entry_below_memoized_globals() -> bytes:
    """{'g': _rebuild_tensor_v2, 's': FloatStorage, 'o': OrderedDict, ..., 't': a tensor}: the
    globals are memoized in the dict's batch, so the tensor entry is all GETs and the walk's
    regex takes it in one branch, two MARKs below the batch's."""
    return asm(("PROTO", 2), "EMPTY_DICT", ("BINPUT", 0), "MARK",
               ("BINUNICODE", "g"), ("GLOBAL", "torch._utils", "_rebuild_tensor_v2"), ("BINPUT", 1),
               ("BINUNICODE", "s"), ("GLOBAL", "torch", "FloatStorage"), ("BINPUT", 2),
               ("BINUNICODE", "o"), ("GLOBAL", "collections", "OrderedDict"), ("BINPUT", 3),
               ("BINUNICODE", "k"), ("BINUNICODE", "storage"), ("BINPUT", 4),
               ("BINUNICODE", "c"), ("BINUNICODE", "cpu"), ("BINPUT", 5),
               ("BINUNICODE", "t"), ("BINPUT", 6),
               ("BINGET", 1), "MARK", "MARK", ("BINGET", 4), ("BINGET", 2), ("BINUNICODE", "0"),
               ("BINPUT", 7), ("BINGET", 5), ("BININT1", 2), "TUPLE", ("BINPUT", 8), "BINPERSID",
               ("BININT1", 0), ("BININT1", 2), "TUPLE1", ("BINPUT", 9), ("BININT1", 1), "TUPLE1",
               ("BINPUT", 10), "NEWFALSE", ("BINGET", 3), "EMPTY_TUPLE", "REDUCE", ("BINPUT", 11),
               "TUPLE", ("BINPUT", 12), "REDUCE", ("BINPUT", 13), "SETITEMS", "STOP")


@pytest.mark.parametrize("max_depth", [2, 3])
def test_a_tensor_entry_in_one_branch_still_counts_its_two_marks(max_depth: int) -> None:
    data = _entry_below_memoized_globals()
    limits = records.replace(DEFAULT_LIMITS, max_depth=max_depth)
    hit = _exact_caps_hit(data, limits)
    assert bool(hit) is (max_depth == 2), hit
    if hit:
        with pytest.raises(Decline, match="max_depth"):
            tokenize(data, lambda name: True, limits=limits)
    else:
        assert tokenize(data, lambda name: True, limits=limits).end == len(data)


def test_a_run_of_marks_stops_the_walk_at_the_opcode_cap() -> None:
    """MARKs outside a regex branch cost the walk a Python step each: each step takes at least
    one opcode, so past max_opcodes steps the walk declines without walking on (or counting)."""
    from unittest import mock

    pkl = b"\x80\x02](" + b"((tt" * 5_000 + b"e."
    limits = records.replace(DEFAULT_LIMITS, max_opcodes=2_000)
    assert _exact_caps_hit(pkl, limits)
    with mock.patch("ckptguard.core.pickle.fast.tokenize.count_opcodes",
                    side_effect=AssertionError("walked to the end")), \
            pytest.raises(Decline, match=r"pass Limits\.max_opcodes"):
        tokenize(pkl, lambda name: True, limits=limits)
