"""The real service over HTTP (uvicorn subprocess on 127.0.0.1), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.service_server import Server, private_postgres, running_server
from tests.service.conftest import BOUNDARY, multipart_chunks
from tests.service.payloads import (
    benign_pickle,
    big_pickle_chunks,
    malformed_pickle,
    malicious_pickle,
    nonce,
    torch_checkpoint,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request, tmp_path_factory) -> Iterator[dict[str, str]]:
    """Server environment selecting the database; PostgreSQL only where CI provides one."""
    if request.param == "sqlite":
        yield {}
        return
    with private_postgres() as url:
        yield {"CKPTGUARD_DATABASE_URL": url}


@pytest.fixture(scope="module")
def server(database, tmp_path_factory) -> Iterator[Server]:
    env = {**database, "CKPTGUARD_MAX_UPLOAD_BYTES": str(2 * 1024 * 1024)}
    with running_server(tmp_path_factory.mktemp("srv"), **env) as srv:
        yield srv


def post(server: Server, data: bytes, name: str = "model.pt", **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/scan", files={"file": (name, data)}, timeout=120, **kw)


def codes(body: dict[str, Any]) -> list[str]:
    return [f["code"] for f in body["findings"]]


def test_benign_malicious_malformed(server: Server) -> None:
    tag = nonce()
    good = torch_checkpoint(tag)
    r = post(server, good)
    assert r.status_code == 200 and r.json()["verdict"] == "safe"
    assert r.json()["format"] == "torch-zip"
    assert r.json()["source"]["sha256"] == hashlib.sha256(good).hexdigest()
    evil = post(server, malicious_pickle(tag), name="evil.pkl")
    assert evil.status_code == 200 and evil.json()["verdict"] == "unsafe"
    assert "PICKLE_DANGEROUS_GLOBAL" in codes(evil.json())
    bad = post(server, malformed_pickle(tag))
    assert bad.status_code == 200 and bad.json()["verdict"] == "invalid"
    # One structured log line per scan, with id, sha256, verdict and milliseconds.
    lines = [json.loads(x) for x in server.log_lines() if x.startswith("{")]
    scans = {x["id"]: x for x in lines if x.get("event") == "scan"}
    line = scans[evil.json()["id"]]
    assert line["verdict"] == "unsafe" and line["sha256"] == evil.json()["source"]["sha256"]
    assert isinstance(line["ms"], float)


def test_oversize_upload_is_413(server: Server) -> None:
    r = post(server, os.urandom(3 * 1024 * 1024))
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert post(server, benign_pickle(nonce())).status_code == 200


def test_oversize_streamed_without_length_is_413(server: Server) -> None:
    chunks = multipart_chunks((b"\0" * 65536 for _ in range(64)), "big.bin")   # 4 MB, chunked
    r = httpx.post(f"{server.url}/scan", content=chunks, timeout=60,
                   headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"})
    assert r.status_code == 413 and r.json()["code"] == "PAYLOAD_TOO_LARGE"


def test_cache_hit_and_lookup(server: Server) -> None:
    data = malicious_pickle(nonce())
    first, second = post(server, data).json(), post(server, data).json()
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["id"] != first["id"]    # the caller's own record of the shared analysis
    got = httpx.get(f"{server.url}/scans/{first['id']}").json()
    assert got["verdict"] == "unsafe" and got["id"] == first["id"]
    listed = httpx.get(f"{server.url}/scans", params={"sha256": first["source"]["sha256"]}).json()
    assert sorted(i["id"] for i in listed["items"]) == sorted([first["id"], second["id"]])
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'ckptguard_scans_total{cached="true",format="pickle",verdict="unsafe"}' in metrics


def test_50_concurrent_uploads(server: Server) -> None:
    files = [(benign_pickle(f"{i}-{nonce()}") if i % 2 else malicious_pickle(f"{i}-{nonce()}"))
             for i in range(50)]

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(client.post("/scan", files={"file": (f"{i}.pkl", f)})
                                          for i, f in enumerate(files)))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 50
    assert [r.json()["verdict"] for r in responses] == ["unsafe", "safe"] * 25
    assert len({r.json()["id"] for r in responses}) == 50


def test_restart_keeps_reports(database, tmp_path: Path) -> None:
    data = malicious_pickle(nonce())
    with running_server(tmp_path / "d", **database) as srv:
        first = post(srv, data).json()
    with running_server(tmp_path / "d", **database) as srv:
        got = httpx.get(f"{srv.url}/scans/{first['id']}")
        assert got.status_code == 200 and got.json()["verdict"] == "unsafe"
        again = post(srv, data).json()
        assert again["cached"] is True and again["verdict"] == first["verdict"]


@pytest.mark.slow
def test_memory_limit_blowup_then_next_request_succeeds(database, tmp_path: Path) -> None:
    env = {**database, "CKPTGUARD_WORKER_MEMORY_MB": "256", "CKPTGUARD_WORKERS": "1"}
    with ExitStack() as stack:
        srv = stack.enter_context(running_server(tmp_path / "m", **env))
        chunks = multipart_chunks(big_pickle_chunks(300 * 1024 * 1024), "huge.pkl")
        r = httpx.post(f"{srv.url}/scan", content=chunks, timeout=300,
                       headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"})
        assert r.status_code == 200
        assert r.json()["verdict"] == "invalid" and "RESOURCE_LIMIT" in codes(r.json())
        nxt = post(srv, malicious_pickle(nonce()))
        assert nxt.status_code == 200 and nxt.json()["verdict"] == "unsafe"
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
