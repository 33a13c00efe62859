"""The scan pool: sandboxed worker processes, one job at a time each.

Strategy: not `concurrent.futures.ProcessPoolExecutor`, which breaks every pending
future when one worker dies. Each worker here is a `spawn`ed process with its own
pipe (app/worker.py sets its rlimits). A job takes an idle worker from an asyncio
queue, and a dedicated thread sends the job and waits on the pipe up to the
wall-clock timeout. A timeout, a dead worker or exhausted limits end that worker
only: it is killed and replaced, the job gets an `invalid` report whose finding says
why (TIMEOUT / RESOURCE_LIMIT / WORKER_CRASHED), and other jobs never notice.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ckptguard.app.worker import Hook, Job, WorkerLimits, main
from ckptguard.core import __version__
from ckptguard.core.errors import CkptError, Code
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.records import record
from ckptguard.core.report import Finding, Report, SourceInfo

log = logging.getLogger("ckptguard.jobs")

_CTX = mp.get_context("spawn")
STARTUP_TIMEOUT_S = 120.0


@record(frozen=True, slots=True)
class Outcome:
    """A scan's report (JSON dict) and, if the sandbox stopped it, the code why."""

    report: dict[str, Any]
    failure: Code | None = None
    skipped: str | None = None    # command-line jobs: the container of a non-checkpoint


class _Worker:
    def __init__(self, limits: WorkerLimits) -> None:
        parent, child = _CTX.Pipe(duplex=True)
        self.conn: Connection = parent
        self.process: BaseProcess = _CTX.Process(target=main, args=(child, limits, os.getpid()),
                                                 name="ckptguard-scan", daemon=True)
        self.process.start()
        child.close()
        self.scans = 0
        self.ready = False

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(2)
        self.kill()


def failure_report(info: dict[str, Any], code: Code, message: str, elapsed_s: float) -> dict[str, Any]:
    """An `invalid` report for a scan the sandbox stopped (built by core's own Report)."""
    report = Report(source=SourceInfo(**info), verdict="invalid",
                    findings=[Finding(code, message)], scanner_version=__version__,
                    timings_ms={"total": round(elapsed_s * 1000, 3)})
    return report.to_json()


class PoolFull(Exception):
    """More scans are waiting for a worker than the pool accepts (`max_queued`)."""


class Jobs:
    """A pool of `size` sandboxed scan workers. Use `start()`, `scan()`, `close()`.

    At most `max_queued` scans may wait for a worker when they ask to be refused rather
    than wait (`wait=False`: requests of HTTP clients, who can retry); internal callers
    (the hub runner, already bounded by its own concurrency) always wait.
    """

    def __init__(self, size: int, limits: WorkerLimits, *, timeout_s: float, max_scans: int = 1000,
                 max_queued: int | None = None,
                 on_restart: Callable[[str], None] | None = None) -> None:
        self.size = size
        self.max_queued = max_queued
        self.limits = limits
        self.timeout_s = timeout_s
        self.max_scans = max_scans
        self.on_restart = on_restart
        self.queue_depth = 0
        self.busy = 0
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="ckptguard-job")
        self._all: set[_Worker] = set()
        self._closed = False

    async def start(self) -> None:
        """Spawn the workers and wait until each has imported the scanner."""
        workers = [self._spawn() for _ in range(self.size)]
        await asyncio.gather(*(asyncio.to_thread(_await_ready, w) for w in workers))
        for worker in workers:
            self._idle.put_nowait(worker)

    def _spawn(self) -> _Worker:
        worker = _Worker(self.limits)
        self._all.add(worker)
        return worker

    def _retire(self, worker: _Worker, reason: str) -> _Worker:
        worker.kill()
        self._all.discard(worker)
        if self.on_restart is not None:
            self.on_restart(reason)
        log.warning("scan worker %s replaced: %s", worker.process.pid, reason)
        return self._spawn()

    def full(self) -> bool:
        """True when a scan that may not wait would be refused now."""
        return (self.max_queued is not None and self._idle.empty()
                and self.queue_depth >= self.max_queued)

    async def scan(self, path: str, info: dict[str, Any], *, allow: frozenset[str] = frozenset(),
                   hook: Hook | None = None, wait: bool = True) -> Outcome:
        """Scan the file at `path` in a worker. Raises CkptError if core could not read it,
        PoolFull if `wait` is False and the queue is full."""
        return await self._submit(Job(path=path, info=info, allow=allow, hook=hook), wait=wait)

    async def scan_url(self, url: str, headers: dict[str, str] | None, guard: UrlGuard,
                       allow: frozenset[str] = frozenset(), *, wait: bool = True) -> dict[str, Any]:
        """POST /scan/url's entry (app/routes/remote.py): a URL scan in the sandbox.

        Raises SourceError (refused URL, bad upstream) as core does; returns the report JSON.
        """
        job = Job(path="", info={"kind": "url", "url": url}, allow=allow, url=url,
                  headers=dict(headers) if headers else None, guard=guard)
        return (await self._submit(job, wait=wait)).report

    async def run(self, job: Job) -> Outcome:
        """Any job (the command line builds its own); waits for a worker. Raises CkptError
        when core could not read the input."""
        return await self._submit(job)

    async def _submit(self, job: Job, *, wait: bool = True) -> Outcome:
        if self._closed:
            raise RuntimeError("the scan pool is closed")
        if not wait and self.full():
            raise PoolFull(f"{self.queue_depth} scans are waiting for a worker")
        self.queue_depth += 1
        try:
            worker = await self._idle.get()
        finally:
            self.queue_depth -= 1
        self.busy += 1
        loop = asyncio.get_running_loop()
        # The thread hands back the worker to reuse (the same one or its replacement).
        future = loop.run_in_executor(self._threads, self._run_safely, worker, job)
        try:
            reply, worker = await asyncio.shield(future)
        except asyncio.CancelledError:
            # The caller went away (client disconnect); the job still finishes in its
            # thread, and the worker must come back to the pool when it does.
            future.add_done_callback(self._release)
            raise
        finally:
            self.busy -= 1
        self._idle.put_nowait(worker)
        if isinstance(reply, CkptError):
            raise reply
        return reply

    def _release(self, future: asyncio.Future[tuple[Outcome | CkptError, _Worker]]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._idle.put_nowait(future.result()[1])

    def _run_safely(self, worker: _Worker, job: Job) -> tuple[Outcome | CkptError, _Worker]:
        try:
            return self._run(worker, job)
        except Exception as exc:  # a bug here must not lose a worker from the pool
            log.exception("scan pool error")
            why = f"{type(exc).__name__} in the scan pool"
            return (Outcome(failure_report(job.info, Code.INTERNAL_ERROR, why, 0.0), Code.INTERNAL_ERROR),
                    self._retire(worker, "INTERNAL_ERROR"))

    def _run(self, worker: _Worker, job: Job) -> tuple[Outcome | CkptError, _Worker]:
        _await_ready(worker)
        if not worker.process.is_alive():
            # it died while idle (killed, OOM-reaped): the job never started on it, so it
            # runs on a fresh worker instead of being reported as the crash of an innocent scan
            worker = self._retire(worker, "WORKER_CRASHED")
            _await_ready(worker)
        started = time.perf_counter()
        try:
            worker.conn.send(job)
            message = None
            while ready := worker.conn.poll(max(0.0, self.timeout_s - (time.perf_counter() - started))):
                message = worker.conn.recv()
                if message[0] != "ready":   # a start-up notice that came late: skip it
                    break
                message = None
        except (EOFError, OSError):
            message, ready = None, True
        elapsed = time.perf_counter() - started
        if message is None:
            if not ready:
                code, why = Code.TIMEOUT, f"the scan exceeded the {self.timeout_s:g} s wall-clock limit"
            else:
                code, why = _death_cause(worker)
            return (Outcome(failure_report(job.info, code, why, elapsed), code),
                    self._retire(worker, code.value))
        kind, payload, recycle = message
        worker.scans += 1
        if kind == "memory":
            code = Code.RESOURCE_LIMIT
            result: Outcome | CkptError = Outcome(failure_report(
                job.info, code, "the scan worker ran out of memory", elapsed), code)
        elif kind == "error":
            result = payload
        elif kind == "skipped":
            result = Outcome({}, skipped=payload)
        else:
            # a recycled worker's report still stands; it failed only if it says it ran out
            failed = Code.RESOURCE_LIMIT if any(
                f.get("code") == Code.RESOURCE_LIMIT for f in payload.get("findings", ())) else None
            result = Outcome(payload, failed)
        if recycle or worker.scans >= self.max_scans:
            ran_out = kind == "memory" or (isinstance(result, Outcome) and result.failure is not None)
            worker = self._retire(worker, "RESOURCE_LIMIT" if ran_out else
                                  "memory_growth" if recycle else "recycled")
        return result, worker

    async def close(self) -> None:
        self._closed = True
        for worker in list(self._all):
            await asyncio.to_thread(worker.stop)
        self._all.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)


def _await_ready(worker: _Worker) -> None:
    """A fresh worker imports the scanner first; that is not the job's time."""
    if worker.ready:
        return
    try:
        if worker.conn.poll(STARTUP_TIMEOUT_S):
            worker.conn.recv()
    except (EOFError, OSError):
        pass  # a worker that died starting up is noticed by the job that uses it
    worker.ready = True


def _death_cause(worker: _Worker) -> tuple[Code, str]:
    worker.process.join(5)
    exitcode = worker.process.exitcode
    if exitcode == -signal.SIGXCPU:
        return Code.RESOURCE_LIMIT, "the scan exceeded its CPU-time limit"
    return Code.WORKER_CRASHED, f"the scan worker died (exit code {exitcode})"
