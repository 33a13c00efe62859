"""The job tier of one process: which queue, who runs its jobs, and how it stops.

    ckptguard serve             HTTP + enqueue + runs jobs (one process does everything)
    ckptguard serve --api-only  HTTP + enqueue; jobs run elsewhere
    ckptguard worker            runs jobs only (no HTTP)
On PostgreSQL (`Settings.distributed`) the queue is procrastinate's (app/hub/tasks.py): any
number of workers on any host that reaches the database and the hub. On SQLite it is the
in-process queue (app/jobqueue.py): the tables with their leases are the queue, so an
API-only process leaves its jobs to a worker on the same host, whose sweeper finds them.
Uploads (`POST /scan`) are never jobs: the API node that received the file scans it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ckptguard.app.hub.jobs import HubRunner
from ckptguard.app.jobqueue import InProcessQueue, JobQueue, QueueStats
from ckptguard.app.metrics import Metrics
from ckptguard.app.pipeline import ScanService
from ckptguard.app.settings import Settings
from ckptguard.app.urlscans import UrlScanDb, UrlScanRunner
from ckptguard.core.records import field, record

log = logging.getLogger("ckptguard.tier")

IN_PROCESS_RUNNERS = 2   # revisions / URL scans run at once by the in-process queue
RESTART_PAUSE_S = 2.0    # before procrastinate's worker is started again


@record
class Tier:
    hub: HubRunner
    urls: UrlScanRunner
    queue: JobQueue
    _worker: asyncio.Task[None] | None = field(default=None)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()   # procrastinate stops gracefully: its jobs end or go back
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
        await self.queue.close()
        await self.hub.close()


async def open_tier(settings: Settings, scans: ScanService, metrics: Metrics, *, run_jobs: bool) -> Tier:
    """The queue (started) and the runners; with `run_jobs` this process runs jobs too, in the
    background, until `Tier.close`."""
    hub = HubRunner(settings, scans.store, jobs=scans.jobs, metrics=metrics)
    urls = UrlScanRunner(scans, UrlScanDb(scans.store.engine))
    distributed: Any = None   # app.hub.tasks.ProcrastinateQueue (imported on PostgreSQL only)
    if settings.distributed:
        from ckptguard.app.hub.tasks import ProcrastinateQueue, Runtime, build_app

        runtime = Runtime()
        runtime.hub, runtime.urls = hub, urls
        distributed = ProcrastinateQueue(build_app(settings, runtime), settings)
        hub.announce = distributed.notify_later
        queue: JobQueue = distributed
    else:
        async def handle(job: str) -> None:
            kind, _, ident = job.partition(":")
            await (hub.run(ident) if kind == "revision" else urls.run(ident))

        async def sweep() -> list[tuple[str, float]]:
            revisions = [(f"revision:{job_id}", when) for job_id, when in await hub.sweep()]
            return revisions + [(f"url:{i}", 0.0) for i in await asyncio.to_thread(urls.db.runnable)]

        async def stats() -> list[QueueStats]:
            return await asyncio.to_thread(_in_process_stats, hub, urls)

        queue = InProcessQueue(handle, sweep, stats, workers=IN_PROCESS_RUNNERS if run_jobs else 0,
                               sweep_every_s=max(0.5, settings.hub_lease_seconds / 2))
    hub.queue = queue
    await queue.start()
    tier = Tier(hub, urls, queue)
    if run_jobs and distributed is not None:   # the in-process queue's runners started with it
        tier._worker = asyncio.create_task(_supervise(distributed), name="job-worker")
    return tier


async def _supervise(queue: Any) -> None:
    """procrastinate's worker, started again whenever it stops on its own: it stops when one of
    its side tasks fails (the database restarted, a connection was cut). Only this process's
    stop (cancelling this task: the jobs finish or go back) ends it."""
    while True:
        try:
            await queue.run_worker()
            log.warning("the job worker stopped; starting it again in %g s", RESTART_PAUSE_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the job worker failed; starting it again in %g s", RESTART_PAUSE_S)
        await asyncio.sleep(RESTART_PAUSE_S)


async def wait_for_stop() -> None:
    """`ckptguard worker`'s main: the tier runs its jobs in the background; SIGTERM or SIGINT
    returns, and `Tier.close` then lets the jobs finish or hands them back."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _in_process_stats(hub: HubRunner, urls: UrlScanRunner) -> list[QueueStats]:
    import sqlalchemy as sa

    from ckptguard.app.tables import hub_files, hub_jobs, url_scans

    def count(table: sa.Table, state: str) -> int:
        with hub.db.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table)
                                    .where(table.c.state == state)).scalar_one())

    with hub.db.engine.connect() as conn:
        # a retry is a try past the first: every attempt a failed listing or file recorded
        retries = int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(hub_files.c.attempts), 0)))
                      .scalar_one()) + int(conn.execute(sa.select(sa.func.coalesce(
                          sa.func.sum(hub_jobs.c.attempts), 0))).scalar_one())
    return [QueueStats("hub", count(hub_jobs, "queued"), count(hub_jobs, "running"), retries, 0),
            QueueStats("url", count(url_scans, "queued"), count(url_scans, "running"), 0, 0)]
