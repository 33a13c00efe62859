"""Stored scans: GET /scans (summaries), GET /scans/{id} (the report, streamed),
GET /scans/{id}/tensors (the manifest, paged), DELETE /scans/{id}.

Every database read and every encoding runs in a thread (app/responses.py, asyncio.to_thread):
a 500,000-tensor report never holds the event loop. Responses are built by hand (not by
FastAPI's encoder); the models below describe them for the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from ckptguard.app import compact
from ckptguard.app.deps import AuthDep, StoreDep
from ckptguard.app.problems import AppError
from ckptguard.app.responses import JSON, stored_report
from ckptguard.app.store import MAX_PAGE, MAX_TENSOR_PAGE, TENSOR_SORTS, Store, Stored

router = APIRouter(tags=["scans"], dependencies=[AuthDep])

_ID = re.compile(r"[0-9a-f]{32}")
Verdict = Literal["safe", "suspicious", "unsafe", "invalid"]
TensorSort = Literal["index", "nbytes", "-nbytes", "data_offset", "-data_offset"]
assert set(TensorSort.__args__) == set(TENSOR_SORTS)   # type: ignore[attr-defined]


# --- response schemas (OpenAPI; the routes answer with these shapes) ---------------------
class FindingBrief(BaseModel):
    code: str
    severity: str
    message: str


class Counts(BaseModel):
    findings: dict[str, int]          # severity -> number of findings
    tensors: int
    storages: int
    globals: int


class ScanSummary(BaseModel):
    id: str
    created_at: str
    cached: bool
    source: dict[str, Any]
    format: str
    verdict: str
    scanner: dict[str, Any]
    counts: Counts
    findings: list[FindingBrief]      # the most severe, at most 5


class ScanList(BaseModel):
    items: list[ScanSummary]
    next_cursor: str | None


class ScanReport(BaseModel):
    """The schema-v1 report (README "Report") after the service's own fields. Without its
    manifest (`?manifest=false`): no `tensors`/`storages`, but `tensor_count`,
    `storage_count` and `links`."""

    model_config = ConfigDict(extra="allow")
    id: str
    created_at: str
    cached: bool
    schema_version: int
    verdict: str
    tensors: list[dict[str, Any]] | None = None
    storages: list[dict[str, Any]] | None = None
    tensor_count: int | None = None
    storage_count: int | None = None
    links: dict[str, str] | None = None


class TensorRow(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int                        # place in the manifest
    name: str
    path: list[str | int]
    dtype: str
    shape: list[int]
    stride: list[int]
    storage_offset: int
    storage: str | None
    kind: str
    requires_grad: bool
    data_offset: int | None
    nbytes: int
    record: str | None = None
    flags: list[str] = []


class DtypeTotal(BaseModel):
    dtype: str
    count: int
    nbytes: int


class TensorPage(BaseModel):
    items: list[TensorRow]
    next_cursor: str | None
    total: int                        # tensors matching the filter
    dtypes: list[DtypeTotal]          # over the whole manifest


_PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "SCAN_NOT_FOUND", **_PROBLEM}}
BAD_CURSOR: dict[int | str, dict[str, Any]] = {400: {"description": "BAD_CURSOR", **_PROBLEM}}


def _bad_cursor(exc: ValueError) -> AppError:
    return AppError("BAD_CURSOR", 400, "the cursor is not one this service issued")


async def _stored(store: Store, scan_id: str) -> Stored:
    stored = await asyncio.to_thread(store.get, scan_id) if _ID.fullmatch(scan_id) else None
    if stored is None:
        raise AppError("SCAN_NOT_FOUND", 404, "no scan with this id")
    return stored


@router.get("/scans/{scan_id}", response_model=ScanReport, responses=NOT_FOUND)
async def get_scan(scan_id: str, store: StoreDep, manifest: bool = True) -> StreamingResponse:
    """The report, streamed. `manifest=false`: without `tensors` and `storages` (page them
    with GET /scans/{id}/tensors)."""
    return stored_report(store, await _stored(store, scan_id), manifest=manifest)


@router.get("/scans/{scan_id}/tensors", response_model=TensorPage, responses={**NOT_FOUND, **BAD_CURSOR})
async def get_tensors(
    scan_id: str,
    store: StoreDep,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_TENSOR_PAGE)] = 100,
    name: Annotated[str | None, Query(max_length=1024,
                                      description="substring of the name, any case")] = None,
    dtype: Annotated[str | None, Query(max_length=32, description="exact dtype")] = None,
    sort: TensorSort = "index",
) -> Response:
    """A page of the manifest's tensors. `sort`: manifest order (`index`), or by `nbytes` /
    `data_offset`, ties by index; `-x` is `x` reversed. A tensor without a data offset sorts
    as -1. Pass `next_cursor` back as `cursor` (with the same sort) for the next page."""
    stored = await _stored(store, scan_id)

    def body() -> bytes:
        page = store.tensors(stored, limit=limit, cursor=cursor, name=name or None, dtype=dtype,
                             sort=sort)
        return compact.utf8(compact.dumps({"items": page.items, "next_cursor": page.next_cursor,
                                           "total": page.total, "dtypes": stored.dtypes}))

    try:
        return Response(await asyncio.to_thread(body), media_type=JSON)
    except ValueError as exc:
        raise _bad_cursor(exc) from exc


@router.delete("/scans/{scan_id}", status_code=204, response_class=Response, responses=NOT_FOUND)
async def delete_scan(scan_id: str, store: StoreDep) -> Response:
    """Delete a scan; its analysis goes too when no other scan references it."""
    if not _ID.fullmatch(scan_id) or not await asyncio.to_thread(store.delete, scan_id):
        raise AppError("SCAN_NOT_FOUND", 404, "no scan with this id")
    return Response(status_code=204)


@router.get("/scans", response_model=ScanList, responses=BAD_CURSOR)
async def list_scans(
    store: StoreDep,
    sha256: Annotated[str | None, Query(pattern=r"^[0-9a-fA-F]{64}$")] = None,
    verdict: Verdict | None = None,
    format: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """Summaries, newest first (never a manifest). Pass `next_cursor` back as `cursor`."""
    def body() -> bytes:
        page = store.list(sha256=sha256.lower() if sha256 else None, verdict=verdict, fmt=format,
                          limit=limit, cursor=cursor)
        return compact.utf8(compact.dumps({"items": page.items, "next_cursor": page.next_cursor}))

    try:
        return Response(await asyncio.to_thread(body), media_type=JSON)
    except ValueError as exc:
        raise _bad_cursor(exc) from exc
