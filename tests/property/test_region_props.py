"""Invariant: whatever a region holds, the scan gives a report, stays within the region
budget, and never calls an otherwise clean file `invalid` because of it."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core import records
from ckptguard.core.errors import Code
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from tests.builders.carriers import CARRIERS
from tests.builders.pickle_asm import OPCODES

LIMITS = records.replace(DEFAULT_LIMITS, max_region_bytes=6000, region_sniff_bytes=512,
                         max_regions=8)
# carriers whose region is outside the archive's own records: the rest of the file is clean
REGION_ONLY = ("appended", "gap_between_records", "unreferenced_record", "unreferenced_deflated",
               "encrypted_flag_entry", "unsupported_method_entry", "zip_in_record",
               "prepended_local_record", "tar_member", "generic_zip_member")
_OPS = sorted({code for code, _kind, _proto in OPCODES.values()})


@st.composite
def region_content(draw: st.DrawFn) -> bytes:
    """Raw bytes, or bytes that start like a pickle (PROTO, a zip header, opcode soup)."""
    body = draw(st.binary(max_size=3000))
    start = draw(st.sampled_from([b"", b"\x80\x02", b"\x80\x04\x95", b"PK\x03\x04", b"(",
                                  b"c", b"\x8c"]))
    soup = b"".join(draw(st.lists(st.sampled_from(_OPS), max_size=40)))
    return start + soup + body


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(REGION_ONLY), region_content())
def test_any_region_content_is_judged_within_budget(carrier: str, content: bytes) -> None:
    build: Callable[[bytes], bytes] = CARRIERS[carrier][0]
    report = scan_bytes(build(content), options=ScanOptions(limits=LIMITS))
    codes = {f.code for f in report.findings}
    assert Code.INTERNAL_ERROR not in codes, report.findings
    assert report.io.get("region_bytes_read", 0) <= LIMITS.max_region_bytes
    assert report.verdict != "invalid", report.findings
    report.to_json()
