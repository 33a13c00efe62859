"""POST /scan/url: same report as a local scan, SSRF refusals as problem+json."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ckptguard.app.problems import install
from ckptguard.app.routes.remote import router
from ckptguard.app.ssrf import guard_from_settings
from ckptguard.core.io.source import BytesSource
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.scan import scan_source
from tests.rangeserver import RangeServer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


class Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def save(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return {"/ok.pt": save({"w": torch.arange(6.0).view(2, 3), "b": torch.ones(3).half()}),
            "/evil.pt": save({"x": Evil()})}


@pytest.fixture
def srv(files):
    with RangeServer(dict(files)) as s:
        yield s


def make_client(guard: UrlGuard | None) -> TestClient:
    app = FastAPI()
    install(app)
    app.include_router(router)
    if guard is not None:
        app.state.url_guard = guard
    return TestClient(app)


@pytest.fixture
def client() -> TestClient:
    return make_client(UrlGuard(allowlist=("127.0.0.1",)))


@pytest.mark.parametrize("path", ["/ok.pt", "/evil.pt"])
def test_report_equals_local_scan(client, srv, files, path) -> None:
    r = client.post("/scan/url", json={"url": srv.url(path)})
    assert r.status_code == 200, r.text
    remote = r.json()
    local = scan_source(BytesSource(files[path])).to_json()
    assert remote["io"]["requests"] == srv.requests and remote["io"]["bytes_read"] > 0
    assert remote["source"]["kind"] == "url" and remote["source"]["url"] == srv.url(path)
    assert remote["source"]["size"] == len(files[path])
    for k in ("source", "io", "timings_ms"):
        remote.pop(k)
        local.pop(k)
    assert remote == local
    assert remote["verdict"] == ("unsafe" if path == "/evil.pt" else "safe")


def test_headers_reach_the_first_host(client, srv) -> None:
    r = client.post("/scan/url", json={"url": srv.url("/ok.pt"), "headers": {"Authorization": "Bearer t0k"}})
    assert r.status_code == 200
    assert all(e.headers.get("Authorization") == "Bearer t0k" for e in srv.log)


def test_loopback_refused_by_default(srv) -> None:
    r = make_client(None).post("/scan/url", json={"url": srv.url("/ok.pt")})
    assert r.status_code == 403
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "SOURCE_URL_REFUSED"
    assert srv.requests == 0


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x.pt", "not a url"])
def test_bad_scheme_is_400(client, url) -> None:
    r = client.post("/scan/url", json={"url": url})
    assert r.status_code == 400 and r.json()["code"] == "SOURCE_URL_REFUSED"


def test_redirect_to_metadata_address_is_403(client, srv) -> None:
    srv.set_fault("redirect", redirect_to="http://169.254.169.254/latest/meta-data/")
    r = client.post("/scan/url", json={"url": srv.url("/ok.pt")})
    assert r.status_code == 403 and r.json()["code"] == "SOURCE_URL_REFUSED"


def test_upstream_errors_are_502(client, srv) -> None:
    r = client.post("/scan/url", json={"url": srv.url("/missing.pt")})
    assert r.status_code == 502 and r.json()["code"] == "SOURCE_HTTP"
    srv.set_fault("etag_changes")
    r = client.post("/scan/url", json={"url": srv.url("/ok.pt")})
    assert r.status_code == 502 and r.json()["code"] == "SOURCE_CHANGED"


def test_validation(client) -> None:
    assert client.post("/scan/url", json={}).status_code == 422
    too_many = {f"h{i}": "v" for i in range(40)}
    assert client.post("/scan/url", json={"url": "http://x/", "headers": too_many}).status_code == 422


def test_guard_from_settings() -> None:
    class S:
        url_allow_private = False
        url_allowlist = "127.0.0.1/32, minio.internal"

    guard = guard_from_settings(S())
    assert guard.resolve("127.0.0.1", 80) == "127.0.0.1"
    assert guard_from_settings(None) == UrlGuard()
    assert guard_from_settings(type("T", (), {"url_allow_private": True})()).allow_private
