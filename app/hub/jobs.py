"""Durable hub jobs: the runner of one revision and of one file.

Strategy: the database is the source of truth (app/hub/db.py); a queue (app/jobqueue.py)
only carries job ids, so losing it loses nothing. Two ways to run a revision:
- in-process (SQLite): `run(job_id)` claims the revision with a lease renewed while it works
  (a replica or worker sharing the database never runs it at once) and scans its files
  `hub_concurrency` at a time; a failed file waits `hub_retry_backoff_seconds * 2**n` (its
  retry time in the row) and ends `failed` after `hub_scan_attempts` tries.
- as procrastinate tasks (PostgreSQL, app/hub/tasks.py): `list_revision` lists the tree and
  returns the files to queue as tasks of their own, `judge_file` scans one file and raises
  `RetryLater` for procrastinate to retry it with the same backoff; the last file to finish
  closes the revision (`HubDb.finish_if_complete`).
Per file: a stored report with the same LFS sha256 is reused; otherwise the file is sniffed
(head + tail, in a thread) and, if it can hold pickles or tensors, scanned over Range
requests in the sandboxed worker pool (`Jobs.scan_url`, like POST /scan/url). Finished files
are never scanned twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ckptguard.app.hub.client import (
    MIN_SCAN_BYTES,
    SCANNED,
    FileScan,
    HubClient,
    scan_remote_file,
    sniff_remote,
)
from ckptguard.app.hub.db import HubDb
from ckptguard.app.jobqueue import InProcessQueue, JobQueue
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

SANDBOX_CODES = frozenset({Code.TIMEOUT.value, Code.RESOURCE_LIMIT.value, Code.WORKER_CRASHED.value,
                           Code.INTERNAL_ERROR.value})
ScanFn = Callable[..., FileScan]


class RetryLater(Exception):
    """A try failed and another is due in `delay_s` (procrastinate schedules it)."""

    def __init__(self, delay_s: float, error: str) -> None:
        super().__init__(error)
        self.delay_s = delay_s


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
        self._tasks: set[asyncio.Task[str]] = set()
        self.queue: JobQueue | None = None   # set by app/tier.py: where retries are queued
        # how a closed revision's notification goes out: sent from here (in-process), or
        # queued as a task of its own (app/hub/tasks.py)
        self.announce: Callable[[str], Awaitable[object]] = self._notify_soon

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.to_thread(self.db.release, self.owner)
        await asyncio.to_thread(self.client.close)

    async def sweep(self) -> list[tuple[str, float]]:
        """The in-process queue's sweep: revisions to run (id, not before); finished
        revisions whose notification was never sent get it now."""
        for job_id in await asyncio.to_thread(self.db.unnotified):
            await self._notify_soon(job_id)
        return await asyncio.to_thread(self.db.runnable)

    async def _notify_soon(self, job_id: str) -> None:
        """Send the notification in a task of its own (cancelled only by `close`), not in the
        run that closed the revision: that run's lease heartbeat finds the job no longer
        running and cancels the run, and a send cut off half-way would hold the
        notification for its claim's whole term (notify_retries + 1 attempts' time)."""
        task = asyncio.create_task(self._notify(job_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        state = await asyncio.to_thread(self.db.finish_if_complete, job_id, owner=self.owner,
                                        notify=bool(self.settings.notify_url))
        if state is None:   # the lease was taken over meanwhile: the new holder closes it
            log.warning("hub job %s: lease lost before closing", job_id)
            return
        await self._closed(job, state)

    async def _closed(self, job: Any, state: str) -> None:
        """A revision just ended `state` (this runner closed it): count, log, announce."""
        if self.metrics is not None:
            self.metrics.hub_revisions.labels(state=state).inc()
        log.info("hub revision %s", state, extra={"event": "hub_job", "job": job.id, "repo": job.repo,
                                                  "revision": job.revision, "state": state})
        if self.settings.notify_url:
            await self.announce(job.id)

    # --- as procrastinate tasks (app/hub/tasks.py) ----------------------------------------

    async def list_revision(self, job_id: str) -> list[int] | None:
        """Take the revision and list its tree (once); the ids of its files still to judge,
        or None when there is nothing to do (cancelled, finished, or its listing failed).
        Raises RetryLater when the listing failed and another try is due."""
        if not await asyncio.to_thread(self.db.begin, job_id):
            return None
        job = await asyncio.to_thread(self.db.job, job_id)
        if not job.listed and not await self._list(job, distributed=True):
            return None
        pending = [f.id for f in await asyncio.to_thread(self.db.pending, job_id)]
        if not pending:
            await self.close_if_complete(job_id)
        return pending

    async def judge_file(self, file_id: int) -> str | None:
        """Judge one file unless it is finished; its revision's id (None: no such file).
        Raises RetryLater when the try failed and another is due."""
        row = await asyncio.to_thread(self.db.file, file_id)
        if row is None:
            return None
        if row.state in ("queued", "running"):
            job = await asyncio.to_thread(self.db.job, row.job_id)
            await self._scan_file(job, row, distributed=True)
        return str(row.job_id)

    async def close_if_complete(self, job_id: str) -> None:
        """After a file: the revision ends when its last file did (one closer wins)."""
        state = await asyncio.to_thread(self.db.finish_if_complete, job_id,
                                        notify=bool(self.settings.notify_url))
        if state is not None:
            await self._closed(await asyncio.to_thread(self.db.job, job_id), state)

    async def send_notification(self, job_id: str) -> None:
        """The notify task's body: send the revision's summary unless it was sent. Raises
        RetryLater while another sender's claim runs (it may have died mid-send)."""
        if await self._notify(job_id) == "busy":
            raise RetryLater(self._notify_budget(), "another sender holds the notification")

    # --- shared by both ------------------------------------------------------------------

    async def _list(self, job: Any, *, distributed: bool = False) -> bool:
        try:
            files = await asyncio.to_thread(self.client.list_tree, job.repo_type, job.repo, job.revision)
        except Exception as exc:
            attempts = job.attempts + 1
            last = attempts >= self.settings.hub_scan_attempts
            delay = self._backoff(attempts)
            # procrastinate keeps its own retry time; the in-process queue keeps it in the row
            retry_at = None if last or distributed else time.time() + delay
            await asyncio.to_thread(self.db.list_failed, job.id, _describe(exc), final=last,
                                    retry_at=retry_at, notify=bool(self.settings.notify_url))
            log.warning("hub tree listing failed", extra={"event": "hub_list_failed", "job": job.id,
                                                          "error": _describe(exc), "final": last})
            if last:
                await self._closed(job, "failed")
            elif distributed:
                raise RetryLater(delay, _describe(exc)) from exc
            elif isinstance(self.queue, InProcessQueue):
                await self.queue.enqueue(f"revision:{job.id}", not_before=time.time() + delay)
            return False
        await asyncio.to_thread(self.db.add_files, job.id, files, MIN_SCAN_BYTES)
        for _ in range(sum(1 for f in files if f.size < MIN_SCAN_BYTES)):
            self._count_file("skipped")   # too small to hold a checkpoint: never fetched
        return True

    async def _scan_file(self, job: Any, row: Any, *, distributed: bool = False) -> None:
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
            await self._file_failed(row, exc, distributed=distributed)
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
                                         cacheable=cacheable, record_id=row.report_key)
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

    async def _file_failed(self, row: Any, exc: BaseException, *, distributed: bool) -> None:
        attempts = row.attempts + 1
        error = _describe(exc)
        log.warning("hub file scan failed", extra={"event": "hub_file_failed", "path": row.path,
                                                   "attempt": attempts, "error": error})
        if attempts >= self.settings.hub_scan_attempts:
            await asyncio.to_thread(self.db.file_state, row.id, state="failed", attempts=attempts,
                                    error=error[:2000], next_attempt_at=None)
            self._count_file("failed")
            return
        delay = self._backoff(attempts)
        await asyncio.to_thread(self.db.file_state, row.id, state="queued", attempts=attempts,
                                error=error[:2000],
                                next_attempt_at=None if distributed else time.time() + delay)
        if distributed:
            raise RetryLater(delay, error) from exc

    def _notify_budget(self) -> float:
        """The longest one notification takes, all its retries included (its claim's term)."""
        s = self.settings
        return float((s.notify_retries + 1) * s.notify_timeout_seconds
                     + s.hub_retry_backoff_seconds * 2 ** s.notify_retries)

    async def _notify(self, job_id: str) -> str:
        """Send the revision's summary if it is due and no one else sends it: "claimed" (sent
        or failed for good), "busy" or "done" (HubDb.claim_notification)."""
        url = self.settings.notify_url
        if not url or job_id in self._notifying:
            return "done"
        claim = await asyncio.to_thread(self.db.claim_notification, job_id, self._notify_budget())
        if claim != "claimed":
            return claim
        self._notifying.add(job_id)
        try:
            await self._send(url, job_id)
        finally:
            self._notifying.discard(job_id)
        return claim

    async def _send(self, url: str, job_id: str) -> None:
        from ckptguard.app.hub.webhook import summary  # the same document GET .../revisions/{sha} serves

        doc = await asyncio.to_thread(summary, self.db, job_id)
        if doc is None:
            return
        error = await notify(url, doc, secret=self.settings.notify_secret,
                             retries=self.settings.notify_retries,
                             backoff_s=self.settings.hub_retry_backoff_seconds,
                             timeout_s=self.settings.notify_timeout_seconds)
        await asyncio.to_thread(self.db.notified, job_id, error)


def _container(report: dict[str, Any]) -> str:
    return str(report.get("format") or "unknown")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CkptError):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"
