"""core.pickle.window: the opcode-length walk agrees with the VM on where pickles end."""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.io.source import BytesSource
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.pickle.window import PickleWindow, skip_pickle
from ckptguard.core.state import Analysis
from tests.builders.pickle_asm import asm

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=300) | st.just(pickle.dumps),
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=5) | st.frozensets(st.integers(), max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.integers(0, 5), st.binary(max_size=20))
def test_walk_end_equals_vm_end(value: Any, protocol: int, tail: bytes) -> None:
    data = pickle.dumps(value, protocol=protocol)
    buf = data + tail
    assert skip_pickle(buf, 0) == ("end", len(data))
    vm = run_vm(buf)
    assert vm.complete and vm.end == len(data)


@settings(max_examples=200, deadline=None)
@given(_VALUES, st.integers(0, 5), st.data())
def test_walk_resumes_after_any_cut(value: Any, protocol: int, data: st.DataObject) -> None:
    blob = pickle.dumps(value, protocol=protocol)
    cut = data.draw(st.integers(0, len(blob) - 1))
    status, at = skip_pickle(blob[:cut], 0)
    assert status == "more" and at <= cut
    assert skip_pickle(blob, at) == ("end", len(blob))


def test_window_grows_until_stop() -> None:
    body = pickle.dumps(list(range(200_000)), protocol=2)
    src = BytesSource(b"junk" + body + b"\0" * 10)
    window = PickleWindow(src, 1 << 30, start=4, first=4096)
    assert window.pickle_end(0, Analysis()) == len(body)
    assert len(window.buf) < 2 * len(body) + 4096


def test_bad_opcode_and_text_args() -> None:
    assert skip_pickle(b"\xff", 0) == ("bad", 0)
    assert skip_pickle(asm(("GLOBAL", "os", "system"), "STOP"), 0) == ("end", 12)
    assert skip_pickle(b"cos\nsys", 0) == ("more", 0)
    assert skip_pickle(asm(("BINUNICODE", "x", {"length": 10**9}), "STOP"), 0)[0] == "more"
