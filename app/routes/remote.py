"""POST /scan/url: scan a remote checkpoint over HTTP Range requests.

Strategy: the route stays thin. It checks the URL with the service's guard first (a
refused URL never reaches a worker), then runs `core.loader.scan_url` in the service's
scan pool when app/jobs.py offers a URL entry point (`jobs.scan_url(url, headers, guard)`
returning the report JSON), else in a thread. A source error becomes problem+json:
403 SOURCE_URL_REFUSED for SSRF refusals, 400 for a malformed/non-http URL or a header that
is not plain ASCII credentials (SOURCE_BAD_REQUEST: checked here, before a worker sees it),
502 for an upstream that answers wrongly (SOURCE_HTTP, SOURCE_CHANGED, SOURCE_SHORT_READ).
Refusals and upstream failures are generic to the client (what a name resolves to, or
whether a port is open, is not the caller's to learn); the details go to the log.
A malicious file is not an error: 200 with verdict unsafe. In the service the report is
stored like an upload's (its own id, never reused from the cache) and streamed back.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ckptguard.app.compact import dumps, utf8
from ckptguard.app.deps import caller_key
from ckptguard.app.jobs import PoolFull
from ckptguard.app.pipeline import ScanService, queue_full
from ckptguard.app.problems import AppError
from ckptguard.app.responses import record_report
from ckptguard.app.routes.scans import ScanReport
from ckptguard.app.ssrf import guard_from_settings
from ckptguard.core.errors import Code, LimitExceeded, SourceError
from ckptguard.core.io.http import check_request
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.state import ScanOptions

log = logging.getLogger("ckptguard.remote")
router = APIRouter()

MAX_HEADERS = 32


class ScanUrlRequest(BaseModel):
    url: Annotated[str, Field(min_length=1, max_length=8192)]
    headers: Annotated[dict[str, Annotated[str, Field(max_length=8192)]] | None,
                       Field(max_length=MAX_HEADERS)] = None


def _guard(request: Request) -> UrlGuard:
    guard = getattr(request.app.state, "url_guard", None)
    if isinstance(guard, UrlGuard):
        return guard
    return guard_from_settings(getattr(request.app.state, "settings", None))


def _options(request: Request) -> ScanOptions:
    settings = getattr(request.app.state, "settings", None)
    return ScanOptions(allow=frozenset(getattr(settings, "allow_globals", ()) or ()))


def _problem_for(exc: SourceError) -> AppError:
    if exc.code is Code.SOURCE_BAD_REQUEST:
        return AppError(str(exc.code), 400, exc.message)   # about the caller's own input
    if exc.code is Code.SOURCE_URL_REFUSED:
        malformed = exc.message.startswith(("scheme", "malformed", "URL has no host", "port 0"))
        if malformed:
            return AppError(str(exc.code), 400, exc.message)
        log.info("url refused: %s", exc.message)
        return AppError(str(exc.code), 403, "the URL or a redirect target is not allowed by this "
                        "service's URL policy (public addresses only)")
    log.info("upstream failed: %s: %s", exc.code, exc.message)
    return AppError(str(exc.code), 502, "the upstream server could not be read as a checkpoint "
                    "(see the service log)")


def _scan_sync(url: str, headers: dict[str, str] | None, guard: UrlGuard,
               options: ScanOptions) -> dict[str, Any]:
    from ckptguard.core.loader import scan_url

    return scan_url(url, headers=headers, guard=guard, options=options).to_json()


@router.post("/scan/url", response_model=ScanReport,
             responses={202: {"description": "`?async=true`: queued; poll `GET /scan/url/jobs/{job_id}`"}})
async def scan_url(body: ScanUrlRequest, request: Request,
                   run_async: Annotated[bool, Query(alias="async")] = False) -> Response:
    guard = _guard(request)
    if run_async:
        return await _queue_scan(body, request, guard)
    scans = getattr(request.app.state, "scans", None)
    # a URL scan waits on someone else's server: capped apart from uploads (app/admission.py)
    slot = (scans.admission.slot("url", caller_key(request)) if isinstance(scans, ScanService)
            else contextlib.nullcontext())
    try:
        guard.check_url(body.url)
        headers = check_request(body.url, body.headers) or None
        jobs = getattr(request.app.state, "jobs", None)
        with slot:
            if jobs is not None and hasattr(jobs, "scan_url"):
                report: dict[str, Any] = await jobs.scan_url(body.url, headers, guard,
                                                             _options(request).allow, wait=False)
            else:
                report = await run_in_threadpool(_scan_sync, body.url, headers, guard,
                                                 _options(request))
    except SourceError as exc:
        raise _problem_for(exc) from exc
    except LimitExceeded as exc:  # the byte budget ran out before the scan could start
        raise AppError(str(exc.code), 413, exc.message) from exc
    except PoolFull as exc:
        if scans is not None:
            scans.metrics.rejected.inc()
        raise queue_full(str(exc)) from exc
    if not isinstance(scans, ScanService):   # the router alone (no store): answer, keep nothing
        return Response(await run_in_threadpool(lambda: utf8(dumps(report))),
                        media_type="application/json")
    answer = await scans.keep(report)
    return record_report(scans.store, answer.record, answer.report)


async def _queue_scan(body: ScanUrlRequest, request: Request, guard: UrlGuard) -> Response:
    """`?async=true`: checked like a synchronous scan (a refused URL is refused now), then
    queued for the job tier (app/urlscans.py) at interactive priority; 202 and the job's id."""
    db = getattr(request.app.state, "url_scans", None)
    queue = getattr(request.app.state, "queue", None)
    if db is None or queue is None:
        raise AppError("UNAVAILABLE", 503, "the job queue is not running")
    try:
        guard.check_url(body.url)
        headers = check_request(body.url, body.headers) or None
    except SourceError as exc:
        raise _problem_for(exc) from exc
    scan_id = await run_in_threadpool(db.create, body.url, headers)
    await queue.enqueue_url_scan(scan_id)
    return JSONResponse({"status": "queued", "job_id": scan_id, "poll": f"/scan/url/jobs/{scan_id}"},
                        status_code=202)


@router.get("/scan/url/jobs/{job_id}")
async def url_scan_job(job_id: Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$")],
                       request: Request) -> JSONResponse:
    """An asynchronous URL scan: queued, running, done (with its report's id) or failed."""
    from ckptguard.app.urlscans import document

    db = getattr(request.app.state, "url_scans", None)
    row = None if db is None else await run_in_threadpool(db.get, job_id)
    if row is None:
        raise AppError("URL_SCAN_NOT_FOUND", 404, "no asynchronous URL scan with this id")
    return JSONResponse(document(row))
