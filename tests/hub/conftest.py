"""Fixtures: a fake hub serving tests/hub/checkpoints.py, and the service pointed at it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ckptguard.app.main import create_app
from ckptguard.app.settings import Settings
from tests.e2e.service_server import private_postgres
from tests.hub.checkpoints import REPO, REV_A, REV_B, revision_a, revision_b
from tests.hub.fakehub import FakeHub

SECRET = "s3cret-webhook-value"


@pytest.fixture(scope="session")
def files_a() -> dict[str, bytes]:
    return revision_a()


@pytest.fixture(scope="session")
def files_b(files_a: dict[str, bytes]) -> dict[str, bytes]:
    return revision_b(files_a)


@pytest.fixture
def hub(files_a: dict[str, bytes], files_b: dict[str, bytes]) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        fake.add("model", REPO, REV_A, files_a, refs=("refs/pr/3",))
        fake.add("model", REPO, REV_B, files_b, refs=("main", "refs/heads/main"))
        fake.add("dataset", REPO, REV_A, {"data/shard.bin": files_a["optimizer.bin"]})
        yield fake


def hub_settings(hub: FakeHub, data_dir: Path, **overrides: Any) -> dict[str, Any]:
    return {"data_dir": data_dir, "workers": 1, "hub_endpoint": hub.url, "webhook_secret": SECRET,
            "url_allowlist": ["127.0.0.1"], "hub_retry_backoff_seconds": 0.05,
            "hub_lease_seconds": 5.0, **overrides}



@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The job tier's two implementations: SQLite (the in-process queue) and PostgreSQL
    (procrastinate). A private schema per test keeps parallel runs (-n 2) apart; procrastinate's
    NOTIFY channels are database-wide, but a worker only takes jobs from its own schema and
    no test aborts a running job (the one notification that names a job by id)."""
    if request.param == "sqlite":
        yield {}
        return
    with private_postgres() as url:
        yield {"database_url": url, "queue_heartbeat_seconds": 1.0, "queue_stalled_seconds": 3.0,
               "queue_recover_seconds": 1.0, "worker_shutdown_seconds": 1.0}


@pytest.fixture
def make_client(tmp_path: Path, hub: FakeHub,
                database: dict[str, Any]) -> Iterator[Callable[..., TestClient]]:
    """`make(run_jobs=False, **settings)`: an API-only node that queues jobs and runs none."""
    with ExitStack() as stack:
        def make(run_jobs: bool = True, **overrides: Any) -> TestClient:
            settings = Settings(**hub_settings(hub, tmp_path / "data", **database, **overrides))
            app = create_app(settings, run_jobs=run_jobs)
            return stack.enter_context(TestClient(app, raise_server_exceptions=False))

        yield make


def payload(sha: str, ref: str = "refs/heads/main", repo: str = REPO, kind: str = "model",
            scope: str = "repo.content", action: str = "update") -> dict[str, Any]:
    return {"event": {"action": action, "scope": scope},
            "repo": {"type": kind, "name": repo, "id": "6400f0c0", "private": False, "headSha": sha},
            "updatedRefs": [{"ref": ref, "oldSha": None, "newSha": sha}], "webhook": {"id": "w1"}}


def deliver(client: TestClient, body: dict[str, Any], secret: str | None = SECRET) -> Any:
    headers = {"X-Webhook-Secret": secret} if secret is not None else {}
    return client.post("/webhooks/huggingface", json=body, headers=headers)


def wait_done(client: TestClient, sha: str, kind: str = "model", repo: str = REPO,
              timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/hub/{kind}/{repo}/revisions/{sha}")
        if r.status_code == 200 and r.json()["state"] in ("done", "failed"):
            doc: dict[str, Any] = r.json()
            return doc
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)


def by_path(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["path"]: f for f in doc["files"]}
