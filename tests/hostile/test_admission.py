"""Work in flight is capped per kind and per API key (app/admission.py), against the real
service: a URL scan stuck on a trickling upstream holds one of its kind's slots, not every
worker, so uploads keep being scanned; and one key cannot take a whole kind's share."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.service_server import Server, free_port, running_server
from tests.trickle import trickling_server

pytestmark = pytest.mark.e2e
KEY_ONE = "key-one-0123456789abcdef"
KEY_TWO = "key-two-0123456789abcdef"
PICKLE = b"\x80\x04K\x01."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # two workers: URL scans may hold one of them (max(1, workers // 2)), uploads the other
    with running_server(tmp_path_factory.mktemp("admission"), CKPTGUARD_WORKERS="2",
                        CKPTGUARD_URL_ALLOW_PRIVATE="true",
                        CKPTGUARD_API_KEYS=f"{KEY_ONE},{KEY_TWO}",
                        CKPTGUARD_MAX_IN_FLIGHT_PER_KEY="1") as srv:
        yield srv


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _upload(server: Server, key: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{server.url}/scan", files={"file": ("m.pkl", body, "x/y")},
                      headers=_auth(key), timeout=60)


def test_a_stuck_url_scan_holds_its_own_slots_only(server: Server) -> None:
    connected = threading.Event()
    with trickling_server(1 << 20, 0.2, connected) as slow_url:
        stuck: list[httpx.Response] = []
        holder = threading.Thread(target=lambda: stuck.append(httpx.post(
            f"{server.url}/scan/url", json={"url": slow_url}, headers=_auth(KEY_ONE), timeout=120)))
        holder.start()
        # the stuck scan reached its upstream: it holds the only URL slot
        assert connected.wait(30), "the URL scan never reached its upstream"
        # a URL nobody listens on: were it admitted, it would fail at once (502), not hang
        closed = f"http://127.0.0.1:{free_port()}/model.pt"
        probe = httpx.post(f"{server.url}/scan/url", json={"url": closed},
                           headers=_auth(KEY_TWO), timeout=30)
        assert probe.status_code == 503, probe.text
        assert probe.json()["code"] == "URL_SCANS_BUSY" and probe.headers["retry-after"] == "5"

        ok = _upload(server, KEY_TWO, PICKLE)                 # another worker still scans
        assert ok.status_code == 200 and ok.json()["verdict"] == "safe"

        busy = _upload(server, KEY_ONE, PICKLE + b"\n")      # key one is at its cap
        assert busy.status_code == 503 and busy.json()["code"] == "KEY_BUSY"
        assert busy.headers["retry-after"] == "5"
    # leaving the block stopped the upstream: the stuck scan ends (502)
    holder.join(timeout=60)
    assert stuck and stuck[0].status_code == 502
    # the slots are given back: key one may scan again
    assert _upload(server, KEY_ONE, PICKLE + b"\n\n").status_code == 200
