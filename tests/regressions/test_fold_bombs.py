"""The constant folder computed a `%` or a `format` before checking its size: a red team's
117-byte pickle (a STACK_GLOBAL module of `"%s" * 32768 % (("a" * 65536),) * 32768`, every
input under the 64 KiB fold cap) built a 2 GiB string (4 GiB with 4-byte characters), and
the threat analysis folded it again per call (291 bytes: 15 s, 2 GB); under the command
line's memory limit the scan ended `invalid` and an os.system after it went unreported. The
result's size is bounded from the arguments first: every field may print the widest one."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions


def _text(s: str) -> bytes:
    raw = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _call(module: str, name: str, *args: bytes) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode() + b"(" + b"".join(args) + b"tR"


def _int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def _bomb(kind: str) -> bytes:
    item = _call("operator", "mul", _text("a"), _int(65536))
    if kind == "percent":
        fmt = _call("operator", "mul", _text("%s"), _int(32768))
        args = _call("operator", "mul", item + b"\x85", _int(32768))
        module = _call("operator", "mod", fmt, args)
    else:   # "{0}" * 16384 .format(item)
        fmt = _call("operator", "mul", _text("{0}"), _int(16384))
        module = _call("operator", "methodcaller", _text("format"), item) + b"(" + fmt + b"tR"
    evil = b"cos\nsystem\n(" + _text("true") + b"tR0"
    return b"\x80\x04" + evil + module + _text("b") + b"\x93."


@pytest.mark.parametrize("kind", ["percent", "format"])
@pytest.mark.parametrize("engine", ["auto", "exact"])
def test_a_formatting_bomb_is_refused_before_it_is_built(kind: str, engine: str) -> None:
    tracemalloc.start()
    try:
        report = scan_bytes(_bomb(kind), options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak   # 2 GiB on the old code
    codes = {f.code for f in report.findings}
    assert report.verdict == "unsafe" and Code.PICKLE_DANGEROUS_CALL in codes
    assert Code.PICKLE_COMPUTED_IMPORT in codes   # the module is not folded: computed
