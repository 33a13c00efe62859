"""POST /scan: a multipart upload (field `file`) -> the report."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from ckptguard.app.deps import AuthDep, ScanServiceDep, SettingsDep, caller_key
from ckptguard.app.responses import record_report
from ckptguard.app.routes.scans import ScanReport
from ckptguard.app.uploads import paced, receive_upload

log = logging.getLogger("ckptguard.scan")
router = APIRouter(tags=["scan"], dependencies=[AuthDep])

TEST_HOOK_HEADER = "x-ckptguard-test-hook"


@router.post("/scan", response_model=ScanReport, openapi_extra={"requestBody": {"content": {
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                       "properties": {"file": {"type": "string", "format": "binary"}}}}}}})
async def scan_upload(request: Request, settings: SettingsDep, scans: ScanServiceDep) -> Response:
    """Scan an uploaded checkpoint. A malicious file is a 200 with `verdict: unsafe`.

    503 (`SCAN_QUEUE_FULL`, with Retry-After) when max_queued_scans are already waiting."""
    scans.refuse_if_full()   # before a byte of the body is read
    with scans.admission.slot("upload", caller_key(request)):
        try:
            upload = await receive_upload(
                request.headers.get("content-type"), request.headers.get("content-length"),
                paced(request.stream(), min_rate=settings.upload_min_rate,
                      grace_s=settings.upload_grace_seconds),
                upload_dir=settings.resolved_upload_dir, max_bytes=settings.max_upload_bytes)
        except ClientDisconnect:
            # an ordinary event, not an error: one line, no traceback (the spool file is gone)
            log.info("client disconnected during the upload", extra={"event": "disconnect"})
            return Response(status_code=400)   # nobody is left to read it
    scans.metrics.upload_bytes.inc(upload.size)
    hook = request.headers.get(TEST_HOOK_HEADER) if settings.test_hooks else None
    try:
        info = {"kind": "upload", "name": upload.filename, "size": upload.size,
                "sha256": upload.sha256}
        answer = await scans.scan_file(str(upload.path), info, hook=hook, wait=False)
        return record_report(scans.store, answer.record, answer.report)   # encoded in a thread
    finally:
        upload.discard()
