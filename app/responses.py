"""Reports as HTTP responses: JSON encoded a chunk at a time in a worker thread.

Strategy: `StreamingResponse` over a *sync* iterator runs each `next()` in a thread
(starlette's iterate_in_threadpool), so no report is ever encoded, compressed or read on
the event loop, and uvicorn's write flow control paces the iterator to the client: memory
follows one piece (app/compact.py), never the report. The bytes equal those of
`JSONResponse({"id", "created_at", "cached", **report})`, what clients got before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.responses import StreamingResponse

from ckptguard.app import compact
from ckptguard.app.store import Record, Store, Stored

JSON = "application/json"


def fresh_report(record: Record, report: dict[str, Any]) -> StreamingResponse:
    """A report this request just made (still in memory), under its new record."""
    def pieces() -> Iterator[bytes]:
        yield from compact.stream(record.fields(), report,
                                  lambda part: compact.rows_in_pieces(report[part]))

    return StreamingResponse(pieces(), media_type=JSON)


def stored_report(store: Store, stored: Stored, *, manifest: bool = True) -> StreamingResponse:
    """A stored report; without its manifest (`manifest=False`) it carries the manifest's
    counts and where to page it instead."""
    return StreamingResponse(_stored_pieces(store, stored, manifest=manifest), media_type=JSON)


def record_report(store: Store, record: Record, report: dict[str, Any] | None) -> StreamingResponse:
    """A scan request's answer: from memory when it made the report, else from the store."""
    if report is not None:
        return fresh_report(record, report)

    def pieces() -> Iterator[bytes]:
        stored = store.get(record.id)           # in the response's thread, like the rest
        if stored is None:
            raise LookupError(f"scan {record.id} was deleted before it was answered")
        yield from _stored_pieces(store, stored, manifest=True)

    return StreamingResponse(pieces(), media_type=JSON)


def _stored_pieces(store: Store, stored: Stored, *, manifest: bool) -> Iterator[bytes]:
    record = stored.record
    head = stored.report_head()
    if not manifest:
        head = {k: v for k, v in head.items() if k not in compact.MANIFEST}
        head.update(tensor_count=stored.tensor_count, storage_count=stored.storage_count,
                    links={"report": f"/scans/{record.id}", "tensors": f"/scans/{record.id}/tensors"})
    counts = {"tensors": stored.tensor_count, "storages": stored.storage_count}
    yield from compact.stream(record.fields(), head,
                              lambda part: store.part_rows(record.analysis_id, part, counts[part]))
