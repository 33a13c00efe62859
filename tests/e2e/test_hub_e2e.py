"""The hub webhook end to end: the real service (uvicorn subprocess) against a fake hub.

Deliver the webhook, poll the revision summary until done, check each file's verdict;
wrong/missing secret; a duplicate delivery creates no second job; the storage failing
once is retried; SIGKILL mid-job and a restart finish the job without rescanning.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.e2e.service_server import Server, running_server
from tests.hub.checkpoints import EXPECTED_A, REPO, REV_A, REV_B, revision_a, revision_b
from tests.hub.conftest import SECRET, payload
from tests.hub.fakehub import FakeHub, blob_path

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def files_a() -> dict[str, bytes]:
    return revision_a()


@pytest.fixture
def hub(files_a: dict[str, bytes]) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        fake.add("model", REPO, REV_A, files_a)
        fake.add("model", REPO, REV_B, revision_b(files_a), refs=("main",))
        yield fake


def env(hub: FakeHub) -> dict[str, str]:
    return {"CKPTGUARD_HUB_ENDPOINT": hub.url, "CKPTGUARD_WEBHOOK_SECRET": SECRET,
            "CKPTGUARD_URL_ALLOWLIST": "127.0.0.1", "CKPTGUARD_WORKERS": "1",
            "CKPTGUARD_HUB_RETRY_BACKOFF_SECONDS": "0.2", "CKPTGUARD_HUB_LEASE_SECONDS": "2",
            "CKPTGUARD_LOG_LEVEL": "WARNING"}


def deliver(server: Server, body: dict[str, Any], secret: str | None = SECRET) -> httpx.Response:
    headers = {"X-Webhook-Secret": secret} if secret is not None else {}
    return httpx.post(f"{server.url}/webhooks/huggingface", json=body, headers=headers, timeout=10)


def wait_done(server: Server, sha: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{server.url}/hub/model/{REPO}/revisions/{sha}", timeout=10)
        if r.status_code == 200 and r.json()["state"] in ("done", "failed"):
            doc: dict[str, Any] = r.json()
            return doc
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)


def verdicts(doc: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {f["path"]: (f["state"], f["verdict"]) for f in doc["files"]}


def query(data_dir: Path, sql: str) -> list[Any]:
    engine = sa.create_engine(f"sqlite:///{data_dir / 'ckptguard.db'}")
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql)).all())
    finally:
        engine.dispose()


def jobs_in(data_dir: Path) -> list[Any]:
    return query(data_dir, "SELECT id, state FROM hub_jobs")


def test_webhook_scans_the_revision(tmp_path: Path, hub: FakeHub, files_a: dict[str, bytes]) -> None:
    evil = blob_path(files_a["evil.pt"])
    hub.storage.set_fault("status", times=1, status=403)   # the storage host fails once
    hub.storage.fault_paths = {evil}
    with running_server(tmp_path / "data", **env(hub)) as server:
        assert deliver(server, payload(REV_A), secret=None).status_code == 401
        assert deliver(server, payload(REV_A), secret="not-the-secret").status_code == 403
        r = deliver(server, payload(REV_A))
        assert r.status_code == 202 and r.json()["status"] == "queued"
        doc = wait_done(server, REV_A)
        assert doc["state"] == "done" and doc["verdict"] == "unsafe"
        assert verdicts(doc) == EXPECTED_A
        files = {f["path"]: f for f in doc["files"]}
        assert files["evil.pt"]["attempts"] == 1                         # retried, then scanned
        assert sum(e.path == evil for e in hub.storage.log if e.status == 403) == 1
        report = httpx.get(f"{server.url}/scans/{files['optimizer.bin']['report_id']}").json()
        assert report["verdict"] == "unsafe" and report["format"] == "pickle"

        gets = hub.storage.requests
        again = deliver(server, payload(REV_A)).json()["revisions"][0]
        assert again["duplicate"] and not again["new_job"]
        assert wait_done(server, REV_A)["state"] == "done"
        assert len(jobs_in(tmp_path / "data")) == 1 and hub.storage.requests == gets


def test_sigkill_mid_job_then_restart_finishes(tmp_path: Path, hub: FakeHub,
                                               files_a: dict[str, bytes]) -> None:
    slow = blob_path(files_a["pytorch_model.bin"])
    hub.storage.set_fault("stall", times=1, stall_seconds=5.0)
    hub.storage.fault_paths = {slow}
    data = tmp_path / "data"
    with running_server(data, **env(hub)) as server:
        assert deliver(server, payload(REV_A)).status_code == 202
        deadline = time.monotonic() + 30
        while not any(e.path == slow for e in hub.storage.log):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # let other files finish first: the restart must not scan them again
        while not any(f["state"] == "done" for f in httpx.get(
                f"{server.url}/hub/model/{REPO}/revisions/{REV_A}").json()["files"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
    [(job_id, state)] = jobs_in(data)
    assert state == "running"                                   # killed: nobody handed it back
    done = {r.path for r in query(data, "SELECT path FROM hub_files WHERE state = 'done'")}
    assert done and "pytorch_model.bin" not in done
    gets = {p: hub.storage_gets(d) for p, d in files_a.items()}
    with running_server(data, **env(hub)) as server:
        doc = wait_done(server, REV_A)
    assert doc["job_id"] == job_id and doc["state"] == "done" and verdicts(doc) == EXPECTED_A
    rescanned = {p for p, d in files_a.items() if hub.storage_gets(d) > gets[p]}
    assert "pytorch_model.bin" in rescanned and not rescanned & done   # finished files kept
