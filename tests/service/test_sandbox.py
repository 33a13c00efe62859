"""Sandboxed workers: limits, timeouts and crashes become `invalid` reports; the pool heals."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

from ckptguard.app.jobs import Jobs
from ckptguard.app.worker import WorkerLimits
from ckptguard.core.errors import Code, SourceError
from tests.service.conftest import codes, stream_upload, upload
from tests.service.payloads import benign_pickle, big_pickle_chunks, malicious_pickle, nonce

HOOK = "x-ckptguard-test-hook"


def restarts(client, reason: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'ckptguard_worker_restarts_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("hook,code", [("crash", "WORKER_CRASHED"), ("oom", "RESOURCE_LIMIT")])
def test_hook_failure_is_invalid_then_pool_recovers(make_client, hook, code) -> None:
    client = make_client(test_hooks=True, worker_memory_mb=512)
    data = benign_pickle(nonce())
    r = upload(client, data, headers={HOOK: hook})
    assert r.status_code == 200
    body = r.json()
    assert body["verdict"] == "invalid" and codes(body) == [code]
    assert body["source"]["sha256"] and body["scanner"]["version"]
    assert restarts(client, code) == 1
    # Failures are stored but never served from the cache: the same bytes scan again.
    again = upload(client, data)
    assert again.json()["cached"] is False and again.json()["verdict"] == "safe"
    assert client.get(f"/scans/{body['id']}").json()["verdict"] == "invalid"
    # Every worker still answers.
    for _ in range(4):
        assert upload(client, malicious_pickle(nonce())).json()["verdict"] == "unsafe"


def test_wall_clock_timeout(make_client) -> None:
    # 3 s, not 1: the scan after the timeout runs on a freshly spawned worker, and on a loaded
    # machine booting it and scanning can take over a second (the sleep hook sleeps an hour)
    client = make_client(test_hooks=True, scan_timeout_seconds=3.0)
    r = upload(client, benign_pickle(nonce()), headers={HOOK: "sleep"})
    assert r.json()["verdict"] == "invalid" and codes(r.json()) == ["TIMEOUT"]
    assert restarts(client, "TIMEOUT") == 1
    assert upload(client, benign_pickle(nonce())).json()["verdict"] == "safe"


@pytest.mark.slow
def test_cpu_limit(make_client) -> None:
    client = make_client(test_hooks=True, worker_cpu_seconds=1, scan_timeout_seconds=120)
    r = upload(client, benign_pickle(nonce()), headers={HOOK: "cpu"})
    assert codes(r.json()) == ["RESOURCE_LIMIT"]
    assert "CPU" in r.json()["findings"][0]["message"]
    assert upload(client, benign_pickle(nonce())).json()["verdict"] == "safe"


def test_hooks_ignored_unless_enabled(client) -> None:
    r = upload(client, benign_pickle(nonce()), headers={HOOK: "crash"})
    assert r.json()["verdict"] == "safe"


@pytest.mark.slow
def test_crafted_input_blows_the_memory_limit(make_client) -> None:
    """No hook: a 300 MB pickle cannot even be read by a worker capped at 256 MB."""
    client = make_client(worker_memory_mb=256)
    r = stream_upload(client, big_pickle_chunks(300 * 1024 * 1024), name="huge.pkl")
    assert r.status_code == 200
    assert r.json()["verdict"] == "invalid"
    assert "RESOURCE_LIMIT" in codes(r.json())
    assert upload(client, malicious_pickle(nonce())).json()["verdict"] == "unsafe"


def test_other_requests_unaffected_by_a_crash(make_client) -> None:
    client = make_client(test_hooks=True, workers=2, scan_timeout_seconds=30)
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(8) as pool:
        bad = pool.submit(upload, client, benign_pickle(nonce()), headers={HOOK: "crash"})
        goods = [pool.submit(upload, client, malicious_pickle(nonce())) for _ in range(12)]
        assert codes(bad.result().json()) == ["WORKER_CRASHED"]
        assert [g.result().json()["verdict"] for g in goods] == ["unsafe"] * 12


def test_ckpt_error_crosses_the_process_boundary(tmp_path: Path) -> None:
    async def run() -> None:
        jobs = Jobs(1, WorkerLimits(memory_bytes=1 << 30, cpu_seconds=30), timeout_s=60)
        await jobs.start()
        try:
            with pytest.raises(SourceError) as info:
                await jobs.scan(str(tmp_path / "missing.pt"), {"kind": "file"})
            assert info.value.code is Code.SOURCE_IO and info.value.message
            good = tmp_path / "ok.pkl"
            good.write_bytes(pickle.dumps([1, 2], protocol=2))
            outcome = await jobs.scan(str(good), {"kind": "file", "name": "ok.pkl"})
            assert outcome.failure is None and outcome.report["verdict"] == "safe"
        finally:
            await jobs.close()

    asyncio.run(run())


def test_worker_recycled_after_max_scans(make_client) -> None:
    client = make_client(workers=1, worker_max_scans=2)
    for _ in range(5):
        assert upload(client, benign_pickle(nonce())).json()["verdict"] == "safe"
    assert restarts(client, "recycled") == 2


async def _one_worker(max_queued: int | None) -> Jobs:
    """A started pool of one worker with the test hooks and a 2 s scan timeout."""
    jobs = Jobs(1, WorkerLimits(memory_bytes=1 << 30, cpu_seconds=30, test_hooks=True),
                timeout_s=2, max_queued=max_queued)
    await jobs.start()
    return jobs


def _ok_pickle(tmp_path: Path) -> Path:
    path = tmp_path / "ok.pkl"
    path.write_bytes(pickle.dumps([1], protocol=2))
    return path


def test_cancelled_caller_does_not_leak_the_worker(tmp_path: Path) -> None:
    """A request cancelled mid-scan (client gone) must give its worker back to the pool."""
    async def run() -> None:
        jobs = await _one_worker(max_queued=None)
        try:
            path = _ok_pickle(tmp_path)
            task = asyncio.create_task(jobs.scan(str(path), {"kind": "file"}, hook="sleep"))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            outcome = await asyncio.wait_for(jobs.scan(str(path), {"kind": "file"}), 60)
            assert outcome.report["verdict"] == "safe"
        finally:
            await jobs.close()

    asyncio.run(run())


def test_full_queue_refuses_uploads_with_503_then_recovers(make_client) -> None:
    """max_queued_scans=0 and one busy worker: the next upload is refused before its body
    is read, with Retry-After; once the worker is free, uploads scan again."""
    import concurrent.futures as cf
    import time

    client = make_client(test_hooks=True, workers=1, max_queued_scans=0, scan_timeout_seconds=3)
    with cf.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(upload, client, benign_pickle(nonce()), headers={HOOK: "sleep"})
        deadline = time.monotonic() + 30
        while "ckptguard_workers_busy 1.0" not in client.get("/metrics").text:
            assert time.monotonic() < deadline and not slow.done()
            time.sleep(0.05)
        refused = upload(client, benign_pickle(nonce()))
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "SCAN_QUEUE_FULL"
        assert codes(slow.result().json()) == ["TIMEOUT"]
    assert "ckptguard_scans_rejected_total 1.0" in client.get("/metrics").text
    assert upload(client, benign_pickle(nonce())).json()["verdict"] == "safe"


def test_pool_refuses_only_callers_that_may_not_wait(tmp_path: Path) -> None:
    from ckptguard.app.jobs import PoolFull

    async def run() -> None:
        jobs = await _one_worker(max_queued=0)
        try:
            path = _ok_pickle(tmp_path)
            busy = asyncio.create_task(jobs.scan(str(path), {"kind": "file"}, hook="sleep"))
            await asyncio.sleep(0.3)
            assert jobs.full()
            with pytest.raises(PoolFull):
                await jobs.scan(str(path), {"kind": "file"}, wait=False)
            waited = await asyncio.wait_for(jobs.scan(str(path), {"kind": "file"}), 60)
            assert waited.report["verdict"] == "safe"     # queued behind the timed-out scan
            assert (await busy).failure is Code.TIMEOUT
            assert not jobs.full()
        finally:
            await jobs.close()

    asyncio.run(run())
