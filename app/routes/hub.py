"""Hub routes: POST /webhooks/huggingface, revision summaries, reconcile.

The webhook authenticates with the hub's secret (app/hub/webhook.py); the other routes with
the service's API keys like every other route. Work is queued, never done here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from ckptguard.app.deps import AuthDep
from ckptguard.app.hub.jobs import HubRunner
from ckptguard.app.hub.webhook import (
    Target,
    accept,
    check_secret,
    parse_event,
    repo_type_of,
    revision_item,
    summary,
    valid_repo,
)
from ckptguard.app.jobqueue import PRIORITY_PUSH, PRIORITY_RESCAN, JobQueue
from ckptguard.app.problems import AppError
from ckptguard.core.errors import SourceError

router = APIRouter(tags=["hub"])


def _runner(request: Request) -> HubRunner:
    runner = getattr(request.app.state, "hub", None)
    if not isinstance(runner, HubRunner):
        raise AppError("UNAVAILABLE", 503, "the hub job runner is not running")
    return runner


def _queue(request: Request) -> JobQueue:
    queue = getattr(request.app.state, "queue", None)
    if queue is None:
        raise AppError("UNAVAILABLE", 503, "the job queue is not running")
    return cast(JobQueue, queue)


async def _queue_new(request: Request, accepted: list[dict[str, Any]]) -> None:
    for item in accepted:
        if item["new_job"]:
            await _queue(request).enqueue_revision(item["job_id"], priority=PRIORITY_PUSH)


@router.post("/webhooks/huggingface", status_code=202)
async def webhook(request: Request, secret: Annotated[str | None, Query(max_length=512)] = None,
                  ) -> JSONResponse:
    count = _delivery_counter(request)
    try:
        check_secret(request.app.state.settings.webhook_secret,
                     request.headers.get("x-webhook-secret") or secret)
    except AppError:
        count("refused")
        raise
    try:
        payload = json.loads(await request.body())
    except ValueError as exc:
        count("bad")
        raise AppError("BAD_WEBHOOK", 400, "the body is not JSON") from exc
    targets, ignored = parse_event(payload)
    if ignored is not None:
        count("ignored")
        return JSONResponse({"status": "ignored", "reason": ignored}, status_code=200)
    runner = _runner(request)
    accepted = await asyncio.to_thread(accept, runner.db, targets)
    await _queue_new(request, accepted)
    count("queued" if any(item["new_job"] for item in accepted) else "duplicate")
    return JSONResponse({"status": "queued", "revisions": accepted}, status_code=202)


def _delivery_counter(request: Request) -> Any:
    """`count(outcome)` on ckptguard_hub_webhooks_total (a no-op without the service's metrics)."""
    scans = getattr(request.app.state, "scans", None)
    metrics = getattr(scans, "metrics", None)
    return (lambda outcome: metrics.hub_webhooks.labels(outcome=outcome).inc()) if metrics \
        else (lambda outcome: None)


async def _job(runner: HubRunner, repo_type: str, repo: str, sha: str) -> Any:
    """The scan job of this revision; 404 when the hub never queued it."""
    job = await asyncio.to_thread(runner.db.find_job, repo_type_of(repo_type), _repo(repo), sha.lower())
    if job is None:
        raise AppError("REVISION_NOT_FOUND", 404, "no scan job for this revision")
    return job


def _repo(path: str) -> str:
    repo = valid_repo(path)   # `namespace/name`, or a legacy bare name such as `gpt2`
    if repo is None:
        raise AppError("BAD_REPO", 404, "not a valid repository name")
    return repo


MAX_REVISION_PAGE = 100
FILES_PER_REVISION = 200   # per revision in the list; the revision's own document has them all


@router.get("/hub/revisions", dependencies=[AuthDep])
async def revisions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=MAX_REVISION_PAGE)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    state: Literal["queued", "running", "done", "failed", "cancelled"] | None = None,
) -> JSONResponse:
    """Revisions the hub's webhook queued, newest first, each with its files' states
    (the first 200 files by path, and `file_states`: how many files are in each state)."""
    runner = _runner(request)
    try:
        jobs, next_cursor = await asyncio.to_thread(runner.db.list_jobs, limit=limit,
                                                    cursor=cursor, state=state)
    except ValueError as exc:
        raise AppError("BAD_CURSOR", 400, "the cursor is not one this service issued") from exc
    items = []
    for job in jobs:
        files, states = await asyncio.to_thread(runner.db.file_page, job.id, FILES_PER_REVISION)
        items.append(revision_item(job, files, states))
    return JSONResponse({"items": items, "next_cursor": next_cursor})


@router.get("/hub/{repo_type}/{repo:path}/revisions/{sha}", dependencies=[AuthDep])
async def revision(repo_type: str, repo: str, sha: str, request: Request) -> JSONResponse:
    runner = _runner(request)
    job = await _job(runner, repo_type, repo, sha)
    doc = await asyncio.to_thread(summary, runner.db, job.id)
    if doc is None:
        raise AppError("REVISION_NOT_FOUND", 404, "no scan job for this revision")
    return JSONResponse(doc)


@router.post("/hub/{repo_type}/{repo:path}/revisions/{sha}/rescan", status_code=202,
             dependencies=[AuthDep])
async def rescan(repo_type: str, repo: str, sha: str, request: Request) -> JSONResponse:
    """Judge a finished revision again (after a scanner upgrade or an allowlist change)."""
    runner = _runner(request)
    job = await _job(runner, repo_type, repo, sha)
    if not await asyncio.to_thread(runner.db.reset, job.id):
        raise AppError("REVISION_BUSY", 409, f"the revision is {job.state}: it is being scanned")
    await _queue(request).enqueue_revision(job.id, priority=PRIORITY_RESCAN)
    return JSONResponse({"status": "queued", "job_id": job.id}, status_code=202)


@router.post("/hub/{repo_type}/{repo:path}/revisions/{sha}/cancel", dependencies=[AuthDep])
async def cancel(repo_type: str, repo: str, sha: str, request: Request) -> JSONResponse:
    """Call off a revision (a rescan, a backfill) that no worker has started: it ends
    `cancelled` (a rescan may queue it again). 409 once it runs or has finished."""
    runner = _runner(request)
    job = await _job(runner, repo_type, repo, sha)
    if not await asyncio.to_thread(runner.db.cancel, job.id):
        raise AppError("REVISION_BUSY", 409, f"the revision is {job.state}: only a queued one can be "
                       "cancelled")
    await _queue(request).cancel_revision(job.id)
    return JSONResponse({"status": "cancelled", "job_id": job.id})


@router.post("/hub/{repo_type}/{repo:path}/reconcile", status_code=202, dependencies=[AuthDep])
async def reconcile(repo_type: str, repo: str, request: Request,
                    revision: Annotated[str, Query(min_length=1, max_length=240,
                                                   pattern=r"^[A-Za-z0-9._/-]+$")] = "main",
                    ) -> JSONResponse:
    """Ask the hub where `revision` (a branch, tag or PR ref) points now and queue that commit.

    For lost webhook deliveries: safe to call at any time, a scanned commit is not rescanned.
    """
    runner = _runner(request)
    kind, repo = repo_type_of(repo_type), _repo(repo)
    try:
        sha = await asyncio.to_thread(runner.client.head_sha, kind, repo, revision)
    except SourceError as exc:
        raise AppError(str(exc.code), 502, exc.message) from exc
    ref = revision if revision.startswith("refs/") else f"refs/heads/{revision}"
    accepted = await asyncio.to_thread(accept, runner.db, [Target(kind, repo, ref, sha)])
    await _queue_new(request, accepted)
    return JSONResponse({"status": "queued", "revisions": accepted}, status_code=202)

