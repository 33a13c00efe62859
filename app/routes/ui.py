"""The reviewers' web page (/ui/) and the offline API docs (/docs).

Strategy: the page is a public shell (app/ui/: one HTML file, ES modules, one stylesheet, no
build step, nothing fetched from another origin) that holds no data: every report, tensor
and revision is fetched from the API with the caller's key. Everything on the page comes
from the attacker's file, so the shell's responses carry a strict Content-Security-Policy:
scripts and styles only from files of this origin, no inline code, no frames, no plugins.
"""

from __future__ import annotations

import mimetypes
from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import RedirectResponse, Response

from ckptguard.app.problems import AppError

router = APIRouter(include_in_schema=False)

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
ASSET_NAME = r"^[a-z][a-z0-9_-]*\.(js|css|svg)$"

# script-src/style-src 'self': no inline code, so a name that escaped text rendering could
# still not run; connect-src 'self': the page talks to this origin only.
UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
          "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
          "form-action 'self'; frame-ancestors 'none'")
# Swagger UI sets style attributes from its scripts: the one relaxation, on /docs only.
DOCS_CSP = UI_CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")


def _headers(csp: str, *, cache: str = "no-cache") -> dict[str, str]:
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
            "Cross-Origin-Opener-Policy": "same-origin", "Cache-Control": cache}


def _file(path: Path, csp: str) -> Response:
    media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if path.suffix == ".js":
        media = "text/javascript"
    return Response(path.read_bytes(), media_type=media, headers=_headers(csp))


def _shell() -> Response:
    return _file(UI_DIR / "index.html", UI_CSP)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui")
async def ui_bare() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/assets/{name}")
async def ui_asset(name: Annotated[str, PathParam(pattern=ASSET_NAME)]) -> Response:
    path = UI_DIR / name
    if not path.is_file():
        raise AppError("NOT_FOUND", 404, "no such asset")
    return _file(path, UI_CSP)


# The page's own routes (client-side views; shareable links): all the same shell.
@router.get("/ui/")
@router.get("/ui/history")
@router.get("/ui/hub")
async def ui_page() -> Response:
    return _shell()


@router.get("/ui/scans/{scan_id}")
@router.get("/ui/scans/{scan_id}/tensors")
async def ui_scan(scan_id: Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$")]) -> Response:
    return _shell()


def _swagger_dir() -> Path:
    # Swagger UI's dist files as the fastapi-offline package ships them (MIT; no CDN)
    return Path(str(resources.files("fastapi_offline") / "static"))


SWAGGER_FILES = frozenset({"swagger-ui.css", "swagger-ui-bundle.js", "favicon.png"})


@router.get("/docs")
async def docs() -> Response:
    return _file(UI_DIR / "docs.html", DOCS_CSP)


@router.get("/docs/assets/{name}")
async def docs_asset(name: str) -> Response:
    if name == "docs.js":
        return _file(UI_DIR / "docs.js", DOCS_CSP)
    if name not in SWAGGER_FILES:
        raise AppError("NOT_FOUND", 404, "no such asset")
    return _file(_swagger_dir() / name, DOCS_CSP)
