"""Run the command line's scan items in sandboxed worker processes, results in input order.

Strategy: the service's pool (app/jobs.py + app/worker.py) already gives each scan its own
RLIMIT_AS, an RLIMIT_CPU budget and a wall-clock timeout, and turns a scan that exhausts
them, or a worker that dies, into an `invalid` report with RESOURCE_LIMIT / TIMEOUT /
WORKER_CRASHED while the other scans carry on. The command line reuses it with `-j`
workers and the service's defaults (app/settings.py), so a hostile file in a folder costs
one report, never the run. Results are gathered in item order, whatever order they finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptguard.app.targets import ScanItem
from ckptguard.core.errors import CkptError

DEFAULT_MEMORY_MB = 2048     # app/settings.py: worker_memory_mb
DEFAULT_CPU_SECONDS = 120    # app/settings.py: worker_cpu_seconds
DEFAULT_TIMEOUT_S = 300.0    # app/settings.py: scan_timeout_seconds


@dataclass(frozen=True, slots=True)
class RunLimits:
    jobs: int
    memory_mb: int = DEFAULT_MEMORY_MB
    cpu_seconds: int = DEFAULT_CPU_SECONDS
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(slots=True)
class ItemResult:
    """One item's outcome: a report, or skipped (no checkpoint), or unreadable (with a report
    that says why, so `--format json` still prints what happened)."""

    item: ScanItem
    report: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    unreadable: bool = False

    @property
    def outcome(self) -> str:
        """safe | suspicious | unsafe | invalid | unreadable (the exit code's input)."""
        return "unreadable" if self.unreadable else str(self.report["verdict"])


Progress = Callable[[ItemResult], None]


def unreadable_result(item: ScanItem, error: CkptError) -> ItemResult:
    from ckptguard.app.jobs import failure_report

    report = failure_report(_info(item), error.code, error.message, 0.0)
    report["unreadable"] = True   # no verdict could be reached: the exit code is 4
    return ItemResult(item, report, unreadable=True)


def _info(item: ScanItem) -> dict[str, Any]:
    return {"kind": item.kind, "name": item.name, "url": item.url, "sha256": item.sha256}


def run(items: list[ScanItem], limits: RunLimits, *, allow: frozenset[str], verify_crc: bool,
        on_result: Progress | None = None) -> list[ItemResult]:
    """Scan every item in the pool; one result per item, in the order of `items`."""
    return asyncio.run(_run(items, limits, allow=allow, verify_crc=verify_crc, on_result=on_result))


async def _run(items: list[ScanItem], limits: RunLimits, *, allow: frozenset[str], verify_crc: bool,
               on_result: Progress | None) -> list[ItemResult]:
    from ckptguard.app.jobs import Jobs
    from ckptguard.app.worker import Job, WorkerLimits

    # The pool logs each replaced worker for the service's operators; here the item's
    # report already says what happened.
    logging.getLogger("ckptguard.jobs").setLevel(logging.CRITICAL)
    results: list[ItemResult | None] = [None] * len(items)
    pending = [i for i, item in enumerate(items) if item.error is None]
    for i, item in enumerate(items):
        if item.error is not None:   # could not even be listed or opened: no worker needed
            results[i] = failed = unreadable_result(item, item.error)
            if on_result is not None:
                on_result(failed)
    if pending:
        pool = Jobs(min(limits.jobs, len(pending)),
                    WorkerLimits(memory_bytes=limits.memory_mb * 1024 * 1024,
                                 cpu_seconds=limits.cpu_seconds),
                    timeout_s=limits.timeout_s, max_scans=1000)
        await pool.start()
        try:
            async def one(index: int) -> None:
                item = items[index]
                job = Job(path=item.path or "", info=_info(item), allow=allow, url=item.url,
                          headers=item.headers, command_line=True, sniff_first=item.from_listing,
                          verify_crc=verify_crc)
                started = time.perf_counter()
                try:
                    outcome = await pool.run(job)
                except CkptError as exc:
                    result = unreadable_result(item, exc)
                    result.report["timings_ms"] = {"total": round((time.perf_counter() - started) * 1e3, 3)}
                else:
                    result = (ItemResult(item, skipped=outcome.skipped) if outcome.skipped is not None
                              else ItemResult(item, outcome.report))
                results[index] = result
                if on_result is not None:
                    on_result(result)

            await asyncio.gather(*(one(i) for i in pending))
        finally:
            await pool.close()
    done = [r for r in results if r is not None]
    assert len(done) == len(items)
    return done

