"""The job tier behind its seam (app/jobqueue.py), on both implementations: SQLite's in-process
queue and procrastinate on PostgreSQL (the `database` fixture). API-only nodes, asynchronous
URL scans, cancellation, the queue figures in /metrics; then what only procrastinate does
(priorities, the periodic reconcile)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.hub.checkpoints import EXPECTED_A, REPO, REV_A, REV_B
from tests.hub.conftest import by_path, deliver, payload, wait_done
from tests.hub.fakehub import FakeHub, blob_path

MakeClient = Callable[..., TestClient]


def _metric(client: TestClient, sample: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


def _revision(client: TestClient, sha: str) -> dict[str, Any]:
    doc: dict[str, Any] = client.get(f"/hub/model/{REPO}/revisions/{sha}").json()
    return doc


def test_api_only_queues_and_a_worker_runs(make_client: MakeClient) -> None:
    api = make_client(run_jobs=False)
    assert deliver(api, payload(REV_A)).status_code == 202
    time.sleep(1.0)
    assert _revision(api, REV_A)["state"] == "queued"               # nobody runs it here
    assert _metric(api, 'ckptguard_jobs_queued{queue="hub"}') == 1
    worker = make_client()                                          # a node that runs jobs
    doc = wait_done(worker, REV_A)
    assert {p: (f["state"], f["verdict"]) for p, f in by_path(doc).items()} == EXPECTED_A
    assert _metric(api, 'ckptguard_jobs_queued{queue="hub"}') == 0
    assert _metric(api, 'ckptguard_jobs_running{queue="hub"}') == 0


def test_a_queued_rescan_can_be_cancelled(make_client: MakeClient) -> None:
    node = make_client()
    deliver(node, payload(REV_A))
    wait_done(node, REV_A)
    node.__exit__(None, None, None)
    api = make_client(run_jobs=False)
    base = f"/hub/model/{REPO}/revisions/{REV_A}"
    assert api.post(f"{base}/rescan").status_code == 202
    assert _revision(api, REV_A)["state"] == "queued"
    r = api.post(f"{base}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    again = api.post(f"{base}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "REVISION_BUSY"
    engine = api.app.state.store.engine   # type: ignore[attr-defined]
    if engine.dialect.name == "postgresql":   # the waiting job left procrastinate's queue too
        with engine.connect() as conn:
            assert conn.execute(sa.text(
                "SELECT status::text FROM procrastinate_jobs WHERE task_name = 'hub.revision' "
                "ORDER BY id DESC LIMIT 1")).scalar() == "cancelled"
    worker = make_client()
    # a later push (lower priority than a rescan, queued after it): once the worker has run
    # it, it has taken from the queue past where the cancelled rescan was
    deliver(worker, payload(REV_B))
    wait_done(worker, REV_B)
    assert _revision(worker, REV_A)["state"] == "cancelled"         # never run
    assert worker.post(f"{base}/rescan").status_code == 202         # a cancelled one may go again
    assert wait_done(worker, REV_A)["state"] == "done"
    assert api.post(f"/hub/model/{REPO}/revisions/{'c3' * 20}/cancel").status_code == 404


def test_async_url_scan(make_client: MakeClient, hub: FakeHub, files_a: dict[str, bytes]) -> None:
    client = make_client()
    url = hub.storage.url(blob_path(files_a["evil.pt"]))
    r = client.post("/scan/url?async=true", json={"url": url, "headers": {"X-Note": "kept until the end"}})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.json()["poll"] == f"/scan/url/jobs/{job_id}"
    deadline = time.monotonic() + 60
    while (doc := client.get(f"/scan/url/jobs/{job_id}").json())["state"] not in ("done", "failed"):
        assert time.monotonic() < deadline, doc
        time.sleep(0.1)
    assert doc["state"] == "done" and doc["error"] is None
    report = client.get(doc["report"]).json()
    assert report["verdict"] == "unsafe" and report["source"]["url"] == url
    engine = client.app.state.store.engine   # type: ignore[attr-defined]
    with engine.connect() as conn:   # the upstream's credentials are not kept past the scan
        assert conn.execute(sa.text("SELECT headers FROM url_scans")).scalar() is None
    # refused at once, like a synchronous scan; an upstream that fails ends the job `failed`
    refused = client.post("/scan/url?async=true", json={"url": "http://10.0.0.1/x.pt"})
    assert refused.status_code == 403
    gone = client.post("/scan/url?async=true", json={"url": hub.storage.url("/blobs/none")}).json()
    while (doc := client.get(gone["poll"]).json())["state"] not in ("done", "failed"):
        time.sleep(0.1)
    assert doc["state"] == "failed" and doc["report_id"] is None and "SOURCE_HTTP" in doc["error"]
    assert client.get(f"/scan/url/jobs/{'0' * 32}").status_code == 404


def _only(database: dict[str, Any], what: str) -> None:
    if "database_url" not in database:
        pytest.skip(f"{what}: procrastinate's (PostgreSQL), not the in-process queue's")


def test_interactive_scans_and_rescans_run_before_backfills(
        make_client: MakeClient, database: dict[str, Any], hub: FakeHub, files_a: dict[str, bytes]) -> None:
    _only(database, "priorities (the in-process queue runs in arrival order)")
    from ckptguard.app.jobqueue import PRIORITY_BACKFILL

    api = make_client(run_jobs=False)
    accepted = deliver(api, payload(REV_A)).json()["revisions"]
    queue = api.app.state.queue   # type: ignore[attr-defined]
    engine = api.app.state.store.engine   # type: ignore[attr-defined]
    with engine.begin() as conn:   # the delivery's revision becomes a backfill
        conn.execute(sa.text("UPDATE procrastinate_jobs SET priority = :p"), {"p": PRIORITY_BACKFILL})
    url = hub.storage.url(blob_path(files_a["evil.pt"]))
    scan = api.post("/scan/url?async=true", json={"url": url}).json()
    worker = make_client(worker_concurrency=1)
    wait_done(worker, REV_A)
    with engine.connect() as conn:
        started = conn.execute(sa.text(
            "SELECT j.task_name FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
            "WHERE e.type = 'started' AND j.task_name IN ('url.scan', 'hub.revision') "
            "ORDER BY e.at, e.id")).scalars().all()
    assert started[0] == "url.scan", started
    assert accepted[0]["new_job"] and scan["job_id"] and queue is not None


def test_periodic_reconcile_queues_a_missed_head(make_client: MakeClient, database: dict[str, Any]) -> None:
    _only(database, "the periodic reconcile")
    client = make_client(reconcile_cron="* * * * * */1")
    deliver(client, payload(REV_A))            # main really points at REV_B: that delivery was lost
    wait_done(client, REV_A)
    doc = wait_done(client, REV_B)              # found by the periodic task, nobody asked
    assert doc["state"] == "done" and doc["ref"] == "refs/heads/main"


def test_a_revision_recorded_by_an_api_node_that_died_is_run(make_client: MakeClient) -> None:
    """The API recorded the delivery, then died before it queued the job (kill -9 mid-webhook):
    the hub's redelivery is a duplicate and queues nothing, yet the revision runs."""
    api = make_client(run_jobs=False)
    db = api.app.state.hub.db   # type: ignore[attr-defined]
    db.deliver("model", REPO, "refs/heads/main", REV_A)             # recorded, never enqueued
    again = deliver(api, payload(REV_A)).json()["revisions"][0]
    assert again["duplicate"] and not again["new_job"]
    worker = make_client()
    assert wait_done(worker, REV_A)["state"] == "done"


def test_cut_database_connections_leave_the_jobs_running(make_client: MakeClient,
                                                       database: dict[str, Any]) -> None:
    """What a worker sees of a PostgreSQL restart: every connection of its job tier cut. Its
    worker starts again, and the next revision is judged."""
    _only(database, "procrastinate's connections")
    from ckptguard.app.hub.tasks import application_name

    client = make_client()
    deliver(client, payload(REV_A))
    wait_done(client, REV_A)
    engine = client.app.state.store.engine   # type: ignore[attr-defined]
    with engine.begin() as conn:
        cut = conn.execute(sa.text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                   "WHERE application_name = :name"), {"name": application_name()}).scalar()
    assert cut and cut >= 1
    deliver(client, payload(REV_B))
    assert wait_done(client, REV_B, timeout=90)["state"] == "done"


def test_the_job_worker_is_started_again_until_the_process_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """procrastinate's worker returns when a side task failed, or raises: either way it runs
    again; cancelling (the process stopping) ends it."""
    import asyncio

    from ckptguard.app import tier

    monkeypatch.setattr(tier, "RESTART_PAUSE_S", 0.01)

    class Flaky:
        runs = 0

        async def run_worker(self) -> None:
            self.runs += 1
            if self.runs == 1:
                return                              # stopped on its own
            if self.runs == 2:
                raise OSError("connection lost")    # failed
            await asyncio.Event().wait()            # runs until cancelled

    async def scenario() -> int:
        flaky = Flaky()
        task = asyncio.create_task(tier._supervise(flaky))
        while flaky.runs < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return flaky.runs

    assert asyncio.run(scenario()) == 3


def test_procrastinate_admin_tools_load_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    import procrastinate

    monkeypatch.setenv("CKPTGUARD_DATABASE_URL", "postgresql+psycopg://u:p@127.0.0.1:1/db")
    app = procrastinate.App.from_path("ckptguard.app.hub.tasks.admin_app")
    assert {"hub.revision", "hub.file", "hub.notify", "url.scan", "jobs.recover"} <= set(app.tasks)


def test_a_report_stored_before_the_process_died_is_kept(make_client: MakeClient, hub: FakeHub,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A job runs at least once: a process that died after storing a file's report and before
    recording it leaves the job to run again, and the rerun keeps that report (the id drawn
    for the file row) instead of storing a second one. The file is a text pickle: no LFS
    sha256, so no cache hit could hide a copy."""
    import pickle

    from ckptguard.app.hub.db import HubDb
    from ckptguard.app.tables import scans

    rev = "c3" * 20
    hub.add("model", REPO, rev, {"config.pkl": pickle.dumps({"lr": 0.1, "name": "x" * 64}, protocol=0)})
    record_done = HubDb.file_state
    died: list[int] = []

    def dies_once(self: HubDb, file_id: int, **values: Any) -> None:
        if values.get("state") == "done" and not died:
            died.append(file_id)
            raise RuntimeError("the process died here, its report stored")
        record_done(self, file_id, **values)

    monkeypatch.setattr(HubDb, "file_state", dies_once)
    client = make_client()
    deliver(client, payload(rev))
    f = by_path(wait_done(client, rev))["config.pkl"]
    assert died and f["state"] == "done" and f["lfs_sha256"] is None
    with client.app.state.hub.db.engine.connect() as conn:   # type: ignore[attr-defined]
        ids = conn.execute(sa.select(scans.c.id).where(scans.c.source_name == "config.pkl")).scalars().all()
    assert ids == [f["report_id"]]


def test_a_hub_down_for_a_while_still_gets_every_file_judged_once(
        make_client: MakeClient, hub: FakeHub) -> None:
    """The hub's API and its storage answer 503 for a while: tries are retried with backoff,
    every file of the revision ends judged, each with one report."""
    from ckptguard.app.tables import scans

    hub.outage = 2                                        # the tree listing: down, down, up
    hub.storage.set_fault("status", times=4, status=503)  # the first four blob reads fail too
    client = make_client(hub_scan_attempts=6)
    deliver(client, payload(REV_A))
    doc = wait_done(client, REV_A)
    assert doc["state"] == "done"
    files = by_path(doc)
    assert {p: (f["state"], f["verdict"]) for p, f in files.items()} == EXPECTED_A
    assert hub.outage <= 0 and hub.storage.fault_times == 0   # the outage really happened
    judged = sorted(f["report_id"] for f in files.values() if f["report_id"] is not None)
    with client.app.state.hub.db.engine.connect() as conn:   # type: ignore[attr-defined]
        stored = sorted(conn.execute(sa.select(scans.c.id).where(
            scans.c.source_kind == "hub")).scalars().all())
    assert stored == judged                                   # one report per judged file


def test_a_database_down_for_a_while_loses_no_job(hub: FakeHub, tmp_path: Path,
                                                  database: dict[str, Any]) -> None:
    """A PostgreSQL restart as the service sees it: every connection cut, and none accepted
    for a few seconds, mid-revision. The job tier reconnects; every file ends judged once.
    A database of its own (not a schema), so refusing connections touches only this test."""
    _only(database, "a database outage")
    from ckptguard.app.main import create_app
    from ckptguard.app.settings import Settings
    from ckptguard.app.tables import scans
    from tests.e2e.service_server import PG_URL
    from tests.hub.conftest import hub_settings

    assert PG_URL is not None
    name = f"ckptguard_outage_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    try:
        settings = Settings(**hub_settings(hub, tmp_path / "data", **{**database, "database_url": url}))
        with TestClient(create_app(settings), raise_server_exceptions=False) as client:
            hub.storage.set_fault("stall", stall_seconds=1.0)   # slow blobs: the outage lands mid-run
            deliver(client, payload(REV_A))
            deadline = time.monotonic() + 60
            while not any(f["state"] in ("running", "done") for f in
                          _revision(client, REV_A).get("files", [])):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            with admin.connect() as conn:   # down: nothing connects, and what was connected is cut
                conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                cut = conn.execute(sa.text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                           "WHERE datname = :name"), {"name": name}).scalar()
                time.sleep(3.0)
                conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            hub.storage.set_fault(None)
            assert cut and cut >= 1
            doc = wait_done(client, REV_A, timeout=120)
            files = by_path(doc)
            assert doc["state"] == "done"
            assert {p: (f["state"], f["verdict"]) for p, f in files.items()} == EXPECTED_A
            judged = sorted(f["report_id"] for f in files.values() if f["report_id"] is not None)
            with client.app.state.hub.db.engine.connect() as conn:   # type: ignore[attr-defined]
                stored = sorted(conn.execute(sa.select(scans.c.id).where(
                    scans.c.source_kind == "hub")).scalars().all())
            assert stored == judged
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
