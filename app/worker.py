"""The scan worker: the code that runs inside each sandboxed worker process.

Strategy: the parent (app/jobs.py) starts this with the `spawn` context, so the
child holds no copy of the server's sockets, threads or database connections. It
imports the scanner first, then caps its own address space (RLIMIT_AS) and, before
each job, its CPU time (RLIMIT_CPU soft limit = CPU used so far + the per-scan budget;
the kernel sends SIGXCPU past it). Results go back as plain JSON-able dicts; a
`CkptError` goes back as itself (the error tree pickles, core/errors.py).
This module imports no web framework: a worker stays small.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import time
from multiprocessing.connection import Connection
from typing import Any, Literal

from ckptguard.core.records import record

Hook = Literal["sleep", "oom", "crash", "cpu"]


@record(frozen=True, slots=True)
class Job:
    path: str                             # a local file, or "" with `url`
    info: dict[str, Any]                  # core.report.SourceInfo fields
    allow: frozenset[str] = frozenset()
    hook: Hook | None = None              # tests only; ignored unless the pool allows hooks
    url: str | None = None                # scan over HTTP Range requests (core.loader.scan_url)
    headers: dict[str, str] | None = None
    guard: Any = None                     # core.io.urlguard.UrlGuard (pickles; checks every hop)
    # The command line's jobs (app/runner.py): read through app/itemscan.py, which skips
    # files a folder walk or hub listing found when they sniff as no checkpoint.
    command_line: bool = False
    sniff_first: bool = False
    verify_crc: bool = False


@record(frozen=True, slots=True)
class WorkerLimits:
    memory_bytes: int
    cpu_seconds: int
    test_hooks: bool = False
    # a scan that left the worker this much larger than it started is its last: the heap
    # it grew (and fragmented) must not shrink the next scan's share of memory_bytes
    recycle_growth_bytes: int = 256 * 1024 * 1024


# Messages child -> parent: ("ok", report_json, recycle) | ("error", CkptError, False)
#                         | ("skipped", container, False)
Reply = tuple[str, Any, bool]


def _memory_marks() -> tuple[int, int]:
    """(resident bytes now, peak resident bytes so far) of this process (Linux; zeros where
    /proc is missing: never recycles)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize(), peak
    except (OSError, ValueError, IndexError):
        return 0, 0


def _grew(before: tuple[int, int], limit: int) -> bool:
    """Did the last scan leave this worker larger, or push its peak higher, than `limit`?
    A peak that was freed still leaves a fragmented heap the next scan would inherit."""
    now, peak = _memory_marks()
    return now - before[0] > limit or peak - before[1] > limit


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _set_cpu_budget(seconds: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(_cpu_used()) + seconds + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _run_hook(hook: Hook, limits: WorkerLimits) -> None:
    """Misbehave on purpose, so tests can prove the sandbox holds (Settings.test_hooks)."""
    if hook == "sleep":
        time.sleep(3600)
    elif hook == "oom":
        hog = [bytearray(64 * 1024 * 1024) for _ in range(limits.memory_bytes // (64 * 1024 * 1024) + 2)]
        del hog
    elif hook == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif hook == "cpu":
        while True:
            pass


def _scan(job: Job, limits: WorkerLimits) -> Reply:
    from ckptguard.core.errors import CkptError, Code, SourceError
    from ckptguard.core.report import SourceInfo
    from ckptguard.core.scan import scan_path
    from ckptguard.core.state import ScanOptions

    if job.hook is not None and limits.test_hooks:
        _run_hook(job.hook, limits)
    options = ScanOptions(allow=job.allow, verify_crc=job.verify_crc)
    try:
        if job.command_line:
            from ckptguard.app.itemscan import Skipped, scan_local, scan_remote

            info = SourceInfo(**job.info)
            result = (scan_remote(job.url, job.headers, info, options, sniff_first=job.sniff_first)
                      if job.url is not None else
                      scan_local(job.path, info, options, sniff_first=job.sniff_first))
            if isinstance(result, Skipped):
                return ("skipped", result.container, False)
            report = result
        elif job.url is not None:
            from ckptguard.core.loader import scan_url

            report = scan_url(job.url, headers=job.headers, guard=job.guard, options=options)
        else:
            report = scan_path(job.path, options=options, info=SourceInfo(**job.info))
    except CkptError as exc:
        return ("error", exc, False)
    except Exception as exc:
        # e.g. a URL or header the HTTP client refuses: the source could not be read
        return ("error", SourceError(Code.INTERNAL_ERROR, f"{type(exc).__name__} while opening "
                                     "the source"), True)
    # After a MemoryError the heap may be fragmented: let the pool replace this worker.
    recycle = any(f.code is Code.RESOURCE_LIMIT for f in report.findings)
    return ("ok", report.to_json(), recycle)


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this worker when the process that started it dies (a killed
    server must not leave a worker scanning for nobody). Elsewhere a no-op."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:   # it died before prctl took effect
        os._exit(1)


def main(conn: Connection, limits: WorkerLimits, parent: int | None = None) -> None:
    """Worker loop: receive a Job, send a Reply; exit on None or a closed pipe."""
    _die_with_parent(parent if parent is not None else os.getppid())
    import ckptguard.core.scan  # noqa: F401  (warm imports before the address-space cap)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    conn.send(("ready", os.getpid(), False))  # the wall clock starts after start-up
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        _set_cpu_budget(limits.cpu_seconds)
        before = _memory_marks()
        try:
            reply = _scan(job, limits)
        except MemoryError:
            reply = ("memory", None, True)
        if not reply[2] and _grew(before, limits.recycle_growth_bytes):
            reply = (reply[0], reply[1], True)   # this answer stands; the next job gets a fresh worker
        try:
            conn.send(reply)
        except MemoryError:
            conn.send(("memory", None, True))
            return
        except (RecursionError, ValueError, TypeError, AttributeError, pickle.PicklingError):
            # the reply could not be pickled (nothing was written yet): a bounded answer instead
            from ckptguard.core.errors import Code, SourceError

            conn.send(("error", SourceError(Code.INTERNAL_ERROR, "the report could not be sent "
                                            "back from the scan worker"), True))
            return
        if reply[2]:
            return
