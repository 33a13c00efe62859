"""Stored reports: GET /scans/{id}, GET /scans?sha256=&verdict=&limit=&cursor=."""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from ckptguard.app.deps import AuthDep, StoreDep
from ckptguard.app.problems import AppError
from ckptguard.app.store import MAX_PAGE

router = APIRouter(tags=["scans"], dependencies=[AuthDep])

_ID = re.compile(r"[0-9a-f]{32}")


@router.get("/scans/{scan_id}")
async def get_scan(scan_id: str, store: StoreDep) -> JSONResponse:
    stored = await asyncio.to_thread(store.get, scan_id) if _ID.fullmatch(scan_id) else None
    if stored is None:
        raise AppError("SCAN_NOT_FOUND", 404, "no scan with this id")
    return JSONResponse(stored.to_json())


@router.get("/scans")
async def list_scans(
    store: StoreDep,
    sha256: Annotated[str | None, Query(pattern=r"^[0-9a-fA-F]{64}$")] = None,
    verdict: Literal["safe", "suspicious", "unsafe", "invalid"] | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> JSONResponse:
    """Newest first. Pass `next_cursor` back as `cursor` for the next page."""
    try:
        page = await asyncio.to_thread(store.list, sha256=sha256.lower() if sha256 else None,
                                       verdict=verdict, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise AppError("BAD_CURSOR", 400, "the cursor is not one this service issued") from exc
    return JSONResponse({"items": [s.to_json() for s in page.items], "next_cursor": page.next_cursor})
