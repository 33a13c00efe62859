"""One scan, end to end: cache lookup -> sandboxed worker -> store -> metrics -> log line.

Routes call `ScanService.scan_file` (uploads) or `ScanService.keep` (URL scans) and answer
with the `Answer`'s record, streamed (app/responses.py); any other entry (webhook) can reuse
`lookup`/`record` so every report lands in the same tables under the same cache key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, get_args

from ckptguard.app.admission import RETRY, Admission
from ckptguard.app.jobs import Jobs, PoolFull
from ckptguard.app.metrics import Metrics
from ckptguard.app.problems import AppError
from ckptguard.app.settings import Settings
from ckptguard.app.store import Cached, Record, Store, policy_key
from ckptguard.app.worker import Hook
from ckptguard.core import __version__
from ckptguard.core.errors import CkptError
from ckptguard.core.records import record
from ckptguard.core.report import POLICY

log = logging.getLogger("ckptguard.scan")
HOOKS: frozenset[str] = frozenset(get_args(Hook))
LOGGED_CODES = 20


def _callers_source(source: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """A cached report's source as this request's own (kind, name, url, size, sha256)."""
    return {**source, **{k: info.get(k) for k in ("kind", "name", "url", "size", "sha256")}}


@record(frozen=True, slots=True)
class Answer:
    """What a scan request gets: its own record, and the report when this request made it
    (still in memory: streamed from there, not read back from the store)."""

    record: Record
    report: dict[str, Any] | None


def queue_full(detail: str) -> AppError:
    """503 for a scan the pool's queue cannot take now (settings.max_queued_scans)."""
    return AppError("SCAN_QUEUE_FULL", 503, f"the scan queue is full ({detail}); retry later",
                    headers=RETRY)


class ScanService:
    def __init__(self, settings: Settings, store: Store, jobs: Jobs, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.jobs = jobs
        self.metrics = metrics
        self.allow = frozenset(settings.allow_globals)
        self.policy = policy_key(POLICY, self.allow)
        self.admission = Admission({"upload": settings.max_uploads_in_flight,
                                    "url": settings.resolved_max_url_scans_in_flight},
                                   per_key=settings.max_in_flight_per_key,
                                   on_refusal=metrics.rejected.inc)
        # sha256 -> the stored analysis of the scan of those bytes now running (single flight)
        self._scanning: dict[str, asyncio.Future[Cached]] = {}

    async def lookup(self, sha256: str) -> Cached | None:
        return await asyncio.to_thread(self.store.find_cached, sha256, __version__, self.policy)

    async def record(self, report: dict[str, Any], *, cacheable: bool,
                     record_id: str | None = None) -> Record:
        return await asyncio.to_thread(self.store.save, report, policy=self.policy, cacheable=cacheable,
                                       record_id=record_id)

    async def keep(self, report: dict[str, Any], *, record_id: str | None = None) -> Answer:
        """Store a report made outside `scan_file` (a URL scan) with an id of its own (given:
        a job's, see Store.save). Never reused from the cache: its bytes were not all read, so
        no sha256 names them."""
        started = time.perf_counter()
        stored = await self.record(report, cacheable=False, record_id=record_id)
        self._observe(stored, _codes(report), cached=False, started=started)
        return Answer(stored, report)

    def refuse_if_full(self) -> None:
        """Before receiving an upload: refuse it (503) when its scan could not queue."""
        if self.jobs.full():
            self.metrics.rejected.inc()
            raise queue_full(f"{self.jobs.queue_depth} scans waiting")

    async def scan_file(self, path: str, info: dict[str, Any], *, hook: str | None = None,
                        wait: bool = True) -> Answer:
        """Scan a local file whose `info` has its sha256; this request's record (and report).

        With `wait` False a full queue raises a 503 AppError instead of waiting (cache hits
        are still answered)."""
        started = time.perf_counter()
        sha256 = str(info["sha256"])
        if hook is None and (hit := await self.lookup(sha256)) is not None \
                and (answer := await self._share(hit, info, started)) is not None:
            return answer
        if hook is None and (running := self._scanning.get(sha256)) is not None:
            # the same bytes are being scanned for another caller: share that analysis
            try:
                shared: Cached | None = await asyncio.shield(running)
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise                  # this caller went away
                shared = None              # the other caller went away: scan them here
            if shared is not None and (answer := await self._share(shared, info, started)) is not None:
                return answer
        hook_arg: Hook | None = hook if hook in HOOKS else None  # type: ignore[assignment]
        flight: asyncio.Future[Cached] = asyncio.get_running_loop().create_future()
        flight.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "unretrieved"
        if hook is None:
            self._scanning[sha256] = flight
        try:
            outcome = await self.jobs.scan(path, info, allow=self.allow, hook=hook_arg, wait=wait)
            self.metrics.duration.observe(time.perf_counter() - started)
            self.metrics.bytes_read.inc(int(outcome.report.get("io", {}).get("bytes_read", 0)))
            # stored before the callers waiting on this flight are answered: they share it
            stored = await self.record(outcome.report, cacheable=outcome.failure is None)
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
        codes = _codes(outcome.report)
        flight.set_result(Cached(analysis_id=stored.analysis_id, record_id=stored.id,
                                 source=stored.source, verdict=stored.verdict, format=stored.format,
                                 codes=codes))
        self._observe(stored, codes, cached=False, started=started)
        return Answer(stored, outcome.report)

    async def _share(self, analysis: Cached, info: dict[str, Any], started: float) -> Answer | None:
        """A cached or in-flight analysis, answered as the caller's own record: its id, its
        file name, its time (another caller's name and upload time are not this caller's to see).
        None when the analysis was deleted meanwhile: the caller's bytes are scanned instead."""
        own = await asyncio.to_thread(self.store.share, analysis,
                                      _callers_source(analysis.source, info))
        if own is None:
            return None
        self._observe(own, analysis.codes, cached=True, started=started)
        return Answer(own, None)

    def _observe(self, record: Record, codes: list[str], *, cached: bool, started: float) -> None:
        verdict, fmt = record.verdict, record.format
        self.metrics.scans.labels(verdict=verdict, format=fmt, cached=str(cached).lower()).inc()
        log.info("scan", extra={
            "event": "scan", "id": record.id, "sha256": record.source.get("sha256"),
            "size": record.source.get("size"), "verdict": verdict, "format": fmt, "cached": cached,
            "ms": round((time.perf_counter() - started) * 1000, 1), "findings": codes,
        })


def _codes(report: dict[str, Any]) -> list[str]:
    """The finding codes a log line names (the first LOGGED_CODES)."""
    return [str(f.get("code")) for f in report.get("findings", [])][:LOGGED_CODES]
