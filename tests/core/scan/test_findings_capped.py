"""Every finding code is capped (Limits.max_findings_per_code) with a counted remainder: a
report's size follows the kinds of anomaly, not their count (issue 14)."""

from __future__ import annotations

import io
import zipfile

import torch

from ckptguard.core.errors import Code, Severity
from ckptguard.core.limits import Limits
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import Analysis, ScanOptions


def test_findings_past_the_cap_are_counted_not_listed() -> None:
    an = Analysis(ScanOptions(limits=Limits(max_findings_per_code=3)))
    for i in range(10):
        an.add(Code.ZIP_COMMENT, f"comment {i}")
    an.add(Code.ZIP_COMMENT, "louder", severity=Severity.HIGH)   # another severity: kept
    an.capped_findings()
    messages = [f.message for f in an.findings]
    assert messages[:3] == ["comment 0", "comment 1", "comment 2"]
    assert "louder" in messages
    assert any(m.startswith("7 more ZIP_COMMENT findings") for m in messages)
    assert len(an.findings) == 5


def test_unreferenced_members_make_a_bounded_report() -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    with zipfile.ZipFile(buf, "a") as zf:
        for i in range(200):
            zf.writestr(f"archive/extra_{i}", b"")
    data = buf.getvalue()
    capped = scan_bytes(data, options=ScanOptions(limits=Limits(max_findings_per_code=5)))
    full = scan_bytes(data)
    assert capped.verdict == full.verdict
    per_code: dict[str, int] = {}
    for f in capped.findings:
        per_code[f.code] = per_code.get(f.code, 0) + 1
    assert max(per_code.values()) <= 6, per_code   # 5 listed + one summary
    assert len(full.findings) > len(capped.findings)
