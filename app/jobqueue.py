"""The job tier's seam: `JobQueue`, and the in-process queue the embedded default runs.

Strategy: the database is the source of truth (hub_jobs/hub_files, url_scans); a queue only
carries job ids to whoever runs them, at least once, and every runner is idempotent. Two
implementations sit behind `JobQueue`:
- `InProcessQueue` (SQLite, the embedded default): asyncio tasks in the process, plus a
  sweeper that re-reads the tables at start and every `lease/2` seconds, so queued jobs whose
  retry time has come and running jobs whose lease expired (their process died) run again.
  An API-only process leaves the rows to a `ckptguard worker`'s sweeper.
- `ProcrastinateQueue` (PostgreSQL, app/hub/tasks.py): procrastinate's tasks, locks, retries,
  periodic tasks and stalled-job recovery; no lease, no sweeper, no retry timestamps.
Job ids carry their kind: `revision:<hub job id>` or `url:<url scan id>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from ckptguard.core.records import record

log = logging.getLogger("ckptguard.jobqueue")

# procrastinate runs higher priorities first; the in-process queue runs in arrival order.
PRIORITY_INTERACTIVE = 20   # POST /scan/url?async=true: someone is waiting for it
PRIORITY_RESCAN = 10        # an operator asked for this revision again
PRIORITY_PUSH = 0           # a webhook delivery
PRIORITY_BACKFILL = -10     # the periodic reconcile's finds


@record(frozen=True, slots=True)
class QueueStats:
    """One queue's figures for /metrics."""

    queue: str
    queued: int
    running: int
    retries: int
    stalled_recoveries: int


class JobQueue(Protocol):
    """Carries job ids to whoever runs them. At-least-once: every runner is idempotent."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def enqueue_revision(self, job_id: str, *, priority: int = PRIORITY_PUSH) -> None: ...
    async def enqueue_url_scan(self, scan_id: str) -> None: ...
    async def cancel_revision(self, job_id: str) -> None: ...
    async def stats(self) -> list[QueueStats]: ...


Handler = Callable[[str], Awaitable[None]]
Sweep = Callable[[], Awaitable[list[tuple[str, float]]]]
StatsFn = Callable[[], Awaitable[list[QueueStats]]]


class InProcessQueue:
    """asyncio tasks in this process, plus a sweeper that re-reads the job tables.

    `handler` runs one job id (`kind:id`); `sweep` lists (job id, not before) to run. With
    `workers=0` (an API-only process) nothing runs here: the rows wait for a worker's sweep.
    """

    def __init__(self, handler: Handler, sweep: Sweep, stats: StatsFn, *, workers: int = 1,
                 sweep_every_s: float = 30.0) -> None:
        self._handler = handler
        self._sweep = sweep
        self._stats = stats
        self._workers = workers
        self._sweep_every = sweep_every_s
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: dict[str, asyncio.TimerHandle] = {}

    async def start(self) -> None:
        if self._workers == 0:
            return
        self._tasks = [asyncio.create_task(self._work(), name=f"job-{i}") for i in range(self._workers)]
        self._tasks.append(asyncio.create_task(self._sweeper(), name="job-sweeper"))

    async def enqueue_revision(self, job_id: str, *, priority: int = PRIORITY_PUSH) -> None:
        await self.enqueue(f"revision:{job_id}")

    async def enqueue_url_scan(self, scan_id: str) -> None:
        await self.enqueue(f"url:{scan_id}")

    async def cancel_revision(self, job_id: str) -> None:
        """Nothing to do: the row is `cancelled`, and a cancelled row is never claimed."""

    async def stats(self) -> list[QueueStats]:
        return await self._stats()

    async def enqueue(self, job_id: str, *, not_before: float = 0.0) -> None:
        if self._workers == 0:
            return
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
                log.exception("job %s crashed", job_id)

    async def _sweeper(self) -> None:
        while True:
            try:
                for job_id, when in await self._sweep():
                    await self.enqueue(job_id, not_before=when)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job sweep failed")
            await asyncio.sleep(self._sweep_every)

    async def close(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
