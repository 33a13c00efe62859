"""Client errors as RFC 9457 `application/problem+json` with a stable `code`.

Strategy: routes raise `AppError(code, status, detail)`; the handlers installed by
`install(app)` turn it, FastAPI's validation errors, unknown routes and any unexpected
exception into a problem document. No stack trace ever reaches a client: the 500
handler logs the exception and answers with a fixed text.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("ckptguard.app")

PROBLEM_JSON = "application/problem+json"

# Stable codes of the service layer (finding codes live in core/errors.py).
_STATUS_CODES = {
    400: "BAD_REQUEST", 401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED", 411: "LENGTH_REQUIRED", 413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE", 422: "VALIDATION_ERROR", 429: "TOO_MANY_REQUESTS",
    500: "INTERNAL_ERROR", 503: "UNAVAILABLE",
}


class AppError(Exception):
    """An error the client should see: `code` is stable, `detail` is for humans."""

    def __init__(self, code: str, status: int, detail: str = "", *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(code, status, detail)
        self.code = code
        self.status = status
        self.detail = detail
        self.headers = headers
        self.extra = extra


def problem_body(code: str, status: int, detail: str, **extra: Any) -> dict[str, Any]:
    """The problem+json object (RFC 9457) every error response carries."""
    return {"type": "about:blank", "title": code.replace("_", " ").capitalize(),
            "status": status, "code": code, "detail": detail, **extra}


def problem(code: str, status: int, detail: str, *, headers: dict[str, str] | None = None,
            **extra: Any) -> JSONResponse:
    return JSONResponse(problem_body(code, status, detail, **extra), status_code=status,
                        media_type=PROBLEM_JSON, headers=headers)


async def _app_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AppError)
    return problem(exc.code, exc.status, exc.detail, headers=exc.headers, **exc.extra)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
    detail = exc.detail if isinstance(exc.detail, str) else code
    return problem(code, exc.status_code, detail, headers=getattr(exc, "headers", None))


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only locations and messages: the raw input is not echoed back.
    errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
              for e in exc.errors()]
    return problem("VALIDATION_ERROR", 422, "the request is invalid", errors=errors)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem("INTERNAL_ERROR", 500, "internal error; see the service log")


def install(app: FastAPI) -> None:
    """Register the problem+json handlers on `app`."""
    app.add_exception_handler(AppError, _app_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
