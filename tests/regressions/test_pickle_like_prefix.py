"""Issue 18 item 2: an archive behind a prefix whose first byte also starts a pickle.

One byte is all the sniffer sees of a pickle without PROTO: `MZ` (a self-extractor's
executable) is BININT2, `Copyright ...` SHORT_BINBYTES, `(` MARK. Such a prefix used to make
the file a broken pickle (`invalid`) and hide the archive. Now the archive is judged as
Python's zipfile reads it, and the prefix as what `pickle.load` (and torch's legacy path,
which unpickles from byte 0) would run: a payload there is REGION_PAYLOAD.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from typing import Any

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_bytes
from tests.builders.carriers import CLEAN_PKL, PREFIX, _members
from tests.builders.pickle_asm import asm
from tests.core.zip.zipbuild import build_zip

PAYLOAD = asm(("GLOBAL", "os", "system"), ("BINUNICODE", "echo pwned"), "TUPLE1", "REDUCE",
              "STOP")                  # no PROTO: protocol 1, as a stub's first bytes would be
# the first byte of each: a pickle opcode pickle.load starts running
STUBS = {
    "self-extractor": b"MZ\x90\x00\x03\x00\x00\x00" + b"\x00" * 56,
    "licence text": b"Copyright 2026 someone. All rights reserved.\n",
    "mark": b"(junk that is no pickle)\n",
    "lowercase text": b"checkpoint follows\n",
    "binint": b"J\x01\x02\x03\x04" + b"\xff" * 40,
}


class _Recorder(pickle.Unpickler):
    """pickle.load's own walk, with imports recorded instead of made (nothing runs)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.imports: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.imports.append((module, name))
        return lambda *args: None


@pytest.mark.parametrize("counted", [False, True], ids=["cat-stub-zip", "sfx-offsets"])
@pytest.mark.parametrize("stub", list(STUBS))
def test_the_archive_behind_a_pickle_like_prefix_is_judged(stub: str, counted: bool) -> None:
    data = build_zip(_members(CLEAN_PKL), prepend=STUBS[stub], relative_offsets=not counted)
    with zipfile.ZipFile(io.BytesIO(data)) as z:     # what the tolerant reader sees
        assert z.read(f"{PREFIX}/data.pkl") == CLEAN_PKL
    report = scan_bytes(data)
    assert report.verdict == "suspicious", [(f.code, f.message) for f in report.findings]
    assert report.format == "torch-zip"
    assert {f.code for f in report.findings} >= {Code.ZIP_PREPENDED_DATA}
    assert [t.name for t in report.tensors] == ["w"]


@pytest.mark.parametrize("counted", [False, True], ids=["cat-stub-zip", "sfx-offsets"])
def test_a_pickle_prefix_is_judged_as_pickle_load_runs_it(counted: bool) -> None:
    """The prefix is a region: what pickle.load would import is what the scan names."""
    data = build_zip(_members(CLEAN_PKL), prepend=PAYLOAD, relative_offsets=not counted)
    recorder = _Recorder(data)
    recorder.load()
    assert recorder.imports == [("os", "system")]
    report = scan_bytes(data)
    assert report.verdict == "unsafe"
    [region] = [f for f in report.findings if f.code is Code.REGION_PAYLOAD]
    assert region.offset == 0 and region.message.startswith("the prefix") and "os.system" in region.message
    named = {(g.module, g.name) for g in report.globals}
    assert set(recorder.imports) <= named
    assert [t.name for t in report.tensors] == ["w"]     # and the archive is judged too


def test_a_payload_inside_the_archive_behind_a_stub_is_found() -> None:
    data = build_zip(_members(PAYLOAD), prepend=STUBS["self-extractor"], relative_offsets=True)
    report = scan_bytes(data)
    assert report.verdict == "unsafe"
    assert any(f.code is Code.PICKLE_DANGEROUS_GLOBAL and f.record == f"{PREFIX}/data.pkl"
               for f in report.findings)
