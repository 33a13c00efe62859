"""The OpenAPI document (/openapi.json, shown at /docs): the real report schema, every error
answer (application/problem+json with its stable codes) and the bearer security scheme.

Strategy: FastAPI describes the routes and their parameters; this module adds what it
cannot see, because the routes answer with JSONResponse (reports are JSON already): the
report's schema and the problem documents of each route (ERRORS, from the README's error
table). The bearer scheme comes from `require_api_key`'s declared security dependency.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ckptguard.app.problems import PROBLEM_JSON

_STR = {"type": "string"}
_NSTR = {"type": ["string", "null"]}
_INT = {"type": "integer"}
_NINT = {"type": ["integer", "null"]}


def _obj(required: bool = True, **props: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(props)
    return out


def _with_optional(schema: dict[str, Any], **props: Any) -> dict[str, Any]:
    """`schema` with more properties that are not required."""
    return {**schema, "properties": {**schema["properties"], **props}}


SEVERITY = {"type": "string", "enum": ["critical", "high", "medium", "low", "info"]}
VERDICT = {"type": "string", "enum": ["safe", "suspicious", "unsafe", "invalid"]}
FORMAT = {"type": "string", "enum": ["torch-zip", "torch-legacy", "torch-tar", "torchscript",
                                     "torch-export", "pickle", "numpy", "numpy-zip",
                                     "safetensors", "unknown"]}

SCHEMAS: dict[str, Any] = {
    "Finding": _obj(code=_STR, severity=SEVERITY, message=_STR, record=_NSTR, offset=_NINT,
                    length={**_NINT, "description": "bytes the finding covers from offset"}),
    "Global": _obj(module=_STR, name=_STR,
                   status={"type": "string", "enum": ["allowed", "benign", "unknown", "dangerous"]},
                   count=_INT, record=_NSTR, offset=_NINT, reason=_NSTR),
    "Tensor": _obj(name=_STR, path={"type": "array", "items": {"type": ["string", "integer"]}},
                   dtype=_STR, shape={"type": "array", "items": _INT},
                   stride={"type": "array", "items": _INT}, storage_offset=_INT, storage=_NSTR,
                   kind=_STR, requires_grad={"type": "boolean"},
                   data_offset={**_NINT, "description": "absolute file offset of the first element"},
                   nbytes=_INT, record=_NSTR, flags={"type": "array", "items": _STR}),
    "Storage": _obj(key=_STR, dtype=_STR, numel=_INT, nbytes=_INT, location=_STR, record=_NSTR,
                    data_offset=_NINT, offset_verified={"type": "boolean"}),
    "Region": _obj(kind={"type": "string", "description": (
        "pickle, tensor_data, metadata, record, records (a merged run), header, local_header, "
        "data_descriptor, central_directory, end_records; anomalies: prepended, appended, "
        "unreferenced_data, overlap, unreferenced_record, trailing_data")},
        name=_STR, offset=_INT, length=_INT),
    "WeightsOnly": _with_optional(
        _obj(loadable={"type": "boolean"}, error=_NSTR, error_type=_NSTR,
             unsafe_globals={"type": "array", "items": _STR}, safe_globals_hint=_NSTR),
        # added after schema v1's first reports: a stored report from before lacks it
        policy_accepts={"type": "boolean", "description": (
            "would torch's restricted unpickler accept every pickle inside (`loadable` is "
            "torch.load's literal answer on this very file)")}),
    "Report": {
        **_obj(
            schema_version={"type": "integer", "const": 1},
            scanner=_obj(name=_STR, version=_STR, policy=_STR),
            source=_obj(kind={"type": "string", "enum": ["upload", "url", "file", "hub", "bytes"]},
                        name=_NSTR, url=_NSTR, size=_NINT, sha256=_NSTR),
            format=FORMAT, verdict=VERDICT,
            weights_only={"$ref": "#/components/schemas/WeightsOnly"},
            globals={"type": "array", "items": {"$ref": "#/components/schemas/Global"}},
            findings={"type": "array", "items": {"$ref": "#/components/schemas/Finding"}},
            tensors={"type": "array", "items": {"$ref": "#/components/schemas/Tensor"}},
            storages={"type": "array", "items": {"$ref": "#/components/schemas/Storage"}},
            io={"type": "object", "additionalProperties": _INT},
            timings_ms={"type": "object", "additionalProperties": {"type": "number"}},
            regions={"type": "array", "items": {"$ref": "#/components/schemas/Region"}},
            regions_omitted=_INT),
        "description": "The report, schema_version 1: fields may be added, never renamed (README).",
    },
    # replaces the loose model app/routes/scans.py declares under this name: one schema of the
    # stored report (without its manifest, ?manifest=false: counts and links instead)
    "ScanReport": {"allOf": [{"$ref": "#/components/schemas/Report"},
                             _obj(id=_STR, created_at=_STR, cached={"type": "boolean"}),
                             _obj(False, tensor_count=_INT, storage_count=_INT,
                                  links=_obj(report=_STR, tensors=_STR))],
                   "description": "A stored report: the schema-v1 report and the record's id, "
                   "time and cached flag. With ?manifest=false, `tensors` and `storages` are "
                   "left out and `tensor_count`, `storage_count` and `links` given instead."},
    "Problem": {
        **_obj(False, type=_STR, title=_STR, status=_INT,
               code={"type": "string", "description": "stable machine-readable code"},
               detail=_STR),
        "required": ["status", "code", "detail"],
        "description": "RFC 9457 problem document (application/problem+json); never a stack trace",
    },
}

# status -> codes, per operation (README "Errors"); 500 INTERNAL_ERROR is added everywhere.
_UPLOAD = {400: ["BAD_MULTIPART", "BAD_REQUEST"], 408: ["UPLOAD_TOO_SLOW"],
           413: ["PAYLOAD_TOO_LARGE"], 415: ["UNSUPPORTED_MEDIA_TYPE"],
           422: ["MISSING_FILE", "VALIDATION_ERROR", "SOURCE_*"],
           503: ["SCAN_QUEUE_FULL", "UPLOADS_BUSY", "KEY_BUSY"]}
ERRORS: dict[tuple[str, str], dict[int, list[str]]] = {
    ("post", "/scan"): _UPLOAD,
    ("post", "/scan/url"): {400: ["SOURCE_URL_REFUSED", "SOURCE_BAD_REQUEST", "BAD_REQUEST"],
                            403: ["SOURCE_URL_REFUSED"], 413: ["PAYLOAD_TOO_LARGE", "LIMIT_*"],
                            422: ["VALIDATION_ERROR"],
                            502: ["SOURCE_HTTP", "SOURCE_CHANGED", "SOURCE_SHORT_READ"],
                            503: ["SCAN_QUEUE_FULL", "URL_SCANS_BUSY", "KEY_BUSY", "UNAVAILABLE"]},
    ("get", "/scan/url/jobs/{job_id}"): {404: ["URL_SCAN_NOT_FOUND"], 422: ["VALIDATION_ERROR"]},
    ("get", "/scans/{scan_id}"): {404: ["SCAN_NOT_FOUND"], 422: ["VALIDATION_ERROR"]},
    ("delete", "/scans/{scan_id}"): {404: ["SCAN_NOT_FOUND"]},
    ("get", "/scans/{scan_id}/tensors"): {400: ["BAD_CURSOR"], 404: ["SCAN_NOT_FOUND"],
                                          422: ["VALIDATION_ERROR"]},
    ("get", "/scans"): {400: ["BAD_CURSOR"], 422: ["VALIDATION_ERROR"]},
    ("get", "/healthz"): {503: ["UNAVAILABLE"]},
    ("post", "/webhooks/huggingface"): {400: ["BAD_WEBHOOK"], 401: ["UNAUTHORIZED"],
                                        403: ["FORBIDDEN"], 413: ["PAYLOAD_TOO_LARGE"],
                                        503: ["WEBHOOK_DISABLED", "UNAVAILABLE"]},
    ("get", "/hub/revisions"): {400: ["BAD_CURSOR"], 422: ["VALIDATION_ERROR"],
                                503: ["UNAVAILABLE"]},
    ("get", "/hub/{repo_type}/{repo}/revisions/{sha}"): {
        404: ["REVISION_NOT_FOUND", "BAD_REPO", "BAD_REPO_TYPE"], 503: ["UNAVAILABLE"]},
    ("post", "/hub/{repo_type}/{repo}/revisions/{sha}/rescan"): {
        404: ["REVISION_NOT_FOUND", "BAD_REPO", "BAD_REPO_TYPE"], 409: ["REVISION_BUSY"],
        503: ["UNAVAILABLE"]},
    ("post", "/hub/{repo_type}/{repo}/revisions/{sha}/cancel"): {
        404: ["REVISION_NOT_FOUND", "BAD_REPO", "BAD_REPO_TYPE"], 409: ["REVISION_BUSY"],
        503: ["UNAVAILABLE"]},
    ("post", "/hub/{repo_type}/{repo}/reconcile"): {
        404: ["BAD_REPO", "BAD_REPO_TYPE"], 422: ["VALIDATION_ERROR"], 502: ["SOURCE_*"],
        503: ["UNAVAILABLE"]},
}
# the 200 body of the routes that answer with a report
REPORT_ROUTES = {("post", "/scan"), ("post", "/scan/url"), ("get", "/scans/{scan_id}")}


def _problem(codes: list[str]) -> dict[str, Any]:
    return {"description": "codes: " + ", ".join(codes),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def build(app: FastAPI) -> dict[str, Any]:
    """The document: FastAPI's, plus schemas, problem answers and the security scheme."""
    doc = get_openapi(title=app.title, version=app.version, summary=app.summary,
                      routes=app.routes, description=(
                          "Every error is application/problem+json with a stable `code`. "
                          "When API keys are configured, send `Authorization: Bearer <key>`."))
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {}).update(SCHEMAS)
    for path, operations in doc.get("paths", {}).items():
        key_path = path.replace("{repo:path}", "{repo}")
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            errors = {status: list(codes) for status, codes in ERRORS.get((method, key_path), {}).items()}
            if "422" in responses:   # FastAPI's own validation answer: ours is a problem too
                errors.setdefault(422, ["VALIDATION_ERROR"])
            if op.get("security"):   # the routes that depend on require_api_key
                errors.setdefault(401, []).insert(0, "UNAUTHORIZED")
            # any request whose head is too slow; a JSON body too slow (app/main.py)
            errors.setdefault(408, []).append("HEAD_TIMEOUT")
            if method == "post" and key_path != "/scan":
                errors[408].append("REQUEST_TIMEOUT")
            errors.setdefault(500, []).append("INTERNAL_ERROR")
            for status, codes in sorted(errors.items()):
                responses[str(status)] = _problem(codes)
            if (method, key_path) in REPORT_ROUTES:
                responses["200"] = {"description": "the report (a malicious file is a 200 with "
                                    "verdict unsafe)", "content": {"application/json": {
                                        "schema": {"$ref": "#/components/schemas/ScanReport"}}}}
    for name in ("HTTPValidationError", "ValidationError"):   # replaced by Problem above
        components["schemas"].pop(name, None)
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve `build(app)` (computed once) at /openapi.json."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
