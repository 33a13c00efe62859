"""Reports -> one SARIF 2.1.0 log, as GitHub code scanning accepts it.

Strategy (GitHub's "SARIF support for code scanning" page; the upload itself cannot be tried
here, tests/cli/ validates against the OASIS schema):
- one run; `tool.driver.rules` holds one rule per finding code, every code of
  core.errors.Code in enum order, so a rule's index and text never depend on the input;
  each rule has short/full descriptions and help from the codes table, a default `level`,
  and `properties.security-severity` (GitHub ranks alerts by it) with the `security` tag;
- one result per finding: `ruleId` + `ruleIndex`, the finding's own severity as `level`,
  the artifact's URI (a relative path stays relative, as GitHub wants paths from the
  repository root; an absolute one becomes a file:// URI; a URL or hf:// name as is),
  a region with `byteOffset` (and `byteLength` when the finding has a length) plus
  `startLine: 1`, because GitHub's upload needs a line and a checkpoint has none;
- `partialFingerprints` from (code, artifact, record, offset, message), so a re-run of the
  same files deduplicates instead of opening new alerts; the file's verdict and format go
  in `properties`. GitHub keeps at most 25,000 results per run: past that we stop adding
  and say so in the run's properties.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any
from urllib.parse import quote

from ckptguard.app.runner import ItemResult
from ckptguard.core import __version__

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
MAX_RESULTS = 25_000
_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}
# GitHub: > 9.0 critical, 7.0-8.9 high, 4.0-6.9 medium, 0.1-3.9 low
_SECURITY_SEVERITY = {"critical": "9.5", "high": "8.0", "medium": "5.5", "low": "3.0", "info": "0.1"}


def artifact_uri(name: str) -> str:
    """A relative path stays relative (GitHub resolves it from the checkout); an absolute
    path becomes file://; URLs and hf:// names are URIs already."""
    if "://" in name:
        return name
    posix = name.replace(os.sep, "/")
    if os.path.isabs(name):
        return "file://" + quote(posix)
    while posix.startswith("./"):
        posix = posix[2:]
    return quote(posix)


def rules() -> list[dict[str, Any]]:
    from ckptguard.core.errors import Code

    return [{
        "id": code.value,
        "name": "".join(part.capitalize() for part in code.value.split("_")),
        "shortDescription": {"text": code.doc},
        "fullDescription": {"text": f"{code.doc} (verdict effect: {code.effect})."},
        "help": {"text": f"{code.value}: {code.doc}. Severity {code.severity}; a finding of this code "
                         f"makes a file at worst `{code.effect}`.",
                 "markdown": f"**{code.value}**: {code.doc}.\n\nSeverity `{code.severity}`, "
                             f"verdict effect `{code.effect}`."},
        "defaultConfiguration": {"level": _LEVEL[str(code.severity)]},
        "properties": {"tags": ["security", "checkpoint"],
                       "security-severity": _SECURITY_SEVERITY[str(code.severity)],
                       "precision": "high"},
    } for code in Code]


def fingerprint(code: str, uri: str, finding: dict[str, Any]) -> str:
    key = "\0".join((code, uri, str(finding.get("record")), str(finding.get("offset")),
                     finding.get("message", "")))
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def sarif_log(results: list[ItemResult]) -> dict[str, Any]:
    rule_list = rules()
    index = {rule["id"]: i for i, rule in enumerate(rule_list)}
    out: list[dict[str, Any]] = []
    truncated = False
    for item_result in results:
        if item_result.skipped is not None:
            continue
        report = item_result.report
        uri = artifact_uri(item_result.item.name)
        for finding in report["findings"]:
            if len(out) >= MAX_RESULTS:
                truncated = True
                break
            code = finding["code"]
            region: dict[str, Any] = {"startLine": 1}
            if finding.get("offset") is not None:
                region["byteOffset"] = finding["offset"]
                if finding.get("length") is not None:
                    region["byteLength"] = finding["length"]
            out.append({
                "ruleId": code,
                "ruleIndex": index[code],
                "level": _LEVEL.get(finding["severity"], "warning"),
                "message": {"text": finding["message"]
                            + (f" (in {finding['record']})" if finding.get("record") else "")},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri},
                                                    "region": region}}],
                "partialFingerprints": {"ckptguardFinding/v1": fingerprint(code, uri, finding)},
                "properties": {"verdict": item_result.outcome, "format": report["format"],
                               "severity": finding["severity"]},
            })
    run: dict[str, Any] = {
        "tool": {"driver": {"name": "ckptguard", "version": __version__, "semanticVersion": __version__,
                            "rules": rule_list}},
        "results": out,
        "columnKind": "unicodeCodePoints",
        "invocations": [{"executionSuccessful": True}],
        "properties": {"verdicts": {artifact_uri(r.item.name): r.outcome
                                    for r in results if r.skipped is None},
                       "skipped": sum(r.skipped is not None for r in results),
                       "truncated": truncated},
    }
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}
