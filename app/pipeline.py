"""One scan, end to end: cache lookup -> sandboxed worker -> store -> metrics -> log line.

Routes call `ScanService.scan_file`; any other entry (URL, webhook) can reuse
`lookup`/`record` so every report lands in the same table under the same cache key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any, get_args

from ckptguard.app.jobs import Jobs, PoolFull
from ckptguard.app.metrics import Metrics
from ckptguard.app.problems import AppError
from ckptguard.app.settings import Settings
from ckptguard.app.store import Store, StoredScan, policy_key
from ckptguard.app.worker import Hook
from ckptguard.core import __version__
from ckptguard.core.errors import CkptError
from ckptguard.core.report import POLICY

log = logging.getLogger("ckptguard.scan")
HOOKS: frozenset[str] = frozenset(get_args(Hook))
RETRY_AFTER_S = 5


def _as_callers(report: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """A cached report under this request's own source (kind, name, url, size, sha256)."""
    source = {**(report.get("source") or {}),
              **{k: info.get(k) for k in ("kind", "name", "url", "size", "sha256")}}
    return {**report, "source": source}


def queue_full(detail: str) -> AppError:
    """503 for a scan the pool's queue cannot take now (settings.max_queued_scans)."""
    return AppError("SCAN_QUEUE_FULL", 503, f"the scan queue is full ({detail}); retry later",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class ScanService:
    def __init__(self, settings: Settings, store: Store, jobs: Jobs, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.jobs = jobs
        self.metrics = metrics
        self.allow = frozenset(settings.allow_globals)
        self.policy = policy_key(POLICY, self.allow)
        self.uploads_in_flight = 0   # on the event loop only: no lock needed
        # sha256 -> the report of the scan of those bytes now running (single flight)
        self._scanning: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def lookup(self, sha256: str) -> StoredScan | None:
        return await asyncio.to_thread(self.store.find_cached, sha256, __version__, self.policy)

    async def record(self, report: dict[str, Any], *, cacheable: bool) -> StoredScan:
        return await asyncio.to_thread(self.store.save, report, policy=self.policy, cacheable=cacheable)

    @contextlib.contextmanager
    def upload_slot(self) -> Iterator[None]:
        """One of `max_uploads_in_flight` receiving slots, or 503 + Retry-After."""
        if self.uploads_in_flight >= self.settings.max_uploads_in_flight:
            self.metrics.rejected.inc()
            raise AppError("UPLOADS_BUSY", 503, f"{self.uploads_in_flight} uploads are being "
                           "received; retry later", headers={"Retry-After": str(RETRY_AFTER_S)})
        self.uploads_in_flight += 1
        try:
            yield
        finally:
            self.uploads_in_flight -= 1

    def refuse_if_full(self) -> None:
        """Before receiving an upload: refuse it (503) when its scan could not queue."""
        if self.jobs.full():
            self.metrics.rejected.inc()
            raise queue_full(f"{self.jobs.queue_depth} scans waiting")

    async def scan_file(self, path: str, info: dict[str, Any], *, hook: str | None = None,
                        wait: bool = True) -> dict[str, Any]:
        """Scan a local file whose `info` has its sha256; the response body (report + id, cached).

        With `wait` False a full queue raises a 503 AppError instead of waiting (cache hits
        are still answered)."""
        started = time.perf_counter()
        sha256 = str(info["sha256"])
        if hook is None and (hit := await self.lookup(sha256)) is not None:
            return await self._share(hit.report, info, started)
        if hook is None and (running := self._scanning.get(sha256)) is not None:
            # the same bytes are being scanned for another caller: share that analysis
            try:
                shared: dict[str, Any] | None = await asyncio.shield(running)
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise                  # this caller went away
                shared = None              # the other caller went away: scan them here
            if shared is not None:
                return await self._share(shared, info, started)
        hook_arg: Hook | None = hook if hook in HOOKS else None  # type: ignore[assignment]
        flight: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        flight.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "unretrieved"
        if hook is None:
            self._scanning[sha256] = flight
        try:
            outcome = await self.jobs.scan(path, info, allow=self.allow, hook=hook_arg, wait=wait)
        except CkptError as exc:
            # one problem object per waiter: an exception raised in two tasks shares a traceback
            flight.set_exception(AppError(str(exc.code), 422, exc.message))
            raise AppError(str(exc.code), 422, exc.message) from exc
        except PoolFull as exc:
            self.metrics.rejected.inc()
            flight.set_exception(queue_full(str(exc)))
            raise queue_full(str(exc)) from exc
        except BaseException:
            flight.cancel()
            raise
        finally:
            if self._scanning.get(sha256) is flight:
                del self._scanning[sha256]
        flight.set_result(outcome.report)
        self.metrics.duration.observe(time.perf_counter() - started)
        self.metrics.bytes_read.inc(int(outcome.report.get("io", {}).get("bytes_read", 0)))
        stored = await self.record(outcome.report, cacheable=outcome.failure is None)
        self._observe(stored, cached=False, started=started)
        return stored.to_json(cached=False)

    async def _share(self, report: dict[str, Any], info: dict[str, Any], started: float) -> dict[str, Any]:
        """A cached or in-flight analysis, answered as the caller's own record: its id, its
        file name, its time (another caller's name and upload time are not this caller's to see)."""
        own = await self.record(_as_callers(report, info), cacheable=False)
        self._observe(own, cached=True, started=started)
        return own.to_json(cached=True)

    def _observe(self, stored: StoredScan, *, cached: bool, started: float) -> None:
        report = stored.report
        verdict, fmt = str(report.get("verdict")), str(report.get("format"))
        self.metrics.scans.labels(verdict=verdict, format=fmt, cached=str(cached).lower()).inc()
        source = report.get("source") or {}
        log.info("scan", extra={
            "event": "scan", "id": stored.id, "sha256": source.get("sha256"),
            "size": source.get("size"), "verdict": verdict, "format": fmt, "cached": cached,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            "findings": [f.get("code") for f in report.get("findings", [])][:20],
        })
