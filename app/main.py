"""The FastAPI service: `create_app(settings)` and `serve()` (what `ckptguard serve` runs).

Example:
    >>> from app.main import create_app
    >>> from app.settings import Settings
    >>> app = create_app(Settings(data_dir="/tmp/ckptguard"))   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ckptguard.app import logs, problems
from ckptguard.app.deps import AuthDep
from ckptguard.app.jobs import Jobs
from ckptguard.app.metrics import Metrics
from ckptguard.app.openapi import install_openapi
from ckptguard.app.pipeline import ScanService
from ckptguard.app.problems import problem
from ckptguard.app.routes import health, scan, scans, ui
from ckptguard.app.settings import Settings
from ckptguard.app.store import Store
from ckptguard.app.uploads import sweep_stale
from ckptguard.app.worker import WorkerLimits
from ckptguard.core import __version__

log = logging.getLogger("ckptguard.app")

MiB = 1024 * 1024
UPLOAD_PATHS = frozenset({"/scan"})   # streamed with their own cap (app/uploads.py)


class BodyLimit:
    """ASGI middleware for every body but the streamed upload route's (app/uploads.py paces
    that one): the body is read here, whole, before the route runs: 413 past `max_bytes`,
    408 when it has not arrived within `timeout_s` (a trickling client holds no handler).
    Both answers close the connection: the rest of the body is never read."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UPLOAD_PATHS:
            await self.app(scope, receive, send)
            return
        too_large = problem("PAYLOAD_TOO_LARGE", 413, f"the request body exceeds {self.max_bytes} "
                            "bytes", headers={"connection": "close"})
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_bytes):
                await too_large(scope, receive, send)
                return
        try:
            first = await asyncio.wait_for(self._read_body(receive), self.timeout_s)
        except TimeoutError:
            await problem("REQUEST_TIMEOUT", 408, f"the request body did not arrive within "
                          f"{self.timeout_s:g} s", headers={"connection": "close"})(scope, receive, send)
            return
        if first is None:
            await too_large(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()   # after the body: only a disconnect can come
            replayed = True
            return first

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> Message | None:
        """The whole body as one `http.request` message (or the disconnect that cut it);
        None past `max_bytes`."""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


async def _sweep_periodically(upload_dir: Path, stale_age: float, interval: float) -> None:
    """Spool files of uploads a killed server never finished, removed while it runs (not only
    at start: a replica that restarts rarely would otherwise keep them for ever)."""
    while True:
        await asyncio.sleep(interval)
        try:
            removed = await asyncio.to_thread(sweep_stale, upload_dir, stale_age)
        except OSError:
            log.exception("sweeping stale uploads failed")
            continue
        if removed:
            log.info("stale uploads removed", extra={"event": "sweep", "removed": removed})


async def _retain_periodically(store: Store, days: float, interval: float) -> None:
    """Retention (CKPTGUARD_RETENTION_DAYS): scans older than `days` are deleted, their analyses
    with the last scan that references them. In a thread: a large analysis takes seconds to delete."""
    while True:
        try:
            removed = await asyncio.to_thread(
                store.sweep, datetime.now(UTC) - timedelta(days=days))
        except Exception:
            log.exception("the retention sweep failed")
        else:
            if removed:
                log.info("old scans removed", extra={"event": "retention", "removed": removed})
        await asyncio.sleep(interval)


def scan_pool(settings: Settings, metrics: Metrics) -> Jobs:
    """The process's sandboxed scan pool (not started)."""
    return Jobs(settings.workers,
                WorkerLimits(memory_bytes=settings.worker_memory_mb * MiB,
                             cpu_seconds=settings.worker_cpu_seconds,
                             test_hooks=settings.test_hooks,
                             recycle_growth_bytes=settings.worker_recycle_mb * MiB),
                timeout_s=settings.scan_timeout_seconds, max_scans=settings.worker_max_scans,
                max_queued=settings.max_queued_scans, on_restart=metrics.restarted)


def create_app(settings: Settings | None = None, *, run_jobs: bool = True) -> FastAPI:
    """Build the service. The database, the worker pool and the job tier start in the lifespan.
    `run_jobs` False: an API-only node (`ckptguard serve --api-only`) that queues hub jobs and
    asynchronous URL scans for `ckptguard worker`s (app/tier.py)."""
    settings = settings or Settings()
    logs.configure(settings.log_level)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await asyncio.to_thread(Store.open, settings.resolved_database_url)
        stale_age = max(3600.0, 2 * settings.scan_timeout_seconds)
        swept = await asyncio.to_thread(sweep_stale, settings.resolved_upload_dir, stale_age)
        jobs = scan_pool(settings, metrics)
        await jobs.start()
        metrics.watch_pool(lambda: jobs.queue_depth, lambda: jobs.busy)
        app.state.store, app.state.jobs = store, jobs
        app.state.scans = ScanService(settings, store, jobs, metrics)
        from ckptguard.app.tier import open_tier  # hub revisions and async URL scans

        tier = await open_tier(settings, app.state.scans, metrics, run_jobs=run_jobs)
        app.state.hub, app.state.queue, app.state.url_scans = tier.hub, tier.queue, tier.urls.db
        metrics.watch_queues(tier.queue.stats)
        sweeper = asyncio.create_task(_sweep_periodically(settings.resolved_upload_dir, stale_age,
                                                          settings.upload_sweep_seconds))
        retainer = None
        if settings.retention_days > 0:
            retainer = asyncio.create_task(_retain_periodically(
                store, settings.retention_days, settings.retention_sweep_seconds))
        log.info("started", extra={"event": "start", "version": __version__,
                                   "database": store.engine.url.render_as_string(hide_password=True),
                                   "workers": settings.workers, "stale_uploads_removed": swept})
        try:
            yield
        finally:
            sweeper.cancel()
            if retainer is not None:
                retainer.cancel()
            await tier.close()
            await jobs.close()
            await asyncio.to_thread(store.close)

    # /docs is served from local files (app/routes/ui.py): no CDN, works offline
    app = FastAPI(title="ckptguard", version=__version__, lifespan=lifespan,
                  summary="Judge model checkpoints without executing them",
                  docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.metrics = metrics
    problems.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       timeout_s=settings.body_timeout_seconds)
    app.include_router(scan.router)
    app.include_router(scans.router)
    app.include_router(health.router)
    if importlib.util.find_spec("ckptguard.app.routes.remote") is not None:
        from ckptguard.app.routes import remote  # POST /scan/url (the remote-loading engineer's router)

        app.include_router(remote.router, dependencies=[AuthDep])
    from ckptguard.app.routes import hub  # POST /webhooks/huggingface, GET /hub/... (app/routes/hub.py)

    app.include_router(hub.router)
    app.include_router(ui.router)
    install_openapi(app)
    return app


def serve(host: str | None = None, port: int | None = None, *, api_only: bool = False) -> None:
    """Run the service with uvicorn on the settings' defaults (127.0.0.1:8000, ./data)."""
    import uvicorn

    from ckptguard.app.http_protocol import HeadDeadlineProtocol

    settings = Settings()
    uvicorn.run(create_app(settings, run_jobs=not api_only), host=host or settings.host,
                port=settings.port if port is None else port,
                log_level=settings.log_level.lower(), access_log=False,
                log_config=logs.uvicorn_log_config(settings.log_level),
                http=HeadDeadlineProtocol.with_head_timeout(settings.header_timeout_seconds),
                timeout_graceful_shutdown=10, server_header=False)   # no "server: uvicorn"


def work(settings: Settings | None = None) -> None:
    """`ckptguard worker`: run hub jobs and asynchronous URL scans, no HTTP, until SIGTERM."""
    settings = settings or Settings()
    logs.configure(settings.log_level)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_work(settings))
    except BaseException:
        loop.close()
        raise
    # Every job has finished or gone back to the queue and the store is closed. A thread still
    # blocked in a remote read (its job already handed back) would hold the exit until the
    # read times out: asyncio.run and the interpreter's exit both join executor threads.
    # Leave without them, so an orchestrator's SIGTERM stops the worker within its grace.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


async def _work(settings: Settings) -> None:
    from ckptguard.app.tier import open_tier, wait_for_stop

    metrics = Metrics()
    store = await asyncio.to_thread(Store.open, settings.resolved_database_url)
    jobs = scan_pool(settings, metrics)
    try:
        await jobs.start()
        tier = await open_tier(settings, ScanService(settings, store, jobs, metrics), metrics,
                               run_jobs=True)
        log.info("worker started", extra={"event": "worker_start", "version": __version__,
                                          "distributed": settings.distributed,
                                          "workers": settings.workers})
        try:
            await wait_for_stop()
        finally:
            await tier.close()
    finally:
        await jobs.close()
        await asyncio.to_thread(store.close)
    log.info("worker stopped", extra={"event": "worker_stop"})
