"""Invariant: any bytes -> a Report (never an exception), for the whole pipeline."""

from __future__ import annotations

import pickle
import zipfile
from io import BytesIO

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.io.source import BytesSource
from ckptguard.core.report import Report
from ckptguard.core.scan import scan_source


def _torchlike_zip() -> bytes:
    buf = BytesIO()
    pkl = pickle.dumps({"a": 1, "b": [1.0, "x"]}, protocol=2)
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/.format_version", b"1")
        zf.writestr("archive/byteorder", b"little")
        zf.writestr("archive/version", b"3\n")
    return buf.getvalue()


SEEDS = [_torchlike_zip(), pickle.dumps({"x": [1, 2, (3, None)]}, protocol=2),
         pickle.dumps(list(range(50)), protocol=0), pickle.dumps({"k": b"v"}, protocol=4)]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.integers(0, 2))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == 0 and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == 1:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[pos:pos + draw(st.integers(1, 16))]
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(), st.binary(max_size=512)))
def test_any_bytes_give_a_report(data: bytes) -> None:
    report = scan_source(BytesSource(data))
    assert isinstance(report, Report)
    assert report.verdict in ("safe", "suspicious", "unsafe", "invalid")
    assert not any(f.code == "INTERNAL_ERROR" for f in report.findings), report.findings
    report.to_json()
