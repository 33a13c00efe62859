"""An opcode across a FRAME's end (CPython issue 154848, fickling's
test_frame_boundary_divergence): pickle.load(file) — how torch.load(weights_only=False)
reads data.pkl, from a BytesIO — reads the argument from after the frame, pickle.loads and
a linear reader from inside it. The hidden opcodes run under pickle.load and are invisible
to the VM, so the framing itself is the evidence: PICKLE_FRAME_DIVERGENCE, unsafe."""

from __future__ import annotations

import contextlib
import io
import pickle
import re
import resource
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code
from ckptguard.core.pickle.frames import file_reader_view
from ckptguard.core.pickle.vm import run_vm
from tests.builders.pickle_asm import asm

HIDDEN = asm(("GLOBAL", "os", "system"), ("UNICODE", "id"), "TUPLE1", "REDUCE")


def straddling() -> bytes:
    """A 2-byte FRAME holding BINBYTES' opcode and one length byte: pickle.loads reads a
    263-byte string that swallows HIDDEN; pickle.load(BytesIO) reads the length from after
    the frame (1 byte) and then runs HIDDEN."""
    return asm(("PROTO", 5), "NONE", ("UNICODE", "a" * (8192 * 16 - 17)), "POP", "MARK",
               ("FRAME", 2), ("RAW", b"B\x07\x01\x00\x00\x00\x00"),
               ("RAW", (HIDDEN + b"(").ljust(256 + 5, b"N")), "POP_MARK", "STOP")


class Recorder(pickle.Unpickler):
    """CPython's C unpickler with a find_class that records instead of importing."""

    def __init__(self, file: Any, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.imported: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.imported.append((module, name))
        return lambda *a: None


def test_the_readers_really_disagree() -> None:
    data = straddling()
    from_file = Recorder(io.BytesIO(data))
    from_file.load()
    assert from_file.imported == [("os", "system")]
    assert pickle.loads(data) is None                      # loads imports nothing
    # the VM reads linearly like loads, and then replays what the file reader runs: the
    # hidden import is judged at its place in the file
    [hidden] = run_vm(data).globals
    assert (hidden.module, hidden.name) == ("os", "system")
    assert data[hidden.offset:hidden.offset + 10] == b"cos\nsystem"


def test_the_hidden_payload_is_named() -> None:
    """Not only "the framing diverges": the call the file reader makes is a finding."""
    from ckptguard.core.scan import scan_bytes

    report = scan_bytes(straddling())
    assert report.verdict == "unsafe"
    [call] = [f for f in report.findings if f.code is Code.PICKLE_DANGEROUS_CALL]
    assert "os.system('id')" in call.message
    assert straddling()[call.offset:call.offset + 1] == b"R"      # the REDUCE, in the file


# -- the file reader's view is what the C unpickler reads from a file ----------------------


@contextlib.contextmanager
def _address_space_capped(headroom: int = 1 << 30) -> Iterator[None]:
    """The process's address space capped at its current size + `headroom` for the block.

    Why: the C unpickler keeps its memo in an array of 16 bytes per index and zero-fills it
    up to the largest index put. A frame that ends inside a LONG_BINPUT's argument makes the
    file reader take other bytes for the index (e.g. 0x52000001: a 22 GB array), and the
    kernel lets the oracle touch it until the OOM killer ends the test worker. Under the cap
    that is a MemoryError, an outcome like the others."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        size = int(statm.read().split()[0]) * resource.getpagesize()
    cap = size + headroom if hard == resource.RLIM_INFINITY else min(size + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _shown(value: Any) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def _load_from_file(data: bytes) -> tuple[str, Any, list[tuple[str, str]]]:
    rec = Recorder(io.BytesIO(data))
    try:
        with _address_space_capped():
            return "ok", rec.load(), rec.imported
    except Exception as exc:   # the outcome is what is compared
        return type(exc).__name__, None, rec.imported


def test_a_huge_memo_index_is_an_outcome_not_a_lost_worker() -> None:
    """The index the file reader took in a generated case (hypothesis found it): 16 bytes
    x 0x52000001 is no allocation a test worker may make."""
    data = asm(("PROTO", 2), "NONE", ("LONG_BINPUT", 0x52000001), "STOP")
    assert _load_from_file(data)[0] == "MemoryError"
    assert _load_from_file(asm(("PROTO", 2), "NONE", ("LONG_BINPUT", 7), "STOP"))[0] == "ok"


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_file_reader_view_matches_the_c_unpickler(draw: st.DataObject) -> None:
    """Random FRAMEs dropped at opcode boundaries of a real pickle (lengths that end inside
    an opcode, inside another frame, anywhere): reading the view linearly gives what
    pickle.load(BytesIO) gives, imports included."""
    import pickletools

    value = draw.draw(JSONISH)
    protocol = draw.draw(st.sampled_from([0, 1, 2]))   # text opcodes (lines) too
    raw = pickle.dumps(["x", value, HIDDEN], protocol=protocol)
    raw = raw[2:] if raw[:1] == b"\x80" else raw        # no PROTO, no frames
    bounds = [pos for _, _, pos in pickletools.genops(raw)][1:]
    cuts = sorted(draw.draw(st.sets(st.sampled_from(bounds or [0]), max_size=4)))
    out, last = bytearray(b"\x80\x05"), 0
    for cut in cuts:
        out += raw[last:cut]
        out += b"\x95" + draw.draw(st.integers(0, 64)).to_bytes(8, "little")
        last = cut
    data = bytes(out + raw[last:])
    view = file_reader_view(data)
    linear = view.data if view is not None else data
    got = _load_from_file(linear)
    want = _load_from_file(data)
    assert got[2] == want[2]
    if want[0] == "ok":   # (by repr: frames cut anywhere can make a list that holds itself;
        # the imported stand-ins' addresses differ between the two loads)
        assert got[0] == want[0] and _shown(got[1]) == _shown(want[1])


def test_straddling_frame_is_unsafe(judge: Any) -> None:
    an, verdict = judge(straddling())
    assert verdict == "unsafe"
    text = "\n".join(f.message for f in an.findings if f.code == Code.PICKLE_FRAME_DIVERGENCE)
    assert "BINBYTES at" in text and "past the end of the FRAME" in text


def test_frame_opened_inside_a_frame_is_unsafe(judge: Any) -> None:
    inner = asm(("FRAME", 2), "NONE", "POP")
    data = asm(("PROTO", 4), ("FRAME", len(inner) + 2), ("RAW", inner), "NONE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert any("starts before the end of the frame" in f.message for f in an.findings
               if f.code == Code.PICKLE_FRAME_DIVERGENCE)


@pytest.mark.parametrize("protocol", [4, 5])
def test_pickler_output_never_diverges(protocol: int) -> None:
    big = {f"k{i}": ("x" * (i % 300), list(range(i % 50)), b"y" * (i % 200)) for i in range(3000)}
    data = pickle.dumps(big, protocol=protocol)
    r = run_vm(data)
    assert r.complete and "FRAME" in r.opcodes_used
    assert all(code != Code.PICKLE_FRAME_DIVERGENCE for code, _, _ in r.notes)


JSONISH = st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=300),
                                 st.binary(max_size=300)),
                       lambda inner: st.one_of(st.lists(inner, max_size=20),
                                               st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=20)),
                       max_leaves=200)


@settings(max_examples=100, deadline=None)
@given(JSONISH, st.sampled_from([4, 5]))
def test_pickler_output_never_diverges_property(value: Any, protocol: int) -> None:
    r = run_vm(pickle.dumps(value, protocol=protocol))
    assert r.complete
    assert all(code != Code.PICKLE_FRAME_DIVERGENCE for code, _, _ in r.notes)


def test_torch_load_reads_the_hidden_opcodes() -> None:
    """torch.load(weights_only=False) unpickles data.pkl from a BytesIO with the pickle
    module's Unpickler: a recording one shows the import the scan's reading never sees."""
    torch = pytest.importorskip("torch")
    import types

    from tests.canary.test_never_executes import torch_zip

    seen: list[tuple[str, str]] = []

    class TorchRecorder(Recorder):
        def find_class(self, module: str, name: str) -> Any:
            seen.append((module, name))
            return lambda *a: None

    module = types.SimpleNamespace(Unpickler=TorchRecorder, __name__="recording_pickle")
    torch.load(io.BytesIO(torch_zip(straddling())), weights_only=False, pickle_module=module)
    assert ("os", "system") in seen
