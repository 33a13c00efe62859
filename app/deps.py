"""FastAPI dependencies: the app's long-lived objects and the API-key check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ckptguard.app.admission import key_identity
from ckptguard.app.jobs import Jobs
from ckptguard.app.metrics import Metrics
from ckptguard.app.pipeline import ScanService
from ckptguard.app.problems import AppError
from ckptguard.app.settings import Settings
from ckptguard.app.store import Store


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _jobs(request: Request) -> Jobs:
    jobs: Jobs = request.app.state.jobs
    return jobs


def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[Store, Depends(_store)]
JobsDep = Annotated[Jobs, Depends(_jobs)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]


# Declares the scheme in the OpenAPI document (every route that checks the key shows it);
# the check itself reads the header below, so a missing key is our own 401 problem document.
_BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                     description="one of CKPTGUARD_API_KEYS (when keys are configured)")


def _bearer(request: Request) -> tuple[str, str]:
    """(scheme, token) of the Authorization header; empty strings when it is absent."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme, token.strip()


def require_api_key(request: Request,
                    declared: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)] = None,
                    ) -> None:
    """`Authorization: Bearer <key>` when CKPTGUARD_API_KEYS is set; constant-time compare."""
    keys: list[str] = request.app.state.settings.api_keys
    if not keys:
        return
    scheme, token = _bearer(request)
    presented = token.encode()
    # Compare against every key (no early exit) so timing does not tell which matched.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(presented, key.encode())
    if scheme.lower() != "bearer" or not ok:
        raise AppError("UNAUTHORIZED", 401, "a valid API key is required (Authorization: Bearer)",
                       headers={"WWW-Authenticate": "Bearer"})


AuthDep = Depends(require_api_key)


def caller_key(request: Request) -> str | None:
    """The identity of the caller's API key (for per-key caps), None when keys are off.
    Call after `require_api_key` accepted the request."""
    if not request.app.state.settings.api_keys:
        return None
    return key_identity(_bearer(request)[1])


def _scans(request: Request) -> ScanService:
    scans: ScanService = request.app.state.scans
    return scans


ScanServiceDep = Annotated[ScanService, Depends(_scans)]
