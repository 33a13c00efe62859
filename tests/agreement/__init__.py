"""Agreement of the engines: the column lane, the general path and the exact interpreters
must give one report for every input (ScanOptions.engine; core/state.py).

`reports(target)` scans a path or bytes with each engine and returns what must be equal:
the JSON report without timings and I/O counts, plus the Python rows (a tuple where another
engine has a list is a different API for library users). `assert_agree(target)` asserts it
and returns the default engine's view, for the caller's own checks.
"""

from __future__ import annotations

import os
from typing import Any

from ckptguard.core.io.source import BytesSource
from ckptguard.core.report import Report
from ckptguard.core.scan import scan_path, scan_source
from ckptguard.core.state import Engine, ScanOptions

ENGINES: tuple[Engine, ...] = ("auto", "general", "exact")

Target = str | os.PathLike[str] | bytes


def scan_with(target: Target, engine: Engine, **options: Any) -> Report:
    opts = ScanOptions(engine=engine, **options)
    if isinstance(target, bytes):
        return scan_source(BytesSource(target, name="case"), options=opts)
    return scan_path(target, options=opts)


def comparable(report: Report) -> dict[str, Any]:
    out = report.to_json()
    out.pop("timings_ms")
    out.pop("io")
    out.pop("source")   # a path or a bytes name: not what the engines decide
    out["tensor_rows"] = [t._asdict() for t in report.tensors]
    out["storage_rows"] = [s._asdict() for s in report.storages]
    return out


def reports(target: Target, engines: tuple[Engine, ...] = ENGINES,
            **options: Any) -> dict[Engine, dict[str, Any]]:
    return {engine: comparable(scan_with(target, engine, **options)) for engine in engines}


def assert_agree(target: Target, engines: tuple[Engine, ...] = ENGINES, *, label: str = "",
                 **options: Any) -> dict[str, Any]:
    """Every engine's report equals the first's; returns that report."""
    got = reports(target, engines, **options)
    first, *others = engines
    for engine in others:
        assert got[engine] == got[first], f"{label}: engine {engine!r} differs from {first!r}"
    return got[first]
