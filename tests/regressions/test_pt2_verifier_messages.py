"""The .pt2 verifier's messages quote names of any length, and the report's `extra.pt2`
summary kept them whole: a red team's 22 KB archive (200 violations quoting one 100,000-byte
name) made a 20 MB report whose cap (~178 KB) cut every list but could not cut the summary.
Messages are kept to Limits.max_name_chars in the findings and the summary alike."""

from __future__ import annotations

import io
import json
import zipfile

from ckptguard.core.errors import Code
from ckptguard.core.limits import Limits
from ckptguard.core.scan import scan_bytes


def _archive(name_chars: int, violations: int) -> bytes:
    name = "a" * name_chars
    calls = [{"signature": {"inputs": [{"name": name}] * violations}}]
    program = {"schema_version": {"major": 8, "minor": 0},
               "graph_module": {"graph": {"nodes": [], "inputs": []},
                                "signature": {"input_specs": []}, "module_call_graph": calls}}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("m/archive_format", "pt2")
        z.writestr(zipfile.ZipInfo("m/models/m.json"), json.dumps(program),
                   compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        z.writestr("m/data/weights/m_weights_config.json", json.dumps({"config": {}}))
        z.writestr("m/data/constants/m_constants_config.json", json.dumps({"config": {}}))
        z.writestr("m/data/sample_inputs/m.pt", b"")
    return buf.getvalue()


def test_verifier_messages_are_kept_short_in_findings_and_summary() -> None:
    data = _archive(100_000, 200)
    report = scan_bytes(data)
    size = len(json.dumps(report.to_json()))
    assert size < 500_000, size   # 20 MB on the old code
    verifier = [f for f in report.findings if f.code is Code.PT2_VERIFIER]
    assert verifier and all(len(f.message) < Limits().max_name_chars + 100 for f in verifier)
    summary = json.dumps(report.to_json()["extra"])
    assert "(100,0" in summary and len(summary) < 200 * (Limits().max_name_chars + 200)
