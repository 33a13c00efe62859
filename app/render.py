"""Reports -> text, JSON and JSON lines for the command line (SARIF: app/sarif.py).

`text` prints each report's summary and, when the run covered several files, a table
(file, format, verdict, tensors, worst finding) and the count of skipped non-checkpoints.
`json` is one report object when the only target is one file or URL, else a list;
`jsonl` one report per line. Skipped files appear in the counts only, never as reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ckptguard.app.runner import ItemResult

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

_SEVERITY_RANK = {"critical": 4, "high": 3, "medium": 2, "low": 1, "info": 0}


def json_lines(report: dict[str, Any]) -> Iterator[str]:
    """The report as JSON, one top-level field and one list item (tensor, storage, global,
    finding) per line. json's indenting encoder is pure Python; this way the C encoder
    writes each line, so a 1M-tensor report prints in seconds, not minutes."""
    yield "{\n"
    for i, (key, value) in enumerate(report.items()):
        sep = "," if i < len(report) - 1 else ""
        if isinstance(value, list) and value:
            yield f"  {json.dumps(key)}: [\n"
            last = len(value) - 1
            for j, item in enumerate(value):
                yield f"    {json.dumps(item)}{',' if j < last else ''}\n"
            yield f"  ]{sep}\n"
        else:
            yield f"  {json.dumps(key)}: {json.dumps(value)}{sep}\n"
    yield "}\n"


def json_list(reports: list[dict[str, Any]]) -> Iterator[str]:
    """A JSON array of reports, each written as json_lines writes one."""
    if not reports:
        yield "[]\n"
        return
    yield "[\n"
    for i, report in enumerate(reports):
        chunks = list(json_lines(report))
        chunks[-1] = "}" + (",\n" if i < len(reports) - 1 else "\n")
        yield from chunks
    yield "]\n"


def jsonl(reports: list[dict[str, Any]]) -> Iterator[str]:
    for report in reports:
        yield json.dumps(report) + "\n"


def format_summary(result: ItemResult) -> str:
    """A readable summary of a report for terminals (it needs no rows: Report.to_json)."""
    r = result.report
    wo = r["weights_only"]
    lines = [
        f"{r['source'].get('name') or r['source'].get('url')}: "
        f"{'UNREADABLE' if r.get('unreadable') else r['verdict'].upper()} "
        f"({r['format']}, {result.count('tensors')} tensors, {result.count('storages')} storages)",
        f"  weights_only load: {'yes' if wo['loadable'] else 'no'}"
        + (f" — {wo['error_type']}: {wo['error']}" if wo["error"] else "")
        # a format torch.load does not read (pickle, NumPy, safetensors): the policy's answer
        + ("; the weights-only policy accepts its pickles"
           if not wo["loadable"] and wo.get("policy_accepts") else ""),
    ]
    flagged = [g for g in r["globals"] if g["status"] != "allowed"]
    if flagged:
        lines.append("  globals outside the allowlist:")
        lines += [f"    {g['status']:<9} {g['module']}.{g['name']} (x{g['count']})" for g in flagged]
    if r["findings"]:
        lines.append("  findings:")
        for f in r["findings"][:50]:
            where = f" @{f['offset']}" if f["offset"] is not None else ""
            lines.append(f"    [{f['severity']}] {f['code']}{where}: {f['message'][:160]}")
        if len(r["findings"]) > 50:
            lines.append(f"    ... {len(r['findings']) - 50} more (use --format json)")
    if wo.get("safe_globals_hint"):
        lines.append(f"  if you trust these globals: {wo['safe_globals_hint']}")
    lines.append(f"  read {r['io']['bytes_read']} bytes in {r['io']['requests']} requests, "
                 f"{r['timings_ms'].get('total', 0.0):.1f} ms")
    return "\n".join(lines) + "\n"


def worst_finding(report: dict[str, Any]) -> str:
    findings = report["findings"]
    if not findings:
        return "-"
    worst = max(findings, key=lambda f: _SEVERITY_RANK.get(f["severity"], 0))
    return f"{worst['code']} ({worst['severity']})"


def summary_table(results: list[ItemResult]) -> str:
    """file | format | verdict | tensors | worst finding, then the counts."""
    scanned = [r for r in results if r.skipped is None]
    rows = [(r.item.name, r.report["format"], r.outcome, str(r.count("tensors")),
             worst_finding(r.report)) for r in scanned]
    header = ("file", "format", "verdict", "tensors", "worst finding")
    widths = [max([len(header[c])] + [len(row[c]) for row in rows]) for c in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header[:4], widths, strict=True)) + "  " + header[4]]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
              for row in rows]
    counts: dict[str, int] = {}
    for r in scanned:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    order = ("unsafe", "invalid", "unreadable", "suspicious", "safe")
    tally = ", ".join(f"{counts[k]} {k}" for k in order if k in counts) or "nothing scanned"
    skipped = len(results) - len(scanned)
    lines.append(f"{len(scanned)} scanned ({tally}); {skipped} skipped (not checkpoints)")
    return "\n".join(lines) + "\n"


def text(results: list[ItemResult], *, many: bool) -> Iterator[str]:
    for r in results:
        if r.skipped is None:
            yield format_summary(r)
    if many:
        yield "\n" + summary_table(results)
