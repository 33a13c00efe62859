"""app/hub/db.py's state machine and app/hub/jobs.py's lease handling, on a real SQLite store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptguard.app.hub.client import FileScan, TreeFile
from ckptguard.app.hub.db import HubDb, worst
from ckptguard.app.hub.jobs import HubRunner
from ckptguard.app.settings import Settings
from ckptguard.app.store import Store
from ckptguard.app.tables import hub_jobs
from tests.hub.fakehub import FakeHub

SHA = "ab" * 20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield s
    s.close()


def test_deliveries_dedup_and_one_job_per_revision(store: Store) -> None:
    db = HubDb(store.engine)
    first = db.deliver("model", "a/b", "refs/heads/main", SHA)
    assert first.new_job and not first.duplicate
    again = db.deliver("model", "a/b", "refs/heads/main", SHA)
    assert again.duplicate and not again.new_job and again.job_id == first.job_id
    tag = db.deliver("model", "a/b", "refs/tags/v1", SHA)
    assert not tag.duplicate and not tag.new_job and tag.job_id == first.job_id
    other = db.deliver("dataset", "a/b", "refs/heads/main", SHA)
    assert other.new_job and other.job_id != first.job_id


def test_claim_lease_renew_release(store: Store) -> None:
    db = HubDb(store.engine)
    job = db.deliver("model", "a/b", "refs/heads/main", SHA).job_id
    assert [j for j, _ in db.runnable()] == [job]
    assert db.claim(job, "A", 60)
    assert not db.claim(job, "B", 60)                  # A holds a live lease
    assert db.runnable() == []
    assert db.renew(job, "A", -1)                      # A's lease now expired (A died)
    assert [j for j, _ in db.runnable()] == [job]
    assert db.claim(job, "B", 60)                      # taken over
    assert not db.renew(job, "A", 60)                  # A learns it lost the job
    assert db.release("A") == 0 and db.release("B") == 1
    assert db.job(job).state == "queued"


def test_retry_time_is_respected(store: Store) -> None:
    db = HubDb(store.engine)
    job = db.deliver("model", "a/b", "refs/heads/main", SHA).job_id
    assert db.claim(job, "A", 60)
    later = time.time() + 3600
    db.list_failed(job, "SOURCE_HTTP: 502", final=False, retry_at=later)
    assert db.runnable() == [(job, later)] and not db.claim(job, "A", 60)
    db.list_failed(job, "SOURCE_HTTP: 502", final=True)
    row = db.job(job)
    assert row.state == "failed" and row.attempts == 2 and row.verdict == "invalid"


def test_finish_takes_the_worst_and_never_says_safe_with_a_gap(store: Store) -> None:
    db = HubDb(store.engine)
    job = db.deliver("model", "a/b", "refs/heads/main", SHA).job_id
    db.add_files(job, [TreeFile("a.pt", 100), TreeFile("b.pt", 100), TreeFile("t", 3)], 8)
    rows = {f.path: f for f in db.files(job)}
    assert rows["t"].state == "skipped" and "too small" in rows["t"].error
    db.file_state(rows["a.pt"].id, state="done", verdict="safe")
    db.file_state(rows["b.pt"].id, state="done", verdict="suspicious")
    assert db.finish(job, notify=False) == "done" and db.job(job).verdict == "suspicious"
    db.file_state(rows["b.pt"].id, state="failed", verdict=None, error="x")
    assert db.finish(job, notify=True) == "failed"
    row = db.job(job)
    assert row.verdict == "invalid" and row.notify_state == "pending" and db.unnotified() == [job]


def test_worst() -> None:
    assert worst([]) is None
    assert worst(["safe", "suspicious"]) == "suspicious"
    assert worst(["unsafe", "invalid", "safe"]) == "unsafe"
    assert worst(["safe", None]) == "invalid"


def test_a_runner_that_loses_its_lease_stops(store: Store, tmp_path: Path) -> None:
    """Another replica took the job over: the first runner must stop, not scan on."""
    started = []

    def slow_scan(url: str, **kw: Any) -> FileScan:
        started.append(url)
        time.sleep(1.5)
        return FileScan("pickle", None)

    with FakeHub() as hub:
        hub.add("model", "a/b", SHA, {"m.pt": b"\x80\x02" + b"x" * 100})
        settings = Settings(data_dir=tmp_path, hub_endpoint=hub.url, hub_lease_seconds=0.3)
        runner = HubRunner(settings, store, scan_fn=slow_scan)
        job = runner.db.deliver("model", "a/b", "refs/heads/main", SHA).job_id

        async def scenario() -> None:
            run = asyncio.create_task(runner.run(job))
            while not started:
                await asyncio.sleep(0.02)
            with store.engine.begin() as conn:   # replica B steals the (renewable) lease
                conn.execute(hub_jobs.update().values(lease_owner="B", lease_until=time.time() + 60))
            await asyncio.wait_for(run, 5)

        asyncio.run(scenario())
        row = runner.db.job(job)
        assert row.lease_owner == "B" and row.state == "running"   # untouched by the loser
        assert runner.db.files(job)[0].state == "running"          # the loser recorded nothing
        runner.client.close()


def test_concurrent_deliveries_make_one_job(store: Store) -> None:
    from concurrent.futures import ThreadPoolExecutor

    db = HubDb(store.engine)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: db.deliver("model", "a/b", "refs/heads/main", SHA), range(16)))
    assert len({r.job_id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1 and sum(r.new_job for r in results) == 1
