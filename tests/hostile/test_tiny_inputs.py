"""Tiny hostile requests against the real service (uvicorn on 127.0.0.1, one scan worker):
none may kill a worker, leak what the service can see, or change the next caller's verdict.

Each test asserts the property (the worker is not replaced, the answer is generic, the next
innocent scan is judged), not a timing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.service_server import Server, running_server

pytestmark = pytest.mark.e2e

BENIGN = b"\x80\x04K\x01."      # pickle of the int 1: safe


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("hostile"), CKPTGUARD_WORKERS="1") as srv:
        yield srv


def _restarts(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r'^ckptguard_worker_restarts_total\{[^}]*\} (\S+)$', text, re.M))


def _upload(server: Server, data: bytes, name: str = "x.pkl") -> dict[str, object]:
    r = httpx.post(f"{server.url}/scan", files={"file": (name, data, "application/octet-stream")},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("body", [
    {"url": "http://0177.0.0.1/x.pt"},                       # octal: readers disagree on it
    {"url": "http://\u0661\u0662\u0667.0.0.1/x.pt"},         # Arabic-Indic digits
    {"url": "http://example.org:\uff18\uff10/x.pt"},          # full-width port
    {"url": "http://example.org/x.pt", "headers": {"X-Token": "caf\u00e9"}},
    {"url": "http://example.org/x.pt", "headers": {"X-Token": "a\r\nInjected: 1"}},
    {"url": "http://example.org/x.pt", "headers": {"Content-Length": "5"}},
    {"url": "http://example.org/x.pt", "headers": {"Host": "internal.example"}},
    {"url": "http://example.org/x.pt", "headers": {"Transfer-Encoding": "chunked"}},
    {"url": "http://example.org/x.pt", "headers": {"Range": "bytes=0-0"}},
    {"url": "http://example.org/x.pt", "headers": {"Bad Name": "x"}},
], ids=lambda b: json.dumps(b, ensure_ascii=True)[:60])
def test_a_bad_url_or_header_is_a_400_before_any_worker(server: Server, body: dict[str, object]) -> None:
    before = _restarts(server)
    r = httpx.post(f"{server.url}/scan/url", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] in ("SOURCE_BAD_REQUEST", "SOURCE_URL_REFUSED")
    assert _restarts(server) == before
    assert _upload(server, BENIGN)["verdict"] == "safe"


def test_a_report_nested_500_deep_comes_back(server: Server) -> None:
    """A .pt2 whose program JSON nests 500 lists deep made a `safe` report that could not be
    pickled back from the worker: the worker died and the upload was `invalid`."""
    fc = pytest.importorskip("tests.core.formats.fmt_cases")
    pytest.importorskip("torch")
    data = fc.pt2_bytes(next(iter(fc.pt2_modules())))
    rel = next(n for n in fc.zip_names(data) if "/models/" in n and n.endswith(".json")).split("/", 1)[1]
    program = fc.zip_json(data, rel)
    deep: object = 0
    for _ in range(500):
        deep = [deep]
    program["range_constraints"] = deep
    before = _restarts(server)
    report = _upload(server, fc.zip_replace(data, {rel: json.dumps(program).encode()}), "m.pt2")
    assert not any(f["code"] == "WORKER_CRASHED" for f in report["findings"])  # type: ignore[index,union-attr]
    assert report["format"] == "torch-export"
    assert _restarts(server) == before


def test_a_worker_that_died_idle_does_not_fail_the_next_scan(server: Server) -> None:
    """The job never started on the dead worker: it runs on a fresh one (app/jobs.py)."""
    pids = _worker_pids(server)
    assert pids, "no scan worker found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    report = _upload(server, BENIGN)
    assert report["verdict"] == "safe", report["findings"]


def _worker_pids(server: Server) -> list[int]:
    """The scan workers (multiprocessing's resource tracker is a child too: spared)."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
    pids = [int(p) for p in children.read_text().split()] if children.exists() else []
    return [p for p in pids if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_refusals_and_upstream_failures_are_generic(server: Server) -> None:
    """What a name resolves to, and whether a port is open, is not the caller's to learn."""
    r = httpx.post(f"{server.url}/scan/url", json={"url": "http://localhost:1/x.pt"}, timeout=60)
    assert r.status_code == 403
    assert "127.0.0.1" not in r.text and "::1" not in r.text


def test_no_server_banner(server: Server) -> None:
    r = httpx.get(f"{server.url}/healthz", timeout=10)
    assert "server" not in r.headers


def test_every_log_line_is_json(server: Server) -> None:
    """uvicorn's start-up and error lines included: a log shipper reads one object per line."""
    httpx.get(f"{server.url}/healthz", timeout=10)
    lines = [line for line in server.log_lines() if line.strip()]
    assert lines
    for line in lines:
        assert isinstance(json.loads(line), dict), line
