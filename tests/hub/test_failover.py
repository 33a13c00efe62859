"""The job tier under failure, with real processes: one API-only node (uvicorn on 127.0.0.1),
two `ckptguard worker` subprocesses, a fake hub on 127.0.0.1 with 20 revisions; one worker is
killed with SIGKILL mid-run. Every file must end judged exactly once, every revision `done`,
no report stored twice, every webhook delivery deduplicated. Run on both implementations:
procrastinate on PostgreSQL (stalled-job recovery) and SQLite's in-process queue (leases)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.e2e.service_server import ROOT, cli_process, free_port, private_postgres
from tests.hub.conftest import SECRET, payload
from tests.hub.fakehub import FakeHub, revision_files, sha_of
from tests.hub.test_service import Receiver

pytestmark = pytest.mark.e2e

REPO = "acme/fleet"
REVISIONS = 12   # the kill lands after 5 are done: 2 leased by the victim, 5 still queued
STALL_S = 60.0   # a read that hangs past the remote client's read timeout (30 s)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"CKPTGUARD_HUB_LEASE_SECONDS": "8"}
        return
    with private_postgres() as url:
        yield {"CKPTGUARD_DATABASE_URL": url}


def wait_for(check: Any, what: str, timeout: float, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)
    return result


def api_node(stack: ExitStack, tmp_path: Path, hub: FakeHub, settings: dict[str, str],
             ) -> tuple[dict[str, str], list[Path], httpx.Client]:
    """An API-only node (`ckptguard serve --api-only`) up and healthy: the environment its
    workers share, the logs (API, worker a, worker b) and a client for it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CKPTGUARD_DATA_DIR": str(tmp_path / "data"),
           "CKPTGUARD_HOST": "127.0.0.1", "CKPTGUARD_PORT": str(port), "CKPTGUARD_WORKERS": "1",
           "CKPTGUARD_HUB_ENDPOINT": hub.url, "CKPTGUARD_WEBHOOK_SECRET": SECRET,
           "CKPTGUARD_URL_ALLOWLIST": "127.0.0.1", **settings}
    logs = [tmp_path / "api.log", tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    (tmp_path / "data").mkdir()
    stack.enter_context(cli_process(["serve", "--api-only"], env, logs[0]))
    http = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30))

    def healthy() -> bool:
        try:
            return http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, "the API", 120, logs)
    return env, logs, http


def test_a_killed_worker_loses_nothing_and_duplicates_nothing(tmp_path: Path,
                                                             database: dict[str, str]) -> None:
    receiver = Receiver(fail=0)
    with ExitStack() as stack, FakeHub() as hub:
        stack.callback(receiver.httpd.shutdown)
        for n in range(REVISIONS):
            hub.add("model", REPO, sha_of(n), revision_files(n))
        hub.storage.set_fault("stall", stall_seconds=0.05)   # every read waits: workers are mid-file
        env, logs, http = api_node(stack, tmp_path, hub, {
            "CKPTGUARD_WORKER_CONCURRENCY": "2", "CKPTGUARD_NOTIFY_URL": receiver.url,
            "CKPTGUARD_NOTIFY_RETRIES": "1", "CKPTGUARD_HUB_RETRY_BACKOFF_SECONDS": "0.2",
            # a send the kill cut short is another process's after its claim runs out
            "CKPTGUARD_NOTIFY_TIMEOUT_SECONDS": "2",
            "CKPTGUARD_QUEUE_HEARTBEAT_SECONDS": "1", "CKPTGUARD_QUEUE_STALLED_SECONDS": "3",
            "CKPTGUARD_QUEUE_RECOVER_SECONDS": "1", "CKPTGUARD_WORKER_SHUTDOWN_SECONDS": "5",
            **database})
        # every push delivered twice: the second is recorded as a duplicate, nothing queued
        for n in range(REVISIONS):
            for attempt in range(2):
                r = http.post("/webhooks/huggingface", json=payload(sha_of(n), repo=REPO),
                              headers={"X-Webhook-Secret": SECRET})
                assert r.status_code == 202, r.text
                [item] = r.json()["revisions"]
                assert item["duplicate"] is (attempt == 1) and item["new_job"] is (attempt == 0)
        worker_a = stack.enter_context(cli_process(["worker"], env, logs[1]))
        stack.enter_context(cli_process(["worker"], env, logs[2]))

        def done_count() -> int:
            items = http.get("/hub/revisions", params={"limit": 100, "state": "done"}).json()["items"]
            return len(items)

        wait_for(lambda: done_count() >= 5, "the first revisions", 120, logs)
        worker_a.send_signal(signal.SIGKILL)                 # mid-run: no goodbye, no release
        worker_a.wait(10)
        wait_for(lambda: done_count() == REVISIONS, "every revision", 180, logs)

        revisions = http.get("/hub/revisions", params={"limit": 100}).json()["items"]
        assert len(revisions) == REVISIONS
        report_ids = []
        for doc in revisions:
            assert doc["state"] == "done", doc
            files = {f["path"]: f for f in doc["files"]}
            assert files["README.md"]["state"] == "skipped"
            for path in ("model.bin", "optim.bin"):
                judged = files[path]
                assert judged["state"] == "done" and judged["report_id"], judged
                report = http.get(f"/scans/{judged['report_id']}").json()
                assert report["verdict"] == judged["verdict"] and report["source"]["name"] == path
                report_ids.append(judged["report_id"])
        url = database.get("CKPTGUARD_DATABASE_URL") or f"sqlite:///{tmp_path / 'data' / 'ckptguard.db'}"
        engine = sa.create_engine(url)
        stack.callback(engine.dispose)
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT id FROM scans")).scalars().all()
            deliveries = conn.execute(sa.text("SELECT count(*) FROM hub_deliveries")).scalar()
            jobs = conn.execute(sa.text("SELECT count(*) FROM hub_jobs")).scalar()
        # each file judged once: one report per file, none stored twice, none left over
        assert len(set(report_ids)) == 2 * REVISIONS and sorted(stored) == sorted(report_ids)
        assert deliveries == REVISIONS and jobs == REVISIONS
        notified = wait_for(lambda: _all_notified(receiver), "the notifications", 60, logs)
        # at least once: only a send in flight on the killed worker may be repeated (or cut short:
        # a body the kill truncated is no notification, and the receiver drops it)
        assert set(notified) == {sha_of(n) for n in range(REVISIONS)}
        repeated = sorted({s for s in notified if notified.count(s) > 1})
        assert len(notified) <= REVISIONS + 2, repeated
        if "CKPTGUARD_DATABASE_URL" in database:   # procrastinate took the dead worker's jobs back
            metrics = http.get("/metrics").text
            recovered = [line for line in metrics.splitlines()
                         if line.startswith('ckptguard_job_stalled_recoveries{queue="hub"}')]
            assert recovered and float(recovered[0].split()[-1]) >= 1, metrics


def _all_notified(receiver: Receiver) -> list[str] | None:
    import json

    shas = []
    for body, _ in list(receiver.bodies):
        try:
            shas.append(json.loads(body)["revision"])
        except ValueError:
            continue
    return shas if len(set(shas)) == REVISIONS else None


def test_sigterm_hands_the_running_job_back(tmp_path: Path, database: dict[str, str]) -> None:
    """`ckptguard worker` stopped with SIGTERM mid-file (past its shutdown grace): it exits
    cleanly, without waiting for the read still hanging in a thread, and the job goes back to
    the queue at once, for the next worker to finish."""
    with ExitStack() as stack, FakeHub() as hub:
        hub.add("model", REPO, sha_of(0), revision_files(0))
        # the first read hangs for longer than the test waits (the server's threads are daemons)
        hub.storage.set_fault("stall", stall_seconds=STALL_S, times=1)
        env, logs, http = api_node(stack, tmp_path, hub,
                                   {"CKPTGUARD_WORKER_SHUTDOWN_SECONDS": "0.5", **database})
        http.post("/webhooks/huggingface", json=payload(sha_of(0), repo=REPO),
                  headers={"X-Webhook-Secret": SECRET})
        worker = stack.enter_context(cli_process(["worker"], env, logs[1]))
        wait_for(lambda: hub.storage.log, "the first read", 120, logs)
        worker.send_signal(signal.SIGTERM)
        # it did not wait for the hanging read: that ends at the client's 30 s read timeout
        assert worker.wait(15) == 0
        doc = http.get(f"/hub/model/{REPO}/revisions/{sha_of(0)}").json()
        assert doc["state"] in ("queued", "running")
        url = database.get("CKPTGUARD_DATABASE_URL") or f"sqlite:///{tmp_path / 'data' / 'ckptguard.db'}"
        engine = sa.create_engine(url)
        stack.callback(engine.dispose)
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":           # released, not left to its lease
                row = conn.execute(sa.text("SELECT state, lease_owner FROM hub_jobs")).one()
                assert tuple(row) == ("queued", None)
            else:                                         # procrastinate: back to todo, none doing
                states = dict(conn.execute(sa.text(
                    "SELECT status::text, count(*) FROM procrastinate_jobs "
                    "WHERE queue_name = 'hub' GROUP BY status")).all())
                assert "doing" not in states and states.get("todo", 0) >= 1, states
        stack.enter_context(cli_process(["worker"], env, logs[2]))
        finished = wait_for(lambda: (d := http.get(f"/hub/model/{REPO}/revisions/{sha_of(0)}").json())
                            ["state"] == "done" and d, "the revision", 120, logs)
        assert all(f["state"] in ("done", "skipped") for f in finished["files"])
