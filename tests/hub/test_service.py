"""The webhook through the whole service (TestClient, real runner, fake hub on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from ckptguard.app.notify import SIGNATURE_HEADER, verify
from ckptguard.app.tables import hub_jobs
from tests.hub.checkpoints import EXPECTED_A, REPO, REV_A, REV_B
from tests.hub.conftest import SECRET, by_path, deliver, payload, wait_done
from tests.hub.fakehub import FakeHub, blob_path
from tests.rangeserver import serving_thread

MakeClient = Callable[..., TestClient]


def test_revision_verdicts_and_reports(make_client: MakeClient, hub: FakeHub) -> None:
    client = make_client()
    assert client.app.state.hub.jobs is client.app.state.jobs   # type: ignore[attr-defined]  # sandboxed scans
    r = deliver(client, payload(REV_A, ref="refs/pr/3"))
    assert r.status_code == 202, r.text
    [item] = r.json()["revisions"]
    assert item["revision"] == REV_A and item["new_job"] and not item["duplicate"]
    doc = wait_done(client, REV_A)
    assert doc["state"] == "done" and doc["verdict"] == "unsafe" and doc["ref"] == "refs/pr/3"
    files = by_path(doc)
    assert {p: (f["state"], f["verdict"]) for p, f in files.items()} == EXPECTED_A
    for f in files.values():
        if f["state"] == "done":
            report = client.get(f"/scans/{f['report_id']}").json()
            assert report["verdict"] == f["verdict"] and report["source"]["kind"] == "hub"
            assert report["source"]["name"] == f["path"] and report["source"]["sha256"] == f["lfs_sha256"]
    assert files["x.txt"]["report_id"] is None                 # too small: never fetched
    assert files["README.md"]["error"].startswith("not a checkpoint")
    assert not any(e.path == blob_path(b"hi\n") for e in hub.storage.log)


def test_secret_is_required(make_client: MakeClient) -> None:
    client = make_client()
    assert deliver(client, payload(REV_A), secret=None).status_code == 401
    assert deliver(client, payload(REV_A), secret="wrong").status_code == 403
    r = client.post(f"/webhooks/huggingface?secret={SECRET}", json=payload(REV_A))
    assert r.status_code == 202
    assert deliver(client, {"event": {"scope": "discussion", "action": "create"},
                            "repo": {"type": "model", "name": REPO}}).json()["status"] == "ignored"
    assert client.post("/webhooks/huggingface", content=b"{not json",
                       headers={"X-Webhook-Secret": SECRET}).status_code == 400


def test_webhook_off_without_a_secret(make_client: MakeClient) -> None:
    client = make_client(webhook_secret=None)
    assert deliver(client, payload(REV_A)).status_code == 503


def test_duplicate_delivery_scans_once(make_client: MakeClient, hub: FakeHub) -> None:
    client = make_client()
    first = deliver(client, payload(REV_A)).json()["revisions"][0]
    wait_done(client, REV_A)
    gets = hub.storage.requests
    again = deliver(client, payload(REV_A)).json()["revisions"][0]
    assert again["duplicate"] and not again["new_job"] and again["job_id"] == first["job_id"]
    other_ref = deliver(client, payload(REV_A, ref="refs/tags/v1")).json()["revisions"][0]
    assert not other_ref["duplicate"] and not other_ref["new_job"] and other_ref["job_id"] == first["job_id"]
    assert wait_done(client, REV_A)["state"] == "done" and hub.storage.requests == gets
    with sa.create_engine(client.app.state.settings.resolved_database_url).connect() as conn:  # type: ignore[attr-defined]
        assert conn.execute(sa.select(sa.func.count()).select_from(hub_jobs)).scalar() == 1


def test_same_content_reuses_the_report(make_client: MakeClient, hub: FakeHub,
                                        files_a: dict[str, bytes], files_b: dict[str, bytes]) -> None:
    client = make_client()
    deliver(client, payload(REV_A))
    a = by_path(wait_done(client, REV_A))
    before = {p: hub.storage_gets(d) for p, d in files_b.items()}
    deliver(client, payload(REV_B))
    doc = wait_done(client, REV_B)
    assert doc["state"] == "done" and doc["verdict"] == "safe"
    b = by_path(doc)
    for path in ("legacy.bin", "weights/model.safetensors", "stats.npy"):   # same LFS sha256
        assert b[path]["report_id"] == a[path]["report_id"]
        assert hub.storage_gets(files_b[path]) == before[path]
    assert b["pytorch_model.bin"]["report_id"] != a["pytorch_model.bin"]["report_id"]
    assert hub.storage_gets(files_b["pytorch_model.bin"]) > before["pytorch_model.bin"]


def _metric(client: TestClient, sample: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def test_hub_metrics(make_client: MakeClient, hub: FakeHub) -> None:
    client = make_client()
    files = "ckptguard_hub_files_total"
    deliver(client, payload(REV_A))
    wait_done(client, REV_A)
    for state in ("done", "skipped"):
        expected = sum(1 for s, _ in EXPECTED_A.values() if s == state)
        assert _metric(client, f'{files}{{reused="false",state="{state}"}}') == expected, state
    deliver(client, payload(REV_A))                                  # a duplicate delivery
    deliver(client, payload(REV_A), secret="wrong")                  # refused
    deliver(client, {"event": {"scope": "discussion", "action": "create"},
                     "repo": {"type": "model", "name": REPO}})       # ignored
    deliver(client, payload(REV_B))
    wait_done(client, REV_B)
    hub_webhooks = "ckptguard_hub_webhooks_total"
    assert _metric(client, f'{hub_webhooks}{{outcome="queued"}}') == 2
    assert _metric(client, f'{hub_webhooks}{{outcome="duplicate"}}') == 1
    assert _metric(client, f'{hub_webhooks}{{outcome="refused"}}') == 1
    assert _metric(client, f'{hub_webhooks}{{outcome="ignored"}}') == 1
    assert _metric(client, 'ckptguard_hub_revisions_total{state="done"}') == 2
    # REV_B's three files with REV_A's LFS sha256 reuse their reports (no download)
    assert _metric(client, f'{files}{{reused="true",state="done"}}') == 3


def test_rescan_judges_a_finished_revision_again(make_client: MakeClient, hub: FakeHub,
                                                 files_a: dict[str, bytes]) -> None:
    client = make_client()
    base = f"/hub/model/{REPO}/revisions"
    assert client.post(f"{base}/{REV_A}/rescan").status_code == 404
    deliver(client, payload(REV_A))
    first = wait_done(client, REV_A)
    runner = client.app.state.hub   # type: ignore[attr-defined]
    listings = sum(1 for e in hub.log if "/tree/" in e.raw_path)
    r = client.post(f"{base}/{REV_A}/rescan")
    assert r.status_code == 202 and r.json()["job_id"] == first["job_id"]
    again = wait_done(client, REV_A)
    assert again["job_id"] == first["job_id"]
    assert {p: (f["state"], f["verdict"]) for p, f in by_path(again).items()} == EXPECTED_A
    assert sum(1 for e in hub.log if "/tree/" in e.raw_path) > listings   # listed again
    # a revision that is not finished is left alone
    with runner.db.engine.begin() as conn:
        conn.execute(hub_jobs.update().where(hub_jobs.c.id == first["job_id"]).values(state="running"))
    busy = client.post(f"{base}/{REV_A}/rescan")
    assert busy.status_code == 409 and busy.json()["code"] == "REVISION_BUSY"


def test_storage_failing_once_is_retried(make_client: MakeClient, hub: FakeHub,
                                         files_a: dict[str, bytes]) -> None:
    hub.storage.set_fault("status", times=1, status=403)   # not transient for HttpSource: our retry
    hub.storage.fault_paths = {blob_path(files_a["evil.pt"])}
    client = make_client()
    deliver(client, payload(REV_A))
    evil = by_path(wait_done(client, REV_A))["evil.pt"]
    assert evil["state"] == "done" and evil["verdict"] == "unsafe" and evil["attempts"] == 1
    assert evil["error"] is None
    assert _metric(client, 'ckptguard_job_retries{queue="hub"}') == 1   # the job tier's count


def test_persistent_failure_is_recorded(make_client: MakeClient, hub: FakeHub,
                                        files_b: dict[str, bytes]) -> None:
    hub.storage.set_fault("status", status=404)
    hub.storage.fault_paths = {blob_path(files_b["pytorch_model.bin"])}
    client = make_client(hub_scan_attempts=2)
    deliver(client, payload(REV_B))
    doc = wait_done(client, REV_B)
    bad = by_path(doc)["pytorch_model.bin"]
    assert bad["state"] == "failed" and bad["attempts"] == 2 and "404" in bad["error"]
    assert doc["state"] == "failed" and doc["verdict"] == "invalid"   # never "safe" with a gap
    assert "1 file(s)" in doc["error"]


def test_unknown_revision_fails_the_job(make_client: MakeClient) -> None:
    client = make_client(hub_scan_attempts=2)
    deliver(client, payload("e5" * 20))
    doc = wait_done(client, "e5" * 20)
    assert doc["state"] == "failed" and "404" in doc["error"] and doc["files"] == []


def test_dataset_repository(make_client: MakeClient) -> None:
    client = make_client()
    assert deliver(client, payload(REV_A, kind="dataset")).status_code == 202
    doc = wait_done(client, REV_A, kind="datasets")
    assert doc["repo_type"] == "dataset" and by_path(doc)["data/shard.bin"]["verdict"] == "unsafe"


def test_reconcile_polls_the_head(make_client: MakeClient) -> None:
    client = make_client()
    r = client.post(f"/hub/models/{REPO}/reconcile?revision=main")
    assert r.status_code == 202 and r.json()["revisions"][0]["revision"] == REV_B
    assert wait_done(client, REV_B)["state"] == "done"
    again = client.post(f"/hub/models/{REPO}/reconcile").json()["revisions"][0]
    assert again["duplicate"] and not again["new_job"]
    assert client.post(f"/hub/models/{REPO}/reconcile?revision=nope").status_code == 502
    assert client.post(f"/hub/spaces/{REPO}/reconcile").status_code == 404


def test_lookups_and_auth(make_client: MakeClient) -> None:
    client = make_client(api_keys=["k" * 16])
    assert client.get(f"/hub/models/{REPO}/revisions/{REV_A}").status_code == 401
    auth = {"Authorization": "Bearer " + "k" * 16}
    assert client.get(f"/hub/models/{REPO}/revisions/{REV_A}", headers=auth).status_code == 404
    assert client.get(f"/hub/x/{REPO}/revisions/{REV_A}", headers=auth).status_code == 404
    assert deliver(client, payload(REV_A)).status_code == 202     # the webhook uses its own secret


def test_restart_resumes_unfinished_work(make_client: MakeClient, hub: FakeHub,
                                         files_a: dict[str, bytes]) -> None:
    slow = blob_path(files_a["pytorch_model.bin"])
    hub.storage.set_fault("stall", times=1, stall_seconds=3.0)
    hub.storage.fault_paths = {slow}
    first = make_client(hub_concurrency=1)
    deliver(first, payload(REV_A))
    while not any(e.path == slow for e in hub.storage.log):
        threading.Event().wait(0.05)
    doc = first.app.state.hub.db  # type: ignore[attr-defined]

    def file_jobs() -> dict[str, int]:
        with doc.engine.connect() as conn:
            return dict(conn.execute(sa.text(
                "SELECT status::text, count(*) FROM procrastinate_jobs WHERE task_name = 'hub.file' "
                "GROUP BY status")).all())

    def handed_back() -> bool:
        if doc.engine.dialect.name == "sqlite":
            return bool(doc.find_job("model", REPO, REV_A).state == "queued")
        states = file_jobs()
        return states.get("todo", 0) >= 1 and "doing" not in states

    # stop mid-job, the stalled read still holding the file: the stop hands the job back,
    # then waits for that read's thread, which the stall is released to end at once
    stopping = threading.Thread(target=first.__exit__, args=(None, None, None))
    stopping.start()
    try:
        deadline = time.monotonic() + 60
        while stopping.is_alive() and not handed_back() and time.monotonic() < deadline:
            threading.Event().wait(0.05)
    finally:
        hub.storage.release_stalls()
        stopping.join(60)
    assert not stopping.is_alive()
    job = doc.find_job("model", REPO, REV_A)
    if doc.engine.dialect.name == "sqlite":
        assert job.state == "queued"                       # handed back, not left to the lease
    else:   # procrastinate: the file's job is handed back (todo), none left running
        states = file_jobs()
        assert states.get("todo", 0) >= 1 and "doing" not in states, states
    done_before = {f.path: f.report_id for f in doc.files(job.id) if f.state == "done"}
    second = make_client()
    final = by_path(wait_done(second, REV_A))
    assert {p: (f["state"], f["verdict"]) for p, f in final.items()} == EXPECTED_A
    for path, report_id in done_before.items():            # finished files are not scanned again
        assert final[path]["report_id"] == report_id


class Receiver:
    """An HTTP endpoint for notifications: fails the first `fail` POSTs with 500; answers
    each `delay` seconds after it has read it."""

    def __init__(self, fail: int, delay: float = 0.0) -> None:
        self.fail = fail
        self.bodies: list[tuple[bytes, dict[str, str]]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.append((body, dict(self.headers)))
                status = 500 if len(receiver.bodies) <= receiver.fail else 204
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        serving_thread(self.httpd).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail=1)
    yield r
    r.httpd.shutdown()


def test_signed_notification_with_retry(make_client: MakeClient, receiver: Receiver) -> None:
    client = make_client(notify_url=receiver.url, notify_secret="n0tify")
    deliver(client, payload(REV_A))
    wait_done(client, REV_A)
    doc = wait_notified(client, REV_A)
    assert doc["notification"] == "sent" and len(receiver.bodies) == 2
    body, headers = receiver.bodies[-1]
    assert verify("n0tify", body, headers[SIGNATURE_HEADER])
    assert not verify("other", body, headers[SIGNATURE_HEADER])
    sent = json.loads(body)
    assert sent["revision"] == REV_A and sent["verdict"] == "unsafe" and sent["state"] == "done"
    assert len(sent["files"]) == len(EXPECTED_A)


def test_a_slow_notification_is_not_cut_off_with_the_run(make_client: MakeClient) -> None:
    """The revision's notification outlives the run that closed it: a send slower than the
    lease heartbeat was cancelled with that run (renewing a finished job fails), and the
    notification then waited out its claim, (retries + 1) x the attempt's limit, before the
    sweep sent it again."""
    slow = Receiver(fail=0, delay=2.5)
    try:
        client = make_client(notify_url=slow.url, hub_lease_seconds=3.0)   # a heartbeat a second
        deliver(client, payload(REV_A))
        wait_done(client, REV_A)
        doc = wait_notified(client, REV_A)
        assert doc["notification"] == "sent"
        assert len(slow.bodies) == 1   # sent once, not cut off and sent again
    finally:
        slow.httpd.shutdown()


def wait_notified(client: TestClient, sha: str) -> dict[str, Any]:
    """The revision once its notification is settled (sent or failed). The bound is generous:
    a retry waits out its backoff, and a loaded CI machine once took more than 10 s."""
    deadline = time.monotonic() + 60
    while True:
        doc: dict[str, Any] = client.get(f"/hub/models/{REPO}/revisions/{sha}").json()
        if doc["state"] in ("done", "failed") and doc["notification"] != "pending":
            return doc
        if time.monotonic() > deadline:
            raise AssertionError(doc)
        threading.Event().wait(0.05)


def test_failed_revision_is_notified_and_a_dead_receiver_recorded(make_client: MakeClient) -> None:
    dead = Receiver(fail=100)
    try:
        client = make_client(notify_url=dead.url, notify_retries=1, hub_scan_attempts=1)
        deliver(client, payload("e5" * 20))
        doc = wait_notified(client, "e5" * 20)
        assert doc["state"] == "failed" and doc["notification"] == "failed"
        assert len(dead.bodies) == 2                                   # 1 try + 1 retry
        assert json.loads(dead.bodies[0][0])["state"] == "failed"
        assert SIGNATURE_HEADER not in dead.bodies[0][1]                # no secret: unsigned
    finally:
        dead.httpd.shutdown()


def test_repository_without_namespace_is_queryable(make_client: MakeClient) -> None:
    """Legacy hub names such as `gpt2` have no namespace; their revisions are still served."""
    client = make_client(hub_scan_attempts=1)
    assert deliver(client, payload("b7" * 20, repo="gpt2")).status_code == 202
    doc = wait_done(client, "b7" * 20, repo="gpt2")
    assert doc["repo"] == "gpt2" and doc["state"] in ("done", "failed")
    traversal = client.get("/hub/model/a/../b/c/revisions/" + "b7" * 20)
    assert traversal.status_code == 404


def test_revisions_list_pages_newest_first_with_file_states(make_client: MakeClient) -> None:
    client = make_client()
    deliver(client, payload(REV_A))
    wait_done(client, REV_A)
    deliver(client, payload(REV_B))
    wait_done(client, REV_B)
    first = client.get("/hub/revisions", params={"limit": 1})
    assert first.status_code == 200, first.text
    [newest] = first.json()["items"]
    assert newest["revision"] == REV_B and first.json()["next_cursor"]
    second = client.get("/hub/revisions", params={"limit": 1, "cursor": first.json()["next_cursor"]})
    [older] = second.json()["items"]
    assert older["revision"] == REV_A and second.json()["next_cursor"] is None
    doc = client.get(f"/hub/model/{REPO}/revisions/{REV_A}").json()
    assert older["files"] == doc["files"] and older["file_count"] == len(doc["files"])
    states: dict[str, int] = {}
    for f in doc["files"]:
        states[f["state"]] = states.get(f["state"], 0) + 1
    assert older["file_states"] == states
    assert client.get("/hub/revisions", params={"state": "queued"}).json()["items"] == []
    assert len(client.get("/hub/revisions", params={"state": "done"}).json()["items"]) == 2
    bad = client.get("/hub/revisions", params={"cursor": "bm90IG91cnM"})
    assert bad.status_code == 400 and bad.json()["code"] == "BAD_CURSOR"
