"""A pickle's LONG4 can hold an integer of any size; CPython's `str` and `json` refuse one past
4,300 digits. A red team's 3.9 KB zip whose storage declares such a numel made `ckptguard scan
--format json` exit 70 with half a report (the service: 500); with the record present the scan
itself broke on a message (INTERNAL_ERROR). A row holding such an integer is not listed (no
tensor torch builds has one: a LIMIT_REPORT finding says so), and messages show its size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from ckptguard.app.cli import main
from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from ckptguard.core.values import brief
from tests.builders.torchlayout import torch_layout

HUGE = 1 << 20_000


def _long4(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(raw)) + raw


def _checkpoint(numel: int, record: bool) -> bytes:
    pid = (b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu"
           + _long4(numel) + b"tQ")
    pkl = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(" + pid
           + b"J\x00\x00\x00\x00(J\x01\x00\x00\x00t(J\x01\x00\x00\x00t\x89"
           + b"ccollections\nOrderedDict\n)RtRs.")
    return torch_layout("archive", pkl, [("0", bytes(4))] if record else [])


@pytest.mark.parametrize("record", [True, False], ids=["record", "no record"])
@pytest.mark.parametrize("engine", ["auto", "exact"])
def test_a_row_holding_an_unwritable_integer_is_not_listed(record: bool, engine: str) -> None:
    report = scan_bytes(_checkpoint(HUGE, record), options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    text = json.dumps(report.to_json())   # writable at all
    assert report.verdict != "safe" and report.storages == []
    cut = [f for f in report.findings if f.code is Code.LIMIT_REPORT]
    assert cut and "past 4,300 digits" in cut[0].message
    assert Code.INTERNAL_ERROR.value not in text


def test_the_command_line_writes_the_report(tmp_path: Path) -> None:
    path = tmp_path / "huge.pt"
    path.write_bytes(_checkpoint(HUGE, record=False))
    out = tmp_path / "out.json"
    status = main(["scan", str(path), "--format", "json", "-o", str(out)])
    assert status != 70 and json.loads(out.read_text())["storages"] == []


def test_messages_show_a_huge_integer_by_its_size() -> None:
    assert brief(HUGE) == f"<int of {HUGE.bit_length()} bits>" and brief(12345) == "12345"


@pytest.mark.parametrize("view", [False, True], ids=["numel", "view offset"])
def test_a_legacy_stream_with_an_unwritable_integer_gets_a_report(view: bool) -> None:
    """A review: the legacy reader's size messages wrote such an integer (INTERNAL_ERROR)."""
    from tests.core.legacy.conftest import stream

    numel = 4 if view else HUGE
    meta = (b"(X\x01\x00\x00\x00v" + _long4(HUGE) + b"K\x01t") if view else b"N"
    pid = (b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu"
           + _long4(numel) + meta + b"tQ")
    main = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(" + pid
            + b"K\x00K\x01\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRs.")
    data = stream(main, ["0"], [(4, bytes(16))])
    for engine in ("auto", "exact"):
        report = scan_bytes(data, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        json.dumps(report.to_json())
        assert Code.INTERNAL_ERROR not in {f.code for f in report.findings}
        assert report.verdict != "safe"
