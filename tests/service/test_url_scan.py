"""POST /scan/url (the remote engineer's route) through create_app: the scan runs in the
sandboxed pool (`Jobs.scan_url`), errors cross the process boundary, API keys apply."""

from __future__ import annotations

import pytest

from ckptguard.core.io.urlguard import UrlGuard
from tests.rangeserver import RangeServer
from tests.service.payloads import benign_pickle, malicious_pickle, nonce


@pytest.fixture
def srv():
    with RangeServer({"/evil.pkl": malicious_pickle(nonce()), "/ok.pkl": benign_pickle(nonce())}) as s:
        yield s


def test_url_scan_in_the_pool(make_client, srv) -> None:
    client = make_client()
    client.app.state.url_guard = UrlGuard(allowlist=("127.0.0.1",))
    busy_before = client.app.state.jobs.busy
    r = client.post("/scan/url", json={"url": srv.url("/evil.pkl")})
    assert r.status_code == 200, r.text
    assert r.json()["verdict"] == "unsafe" and r.json()["source"]["kind"] == "url"
    # stored like an upload, with an id of its own, the same bytes when read back
    assert r.json()["cached"] is False and client.get(f"/scans/{r.json()['id']}").content == r.content
    again = client.post("/scan/url", json={"url": srv.url("/evil.pkl")}).json()
    assert again["id"] != r.json()["id"] and again["cached"] is False   # never from the cache
    assert client.post("/scan/url", json={"url": srv.url("/ok.pkl")}).json()["verdict"] == "safe"
    assert client.app.state.jobs.busy == busy_before
    # A SourceError raised inside the worker arrives intact: 502 SOURCE_HTTP, not a 500.
    r = client.post("/scan/url", json={"url": srv.url("/missing.pkl")})
    assert r.status_code == 502 and r.json()["code"] == "SOURCE_HTTP"


def test_url_scan_refuses_loopback_by_default(client, srv) -> None:
    r = client.post("/scan/url", json={"url": srv.url("/ok.pkl")})
    assert r.status_code == 403 and r.json()["code"] == "SOURCE_URL_REFUSED"


def test_url_scan_needs_the_api_key(make_client, srv) -> None:
    key = "z" * 24
    client = make_client(api_keys=key)
    client.app.state.url_guard = UrlGuard(allowlist=("127.0.0.1",))
    assert client.post("/scan/url", json={"url": srv.url("/ok.pkl")}).status_code == 401
    r = client.post("/scan/url", json={"url": srv.url("/ok.pkl")},
                    headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200 and r.json()["verdict"] == "safe"
