"""Durable hub jobs: the queue seam, the in-process queue, and the runner of one job.

Strategy: the database is the source of truth (app/hub/db.py); the queue only carries
job ids, so losing it loses nothing. `JobQueue` is the seam: `InProcessQueue` runs jobs
on asyncio tasks in this process; a distributed task queue (Celery, arq, RQ...) can
replace it by delivering the same ids to `HubRunner.run` on its workers. A sweeper
re-reads the table at start and every `lease/2` seconds, so work survives restarts:
queued jobs whose retry time has come and running jobs whose lease expired (their
process died) are picked up again; finished files are never scanned twice.
Per file: a stored report with the same LFS sha256 is reused; otherwise the file is
sniffed (head + tail, in a thread) and, if it can hold pickles or tensors, scanned over
Range requests in the sandboxed worker pool (`Jobs.scan_url`, like POST /scan/url).
Failures retry with exponential backoff (`hub_retry_backoff_seconds * 2**n`) and end
as `failed` with the error recorded after `hub_scan_attempts` tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ckptguard.app.hub.client import (
    MIN_SCAN_BYTES,
    SCANNED,
    FileScan,
    HubClient,
    scan_remote_file,
    sniff_remote,
)
from ckptguard.app.hub.db import HubDb
from ckptguard.app.metrics import Metrics
from ckptguard.app.notify import notify
from ckptguard.app.settings import Settings
from ckptguard.app.ssrf import guard_from_settings
from ckptguard.app.store import Store, policy_key
from ckptguard.core import __version__
from ckptguard.core.errors import CkptError, Code
from ckptguard.core.report import POLICY
from ckptguard.core.state import ScanOptions

log = logging.getLogger("ckptguard.hub")

Handler = Callable[[str], Awaitable[None]]
SANDBOX_CODES = frozenset({Code.TIMEOUT.value, Code.RESOURCE_LIMIT.value, Code.WORKER_CRASHED.value,
                           Code.INTERNAL_ERROR.value})
ScanFn = Callable[..., FileScan]


class JobQueue(Protocol):
    """Carries job ids to whoever runs them. At-least-once: `HubRunner.run` is idempotent."""

    async def start(self) -> None: ...
    async def enqueue(self, job_id: str, *, not_before: float = 0.0) -> None: ...
    async def close(self) -> None: ...


class InProcessQueue:
    """asyncio tasks in this process, plus a sweeper that re-reads the job table."""

    def __init__(self, handler: Handler, sweep: Callable[[], Awaitable[list[tuple[str, float]]]], *,
                 workers: int = 1, sweep_every_s: float = 30.0) -> None:
        self._handler = handler
        self._sweep = sweep
        self._workers = workers
        self._sweep_every = sweep_every_s
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: dict[str, asyncio.TimerHandle] = {}

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"hub-job-{i}") for i in range(self._workers)]
        self._tasks.append(asyncio.create_task(self._sweeper(), name="hub-sweeper"))

    async def enqueue(self, job_id: str, *, not_before: float = 0.0) -> None:
        delay = not_before - time.time()
        if delay > 0:
            if job_id not in self._timers:  # the sweeper re-announces delayed jobs: one timer each
                self._timers[job_id] = asyncio.get_running_loop().call_later(delay, self._fire, job_id)
            return
        self._put(job_id)

    def _fire(self, job_id: str) -> None:
        self._timers.pop(job_id, None)
        self._put(job_id)

    def _put(self, job_id: str) -> None:
        if job_id not in self._queued:
            self._queued.add(job_id)
            self._queue.put_nowait(job_id)

    async def _work(self) -> None:
        while True:
            job_id = await self._queue.get()
            self._queued.discard(job_id)
            try:
                await self._handler(job_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the queue; the lease brings the job back
                log.exception("hub job %s crashed", job_id)

    async def _sweeper(self) -> None:
        while True:
            try:
                for job_id, when in await self._sweep():
                    await self.enqueue(job_id, not_before=when)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("hub sweep failed")
            await asyncio.sleep(self._sweep_every)

    async def close(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class HubRunner:
    """Runs one hub job to its end (or until its lease is lost)."""

    def __init__(self, settings: Settings, store: Store, *, jobs: object | None = None,
                 scan_fn: ScanFn = scan_remote_file, client: HubClient | None = None,
                 metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.jobs = jobs  # app.jobs.Jobs: its `scan_url` runs a URL scan in the sandbox
        self.db = HubDb(store.engine)
        self.client = client or HubClient(settings.hub_endpoint, token=settings.hub_token,
                                          max_files=settings.hub_max_files)
        self.scan_fn = scan_fn
        self.guard = guard_from_settings(settings)
        self.allow = frozenset(settings.allow_globals)
        # Reports keyed by the hub's claimed LFS sha256 live in their own cache namespace:
        # an upload (whose sha256 is computed) never gets a report keyed by a claim.
        self.policy = policy_key(POLICY, self.allow) + "+hub"
        self.owner = uuid.uuid4().hex
        self._notifying: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.queue: JobQueue = InProcessQueue(self.run, self._sweep, workers=2,
                                              sweep_every_s=max(0.5, settings.hub_lease_seconds / 2))

    async def start(self) -> None:
        await self.queue.start()

    async def close(self) -> None:
        await self.queue.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.to_thread(self.db.release, self.owner)
        await asyncio.to_thread(self.client.close)

    async def _sweep(self) -> list[tuple[str, float]]:
        for job_id in await asyncio.to_thread(self.db.unnotified):
            task = asyncio.create_task(self._notify(job_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.to_thread(self.db.runnable)

    def _backoff(self, attempts: int) -> float:
        return float(self.settings.hub_retry_backoff_seconds * 2 ** max(0, attempts - 1))

    # --- one job -----------------------------------------------------------------------

    async def run(self, job_id: str) -> None:
        lease = self.settings.hub_lease_seconds
        if not await asyncio.to_thread(self.db.claim, job_id, self.owner, lease):
            return  # finished, not due yet, or another runner holds it
        work = asyncio.create_task(self._run(job_id))
        heartbeat = asyncio.create_task(self._heartbeat(job_id, lease, work))
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            heartbeat.cancel()
        if work.cancelled():
            log.warning("hub job %s: lease lost, another runner took it over", job_id)
            return
        work.result()  # re-raise a crash: the queue logs it and the lease brings the job back

    async def _heartbeat(self, job_id: str, lease: float, work: asyncio.Task[None]) -> None:
        """Renew the lease every lease/3; a lease someone else took stops this run."""
        while True:
            await asyncio.sleep(lease / 3)
            if not await asyncio.to_thread(self.db.renew, job_id, self.owner, lease):
                work.cancel()
                return

    async def _run(self, job_id: str) -> None:
        job = await asyncio.to_thread(self.db.job, job_id)
        if job is None:
            return
        if not job.listed and not await self._list(job):
            return
        gate = asyncio.Semaphore(self.settings.hub_concurrency)

        async def one(row: Any) -> None:
            async with gate:
                await self._scan_file(job, row)

        while pending := await asyncio.to_thread(self.db.pending, job_id):
            now = time.time()
            ready = [f for f in pending if (f.next_attempt_at or 0.0) <= now]
            if not ready:
                await asyncio.sleep(min(f.next_attempt_at for f in pending) - now)
                continue
            await asyncio.gather(*(one(f) for f in ready))
        state = await asyncio.to_thread(self.db.finish, job_id, notify=bool(self.settings.notify_url))
        if self.metrics is not None:
            self.metrics.hub_revisions.labels(state=str(state)).inc()
        log.info("hub revision %s", state, extra={"event": "hub_job", "job": job_id, "repo": job.repo,
                                                  "revision": job.revision, "state": state})
        if self.settings.notify_url:
            await self._notify(job_id)

    async def _list(self, job: Any) -> bool:
        try:
            files = await asyncio.to_thread(self.client.list_tree, job.repo_type, job.repo, job.revision)
        except Exception as exc:
            attempts = job.attempts + 1
            last = attempts >= self.settings.hub_scan_attempts
            retry_at = None if last else time.time() + self._backoff(attempts)
            notify = bool(self.settings.notify_url)
            await asyncio.to_thread(self.db.list_failed, job.id, _describe(exc), retry_at=retry_at,
                                    notify=notify)
            if retry_at is None and self.metrics is not None:
                self.metrics.hub_revisions.labels(state="failed").inc()
            if retry_at is not None:
                await self.queue.enqueue(job.id, not_before=retry_at)
            elif notify:
                await self._notify(job.id)
            log.warning("hub tree listing failed", extra={"event": "hub_list_failed", "job": job.id,
                                                          "error": _describe(exc), "final": last})
            return False
        await asyncio.to_thread(self.db.add_files, job.id, files, MIN_SCAN_BYTES)
        for _ in range(sum(1 for f in files if f.size < MIN_SCAN_BYTES)):
            self._count_file("skipped")   # too small to hold a checkpoint: never fetched
        return True

    async def _scan_file(self, job: Any, row: Any) -> None:
        await asyncio.to_thread(self.db.file_state, row.id, state="running")
        try:
            if row.lfs_sha256 and (hit := await asyncio.to_thread(
                    self.store.find_cached, row.lfs_sha256, __version__, self.policy)) is not None:
                await asyncio.to_thread(self.db.file_state, row.id, state="done", error=None,
                                        verdict=hit.verdict, report_id=hit.record_id,
                                        container=_container({"format": hit.format}))
                self._count_file("done", reused=True)
                return
            url = self.client.resolve_url(job.repo_type, job.repo, job.revision, row.path)
            result = await self._scan_url(url, row)
        except Exception as exc:
            await self._file_failed(row, exc)
            return
        if result.report is None:
            await asyncio.to_thread(self.db.file_state, row.id, state="skipped", container=result.container,
                                    error=f"not a checkpoint (content sniffed as {result.container})")
            self._count_file("skipped")
            return
        # A report of a stopped worker (timeout, memory, crash) is kept but not reused.
        stopped = any(f.get("code") in SANDBOX_CODES for f in result.report.get("findings", []))
        cacheable = row.lfs_sha256 is not None and not stopped
        stored = await asyncio.to_thread(self.store.save, result.report, policy=self.policy,
                                         cacheable=cacheable)
        verdict = str(result.report.get("verdict"))
        if verdict == "invalid" and result.container == "pickle" and result.detail.startswith("no PROTO"):
            # Text whose first byte is also a protocol-0 opcode (`c`, `(`, `S`...): the scanner
            # found no pickle there. A real protocol-0 pickle with a global is judged unsafe.
            await asyncio.to_thread(self.db.file_state, row.id, state="skipped", container="text",
                                    report_id=stored.id, error="not a pickle (the scan found none)")
            self._count_file("skipped")
            return
        await asyncio.to_thread(self.db.file_state, row.id, state="done", error=None, verdict=verdict,
                                report_id=stored.id, container=_container(result.report))
        self._count_file("done")

    def _count_file(self, state: str, *, reused: bool = False) -> None:
        if self.metrics is not None:
            self.metrics.hub_files.labels(state=state, reused=str(reused).lower()).inc()

    async def _scan_url(self, url: str, row: Any) -> FileScan:
        headers = self.client.auth_headers
        scan_url = getattr(self.jobs, "scan_url", None)
        if scan_url is None:  # no sandbox pool (library use, tests): sniff + scan in a thread
            return await asyncio.to_thread(
                self.scan_fn, url, headers=headers, guard=self.guard, options=ScanOptions(allow=self.allow),
                name=row.path, sha256=row.lfs_sha256)
        # Sniffing reads two spans and parses nothing; the scan itself (every parser) runs in
        # the sandboxed worker pool like POST /scan/url, with its memory/CPU/time limits.
        sniffed = await asyncio.to_thread(sniff_remote, url, headers=headers, guard=self.guard,
                                          limits=ScanOptions().limits)
        if sniffed.container not in SCANNED:
            return FileScan(sniffed.container, None, sniffed.detail)
        report: dict[str, Any] = await scan_url(url, dict(headers) or None, self.guard, self.allow)
        source = report.setdefault("source", {})
        source.update(kind="hub", name=row.path, sha256=row.lfs_sha256)
        return FileScan(sniffed.container, report, sniffed.detail)

    async def _file_failed(self, row: Any, exc: BaseException) -> None:
        attempts = row.attempts + 1
        error = _describe(exc)
        if attempts >= self.settings.hub_scan_attempts:
            await asyncio.to_thread(self.db.file_state, row.id, state="failed", attempts=attempts,
                                    error=error[:2000], next_attempt_at=None)
            self._count_file("failed")
        else:
            await asyncio.to_thread(self.db.file_state, row.id, state="queued", attempts=attempts,
                                    error=error[:2000], next_attempt_at=time.time() + self._backoff(attempts))
        log.warning("hub file scan failed", extra={"event": "hub_file_failed", "path": row.path,
                                                   "attempt": attempts, "error": error})

    async def _notify(self, job_id: str) -> None:
        url = self.settings.notify_url
        if not url or job_id in self._notifying:
            return
        self._notifying.add(job_id)
        try:
            await self._send(url, job_id)
        finally:
            self._notifying.discard(job_id)

    async def _send(self, url: str, job_id: str) -> None:
        from ckptguard.app.hub.webhook import summary  # the same document GET .../revisions/{sha} serves

        doc = await asyncio.to_thread(summary, self.db, job_id)
        if doc is None:
            return
        error = await notify(url, doc, secret=self.settings.notify_secret,
                             retries=self.settings.notify_retries,
                             backoff_s=self.settings.hub_retry_backoff_seconds)
        await asyncio.to_thread(self.db.notified, job_id, error)


def _container(report: dict[str, Any]) -> str:
    return str(report.get("format") or "unknown")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CkptError):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"
