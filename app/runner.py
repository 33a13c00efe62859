"""Run the command line's scan items in sandboxed worker processes, results in input order.

Strategy: the service's pool (app/jobs.py + app/worker.py) already gives each scan its own
RLIMIT_AS, an RLIMIT_CPU budget and a wall-clock timeout, and turns a scan that exhausts
them, or a worker that dies, into an `invalid` report with RESOURCE_LIMIT / TIMEOUT /
WORKER_CRASHED while the other scans carry on. The command line reuses it with `-j`
workers and the service's defaults (app/settings.py), so a hostile file in a folder costs
one report, never the run. Results are gathered in item order, whatever order they finish.
"""

from __future__ import annotations

import resource
import signal
import time
from collections.abc import Callable

from ckptguard.app.targets import ScanItem
from ckptguard.core.errors import CkptError, Code
from ckptguard.core.records import field, record

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_MEMORY_MB = 2048     # app/settings.py: worker_memory_mb
DEFAULT_CPU_SECONDS = 120    # app/settings.py: worker_cpu_seconds
DEFAULT_TIMEOUT_S = 300.0    # app/settings.py: scan_timeout_seconds


@record(frozen=True, slots=True)
class RunLimits:
    jobs: int
    memory_mb: int = DEFAULT_MEMORY_MB
    cpu_seconds: int = DEFAULT_CPU_SECONDS
    timeout_s: float = DEFAULT_TIMEOUT_S
    # one target: scan it in this process (same limits) instead of starting a worker
    inline_single: bool = True


@record(slots=True)
class ItemResult:
    """One item's outcome: a report, or skipped (no checkpoint), or unreadable (with a report
    that says why, so `--format json` still prints what happened)."""

    item: ScanItem
    report: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    unreadable: bool = False
    # rows a report made without them (run(..., rows=False)) lists: {"tensors": n, ...}
    row_counts: dict[str, int] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """safe | suspicious | unsafe | invalid | unreadable (the exit code's input)."""
        return "unreadable" if self.unreadable else str(self.report["verdict"])

    def count(self, rows: str) -> int:
        """How many tensors (rows="tensors") or storages the report lists, also when it was
        made without its rows."""
        listed = self.report.get(rows)
        return len(listed) if listed is not None else self.row_counts.get(rows, 0)


Progress = Callable[[ItemResult], None]


def unreadable_result(item: ScanItem, error: CkptError) -> ItemResult:
    from ckptguard.app.jobs import failure_report

    report = failure_report(_info(item), error.code, error.message, 0.0)
    report["unreadable"] = True   # no verdict could be reached: the exit code is 4
    return ItemResult(item, report, unreadable=True)


def _info(item: ScanItem) -> dict[str, Any]:
    return {"kind": item.kind, "name": item.name, "url": item.url, "sha256": item.sha256}


def run(items: list[ScanItem], limits: RunLimits, *, allow: frozenset[str], verify_crc: bool,
        on_result: Progress | None = None, rows: bool = True) -> list[ItemResult]:
    """Scan every item in the pool; one result per item, in the order of `items`.

    A single item is scanned in this process under the same limits (no worker to start:
    a one-file `ckptguard scan` costs the scan, not a second interpreter's start-up); with
    rows=False (a text summary) its report is made without its rows (Report.to_json)."""
    if len(items) == 1 and items[0].error is None and limits.inline_single:
        result = _run_inline(items[0], limits, allow=allow, verify_crc=verify_crc, rows=rows)
        if on_result is not None:
            on_result(result)
        return [result]
    import asyncio

    return asyncio.run(_run(items, limits, allow=allow, verify_crc=verify_crc, on_result=on_result))


class _ScanLimit(BaseException):
    """Raised by the CPU and wall-clock signals inside an in-process scan. A BaseException,
    so that the scanner's own catch-all (an error becomes a finding) lets it through."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_IMPORT_RETRY_S = 0.01


def limit_handler(code: Code, message: str) -> Callable[[int, Any], None]:
    """The CPU (SIGXCPU) or wall-clock (SIGALRM) handler of an in-process scan: it stops the
    scan, but never inside an import. A module whose import is interrupted stays half made
    in this process (numpy then answers every later scan with "Importing the numpy
    C-extensions failed"), and the scan imports readers lazily, so the stop waits until the
    import is done: the timer fires again in 10 ms (SIGXCPU repeats every CPU second)."""
    def handler(signum: int, frame: Any) -> None:
        if _importing(frame):
            if signum == signal.SIGALRM:
                signal.setitimer(signal.ITIMER_REAL, _IMPORT_RETRY_S)
            return
        raise _ScanLimit(code, message)
    return handler


def _importing(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _run_inline(item: ScanItem, limits: RunLimits, *, allow: frozenset[str],
                verify_crc: bool, rows: bool) -> ItemResult:
    """One item in this process: RLIMIT_AS for memory, RLIMIT_CPU (SIGXCPU) for CPU time and
    an interval timer (SIGALRM) for the wall clock, all restored afterwards."""
    from ckptguard.app.itemscan import Skipped, scan_local, scan_remote
    from ckptguard.core.report import SourceInfo
    from ckptguard.core.state import ScanOptions

    old_as = resource.getrlimit(resource.RLIMIT_AS)
    old_cpu = resource.getrlimit(resource.RLIMIT_CPU)
    old_handlers = (signal.getsignal(signal.SIGXCPU), signal.getsignal(signal.SIGALRM))
    memory = limits.memory_mb * 1024 * 1024
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_soft = int(used.ru_utime + used.ru_stime) + limits.cpu_seconds + 1
    started = time.perf_counter()
    options = ScanOptions(allow=allow, verify_crc=verify_crc)
    info = SourceInfo(**_info(item))
    try:
        signal.signal(signal.SIGXCPU, limit_handler(Code.RESOURCE_LIMIT,
                                                    "the scan exceeded its CPU-time limit"))
        signal.signal(signal.SIGALRM, limit_handler(Code.TIMEOUT, f"the scan exceeded the "
                                                    f"{limits.timeout_s:g} s wall-clock limit"))
        resource.setrlimit(resource.RLIMIT_AS, (_lower(memory, old_as[1]), old_as[1]))
        resource.setrlimit(resource.RLIMIT_CPU, (_lower(cpu_soft, old_cpu[1]), old_cpu[1]))
        signal.setitimer(signal.ITIMER_REAL, limits.timeout_s)
        try:
            result = (scan_remote(item.url, item.headers, info, options, sniff_first=item.from_listing)
                      if item.url is not None else
                      scan_local(item.path or "", info, options, sniff_first=item.from_listing))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _ScanLimit as exc:
        return _failed(item, exc.code, exc.message, started)
    except MemoryError:
        return _failed(item, Code.RESOURCE_LIMIT, "the scan ran out of memory", started)
    except CkptError as exc:
        return unreadable_result(item, exc)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old_as)
        resource.setrlimit(resource.RLIMIT_CPU, old_cpu)
        signal.signal(signal.SIGXCPU, old_handlers[0])
        signal.signal(signal.SIGALRM, old_handlers[1])
    if isinstance(result, Skipped):
        return ItemResult(item, skipped=result.container)
    if rows:
        return ItemResult(item, result.to_json())
    return ItemResult(item, result.to_json(rows=False),
                      row_counts={"tensors": len(result.tensors), "storages": len(result.storages)})


def _lower(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _failed(item: ScanItem, code: Code, message: str, started: float) -> ItemResult:
    from ckptguard.app.jobs import failure_report

    return ItemResult(item, failure_report(_info(item), code, message, time.perf_counter() - started))


async def _run(items: list[ScanItem], limits: RunLimits, *, allow: frozenset[str], verify_crc: bool,
               on_result: Progress | None) -> list[ItemResult]:
    import logging  # here, not at the top: a one-file scan runs inline and logs nothing

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

            import asyncio

            await asyncio.gather(*(one(i) for i in pending))
        finally:
            await pool.close()
    done = [r for r in results if r is not None]
    assert len(done) == len(items)
    return done

