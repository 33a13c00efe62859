"""The job tier on PostgreSQL: procrastinate tasks behind the `JobQueue` seam.

Strategy: procrastinate (a PostgreSQL task queue: no broker) carries the job ids; the rows
(app/hub/db.py, app/urlscans.py) stay the truth the API reads. Its schema comes with the
project's migrations (0004_jobs). The tasks:
- `hub.revision(job_id)`: lists the tree once, then queues one `hub.file` task per file still
  to judge (a revision with nothing to judge closes at once). Queueing lock `revision:<id>`:
  a revision is never queued twice; lock `revision:<id>`: never run twice at once.
- `hub.file(file_id)`: judges one file (lock `file:<id>`: never twice at once); the last file of a revision to
  finish closes it (`HubDb.finish_if_complete`, one closer wins) and queues `hub.notify`.
- `hub.notify(job_id)`: posts the revision's summary (queueing lock: one pending send).
- `url.scan(scan_id)`: an asynchronous URL scan (`POST /scan/url?async=true`).
- `jobs.recover` (periodic, every `queue_recover_seconds`): jobs of a worker whose heartbeat
  stopped for `queue_stalled_seconds` (killed, lost its host) are queued again, and so are
  rows recorded `queued` that have no job (their API node died before it deferred one).
- `hub.reconcile` (periodic, cron `reconcile_cron`): every branch a delivery named is asked
  for its head, and a commit not seen before is queued as a backfill.
Retries: a failed try raises `RetryLater`; `Backoff` schedules the next one
`hub_retry_backoff_seconds * 2**n` later, up to `hub_scan_attempts`. A job stopped by a
worker's shutdown (SIGTERM past `worker_shutdown_seconds`) goes back to the queue at once.
Priorities (app/jobqueue.py): interactive URL scans, then rescans, pushes, backfills.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from typing import Any

import procrastinate
import sqlalchemy as sa
from procrastinate import exceptions as pexc
from procrastinate.job_context import JobContext
from procrastinate.jobs import Job
from procrastinate.retry import BaseRetryStrategy, RetryDecision

from ckptguard.app.jobqueue import PRIORITY_BACKFILL, PRIORITY_INTERACTIVE, PRIORITY_PUSH, QueueStats
from ckptguard.app.settings import Settings

log = logging.getLogger("ckptguard.tasks")

HUB_QUEUE, URL_QUEUE, MAINTENANCE_QUEUE = "hub", "url", "maintenance"
QUEUES = (URL_QUEUE, HUB_QUEUE, MAINTENANCE_QUEUE)
REVISION_TASK, FILE_TASK, NOTIFY_TASK = "hub.revision", "hub.file", "hub.notify"
URL_TASK, RECOVER_TASK, RECONCILE_TASK = "url.scan", "jobs.recover", "hub.reconcile"


def conninfo(database_url: str) -> str:
    """The libpq URI of a SQLAlchemy PostgreSQL URL (`postgresql+psycopg://...`)."""
    url = sa.engine.make_url(database_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def application_name() -> str:
    """How this process's job-tier connections show in pg_stat_activity."""
    return f"ckptguard-jobs-{os.getpid()}"


class Backoff(BaseRetryStrategy):
    """`RetryLater` says when; a shutdown's cancellation retries at once; a bug (any other
    exception) retries with the same backoff until `attempts` tries were made."""

    def __init__(self, attempts: int, base_s: float) -> None:
        self.attempts = attempts
        self.base_s = base_s

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        from ckptguard.app.hub.jobs import RetryLater

        if isinstance(exception, asyncio.CancelledError | pexc.JobAborted):
            return RetryDecision(retry_at=_later(0.0))
        if isinstance(exception, RetryLater):
            return RetryDecision(retry_at=_later(exception.delay_s))
        if job.attempts + 1 >= self.attempts:
            return None
        return RetryDecision(retry_at=_later(self.base_s * 2 ** job.attempts))


def _later(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


class Runtime:
    """What the tasks run with in a worker (set by app/tier.py before the worker starts)."""

    hub: Any = None        # app.hub.jobs.HubRunner
    urls: Any = None       # app.urlscans.UrlScanRunner


def build_app(settings: Settings, runtime: Runtime) -> procrastinate.App:
    """The procrastinate app: the connector to the store's database and every task."""
    connector = procrastinate.PsycopgConnector(conninfo=conninfo(settings.resolved_database_url),
                                               kwargs={"application_name": application_name()},
                                               min_size=1, max_size=settings.worker_concurrency + 4)
    app = procrastinate.App(connector=connector)
    backoff = Backoff(settings.hub_scan_attempts, settings.hub_retry_backoff_seconds)

    @app.task(name=REVISION_TASK, queue=HUB_QUEUE, retry=backoff, pass_context=True)
    async def revision(context: JobContext, job_id: str) -> None:
        files = await runtime.hub.list_revision(job_id)
        for file_id in files or ():
            # a lock, no queueing lock: a revision listed again after its worker died may queue a
            # file twice, and the second run finds it judged; a queueing lock would instead stop
            # the recovery of a dead worker's job on that file from queueing it again
            await app.configure_task(FILE_TASK, lock=f"file:{file_id}",
                                     priority=context.job.priority).defer_async(file_id=file_id)

    @app.task(name=FILE_TASK, queue=HUB_QUEUE, retry=backoff)
    async def file(file_id: int) -> None:
        job_id = await runtime.hub.judge_file(file_id)
        if job_id is not None:
            await runtime.hub.close_if_complete(job_id)

    @app.task(name=NOTIFY_TASK, queue=HUB_QUEUE, retry=backoff)
    async def notify(job_id: str) -> None:
        await runtime.hub.send_notification(job_id)

    @app.task(name=URL_TASK, queue=URL_QUEUE, retry=Backoff(2, settings.hub_retry_backoff_seconds))
    async def url_scan(scan_id: str) -> None:
        await runtime.urls.run(scan_id, locked=True)

    recover_every = max(1, int(settings.queue_recover_seconds))

    # croniter's optional sixth column is seconds
    @app.periodic(cron=f"* * * * * */{recover_every}" if recover_every < 60 else "* * * * *",
                  periodic_id="recover")
    @app.task(name=RECOVER_TASK, queue=MAINTENANCE_QUEUE, queueing_lock=RECOVER_TASK)
    async def recover(timestamp: int) -> None:
        await recover_stalled(app, settings)
        await requeue_orphans(ProcrastinateQueue(app, settings), settings)

    if settings.reconcile_cron:
        @app.periodic(cron=settings.reconcile_cron, periodic_id="reconcile")
        @app.task(name=RECONCILE_TASK, queue=MAINTENANCE_QUEUE, queueing_lock=RECONCILE_TASK)
        async def reconcile(timestamp: int) -> None:
            await reconcile_all(runtime.hub, ProcrastinateQueue(app, settings))

    return app


async def _defer_once(app: procrastinate.App, task: str, key: str, priority: int, **kwargs: Any) -> None:
    """Queue `task` unless one with this key waits already (the queueing lock); `lock`: never
    two at once."""
    try:
        await app.configure_task(task, lock=key, queueing_lock=key, priority=priority).defer_async(**kwargs)
    except pexc.AlreadyEnqueued:
        pass


async def recover_stalled(app: procrastinate.App, settings: Settings) -> int:
    """Queue again the jobs of workers whose heartbeat stopped; how many."""
    stalled = list(await app.job_manager.get_stalled_jobs(
        seconds_since_heartbeat=settings.queue_stalled_seconds))
    recovered = []
    for job in stalled:
        try:
            await app.job_manager.retry_job(job)
        except Exception:   # e.g. the same job waits already (queueing lock): the rest still go
            log.exception("stalled job %s could not be queued again", job.id)
            continue
        recovered.append(job)
        log.warning("stalled job queued again", extra={"event": "job_recovered", "task": job.task_name,
                                                       "job": job.id, "queue": job.queue})
    stalled = recovered
    if stalled:
        await app.connector.execute_query_async(
            "INSERT INTO job_recoveries (queue, task, recovered_at) "
            "SELECT q, t, now() FROM unnest(%(queues)s::text[], %(tasks)s::text[]) AS u(q, t)",
            queues=[j.queue for j in stalled], tasks=[j.task_name for j in stalled])
    return len(stalled)


async def requeue_orphans(queue: ProcrastinateQueue, settings: Settings) -> None:
    """Rows queued but without a job: the node that recorded them died before it deferred the
    job (killed mid-webhook, mid-request). Older than a recovery period, so a defer on its way
    is not raced."""
    rows = await queue.app.connector.execute_query_all_async(
        "SELECT 'revision' AS kind, h.id FROM hub_jobs h WHERE h.state = 'queued' "
        "AND h.updated_at < now() - make_interval(secs => %(age)s) AND NOT EXISTS ("
        "SELECT 1 FROM procrastinate_jobs j WHERE j.queueing_lock = 'revision:' || h.id "
        "AND j.status IN ('todo', 'doing')) "
        "UNION ALL SELECT 'url', u.id FROM url_scans u WHERE u.state = 'queued' "
        "AND u.updated_at < now() - make_interval(secs => %(age)s) AND NOT EXISTS ("
        "SELECT 1 FROM procrastinate_jobs j WHERE j.queueing_lock = 'url:' || u.id "
        "AND j.status IN ('todo', 'doing'))", age=float(settings.queue_stalled_seconds))
    for row in rows:
        log.warning("queued row without a job: queued again", extra={"event": "job_orphan",
                                                                     "kind": row["kind"], "id": row["id"]})
        if row["kind"] == "revision":
            await queue.enqueue_revision(row["id"])
        else:
            await queue.enqueue_url_scan(row["id"])


async def reconcile_all(hub: Any, queue: ProcrastinateQueue) -> None:
    """Every known branch's head, queued as a backfill when not seen before."""
    from ckptguard.app.hub.webhook import Target, accept

    for repo_type, repo, ref in await asyncio.to_thread(hub.db.known_refs):
        try:
            sha = await asyncio.to_thread(hub.client.head_sha, repo_type, repo, ref)
        except Exception as exc:
            log.warning("reconcile: head of %s %s %s unknown: %s", repo_type, repo, ref, exc)
            continue
        for item in await asyncio.to_thread(accept, hub.db, [Target(repo_type, repo, ref, sha)]):
            if item["new_job"]:
                await queue.enqueue_revision(item["job_id"], priority=PRIORITY_BACKFILL)


class ProcrastinateQueue:
    """`JobQueue` on procrastinate: enqueue is a defer; workers run `ckptguard worker`."""

    def __init__(self, app: procrastinate.App, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def start(self) -> None:
        await self.app.open_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def enqueue_revision(self, job_id: str, *, priority: int = PRIORITY_PUSH) -> None:
        await _defer_once(self.app, REVISION_TASK, f"revision:{job_id}", priority, job_id=job_id)

    async def enqueue_url_scan(self, scan_id: str) -> None:
        await _defer_once(self.app, URL_TASK, f"url:{scan_id}", PRIORITY_INTERACTIVE, scan_id=scan_id)

    async def notify_later(self, job_id: str) -> None:
        await _defer_once(self.app, NOTIFY_TASK, f"notify:{job_id}", PRIORITY_PUSH, job_id=job_id)

    async def cancel_revision(self, job_id: str) -> None:
        """The row is `cancelled` already (a task that starts anyway does nothing); the
        waiting job is cancelled too, so it leaves the queue."""
        for job in await self.app.job_manager.list_jobs_async(queueing_lock=f"revision:{job_id}",
                                                              status="todo"):
            assert job.id is not None
            await self.app.job_manager.cancel_job_by_id_async(job.id)

    async def stats(self) -> list[QueueStats]:
        rows = await self.app.connector.execute_query_all_async(
            "SELECT q.name, "
            "(SELECT count(*) FROM procrastinate_jobs j WHERE j.queue_name = q.name AND j.status = 'todo') "
            "AS queued, "
            "(SELECT count(*) FROM procrastinate_jobs j WHERE j.queue_name = q.name AND j.status = 'doing') "
            "AS running, "
            "(SELECT count(*) FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
            "WHERE j.queue_name = q.name AND e.type = 'deferred_for_retry') AS retries, "
            "(SELECT count(*) FROM job_recoveries r WHERE r.queue = q.name) AS stalled "
            "FROM unnest(%(queues)s::text[]) AS q(name)", queues=list(QUEUES))
        return [QueueStats(r["name"], int(r["queued"]), int(r["running"]), int(r["retries"]),
                           int(r["stalled"])) for r in rows]

    async def run_worker(self) -> None:
        """Run jobs until cancelled (then: finish them for `worker_shutdown_seconds`, hand the
        rest back), or until procrastinate stops on its own (a side task failed)."""
        s = self.settings
        await self.app.run_worker_async(
            queues=list(QUEUES), concurrency=s.worker_concurrency, name="ckptguard-worker",
            install_signal_handlers=False,
            shutdown_graceful_timeout=s.worker_shutdown_seconds,
            update_heartbeat_interval=s.queue_heartbeat_seconds,
            stalled_worker_timeout=s.queue_stalled_seconds,
            fetch_job_polling_interval=2.0, abort_job_polling_interval=5.0)



def __getattr__(name: str) -> procrastinate.App:
    """`procrastinate --app=ckptguard.app.hub.tasks.admin_app shell` (list, cancel, retry
    jobs; settings from CKPTGUARD_* variables): the app, built when procrastinate's command
    line asks for it. Its tasks are registered to be named, never run from there."""
    if name == "admin_app":
        return build_app(Settings(), Runtime())
    raise AttributeError(name)
