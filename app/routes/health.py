"""Liveness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Response

from ckptguard.app.deps import AuthDep, JobsDep, MetricsDep, StoreDep
from ckptguard.app.problems import AppError
from ckptguard.core import __version__
from ckptguard.core.report import POLICY

router = APIRouter(tags=["health"])
log = logging.getLogger("ckptguard.health")


@router.get("/healthz")
async def healthz(store: StoreDep, jobs: JobsDep) -> dict[str, Any]:
    """200 when the database answers; the body says which scanner answers too."""
    try:
        await asyncio.to_thread(store.ping)
    except Exception as exc:
        raise AppError("UNAVAILABLE", 503, "the database is not reachable") from exc
    return {"status": "ok", "scanner": {"version": __version__, "policy": POLICY},
            "workers": jobs.size, "queue_depth": jobs.queue_depth}


@router.get("/metrics", dependencies=[AuthDep])
async def metrics(m: MetricsDep) -> Response:
    from ckptguard.app.metrics import CONTENT_TYPE

    try:
        await m.refresh()
    except Exception:   # the database away: the process's own figures still answer
        log.exception("the job tier's figures could not be read")
    return Response(m.render(), media_type=CONTENT_TYPE)
