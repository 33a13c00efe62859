"""Hub revisions per second through the job tier, and recovery after a worker is killed (issue 19).

    python bench/hub_bench.py [--revisions 30] [--pg URL] [--latency 0.0]

A fake hub on 127.0.0.1 serves `--revisions` revisions of two small pickles each (unique
content: no report reuse) and a README. Each setup gets every revision by webhook once its
processes are up, and is timed from the first delivery to the last revision `done`:
- today's in-process runner: one `ckptguard serve` on SQLite;
- procrastinate: `ckptguard serve --api-only` on PostgreSQL plus one, then two, `ckptguard
  worker` subprocesses (each with one scan process and two jobs at once).
Then, with two workers, one is killed with SIGKILL mid-run: recovery is the time from the kill
to the first of its jobs queued again (heartbeat 1 s, stalled after 5 s, recovery task every
1 s: the figure is mostly `CKPTGUARD_QUEUE_STALLED_SECONDS`). `--pg` (default
CKPTGUARD_TEST_POSTGRES_URL) gets a private schema, dropped at the end. On a 2-core machine
expect contention, not scaling: every worker's scan process competes for the same cores.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.service_server import cli_process, free_port, postgres_schema
from tests.hub.fakehub import FakeHub, revision_files, sha_of

ROOT = Path(__file__).resolve().parent.parent
REPO = "bench/fleet"
SECRET = "bench-webhook-secret"


def wait(check, timeout: float = 300.0) -> None:   # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def done(http: httpx.Client) -> int:
    return len(http.get("/hub/revisions", params={"limit": 100, "state": "done"}).json()["items"])


def started(log: Path) -> bool:
    return log.exists() and "worker started" in log.read_text(errors="replace")


def run(hub: FakeHub, revisions: int, workdir: Path, *, database: dict[str, str], workers: int,
        kill: bool = False) -> tuple[float, float | None]:
    """Seconds from the first delivery to the last revision done; recovery seconds (kill)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CKPTGUARD_DATA_DIR": str(workdir),
           "CKPTGUARD_HOST": "127.0.0.1", "CKPTGUARD_PORT": str(port), "CKPTGUARD_WORKERS": "1",
           "CKPTGUARD_WORKER_CONCURRENCY": "2", "CKPTGUARD_HUB_ENDPOINT": hub.url,
           "CKPTGUARD_WEBHOOK_SECRET": SECRET, "CKPTGUARD_URL_ALLOWLIST": "127.0.0.1",
           "CKPTGUARD_LOG_LEVEL": "WARNING", "CKPTGUARD_QUEUE_HEARTBEAT_SECONDS": "1",
           "CKPTGUARD_QUEUE_STALLED_SECONDS": "5", "CKPTGUARD_QUEUE_RECOVER_SECONDS": "1", **database}
    workdir.mkdir(parents=True)
    with ExitStack() as stack:
        stack.enter_context(cli_process(["serve", "--api-only"] if workers else ["serve"], env,
                                    workdir / "api.log"))
        http = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30))
        wait(lambda: healthy(http), 120)
        env["CKPTGUARD_LOG_LEVEL"] = "INFO"   # "worker started" tells when a worker is ready
        procs = [stack.enter_context(cli_process(["worker"], env, workdir / f"worker-{i}.log"))
                 for i in range(workers)]
        wait(lambda: all(started(workdir / f"worker-{i}.log") for i in range(workers)), 120)
        began = time.perf_counter()
        for n in range(revisions):
            http.post("/webhooks/huggingface", headers={"X-Webhook-Secret": SECRET}, json={
                "event": {"action": "update", "scope": "repo.content"},
                "repo": {"type": "model", "name": REPO, "headSha": sha_of(n)},
                "updatedRefs": [{"ref": "refs/heads/main", "newSha": sha_of(n)}]})
        recovery = None
        if kill:
            wait(lambda: done(http) >= max(2, revisions // 6))
            procs[0].send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            engine = sa.create_engine(database["CKPTGUARD_DATABASE_URL"])
            stack.callback(engine.dispose)

            def recovered() -> bool:
                with engine.connect() as conn:
                    return bool(conn.execute(sa.text("SELECT count(*) FROM job_recoveries")).scalar())

            wait(recovered, 120)
            recovery = time.perf_counter() - killed
        wait(lambda: done(http) == revisions)
        return time.perf_counter() - began, recovery


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revisions", type=int, default=30)
    parser.add_argument("--pg", default=os.environ.get("CKPTGUARD_TEST_POSTGRES_URL"))
    parser.add_argument("--latency", type=float, default=0.0, help="seconds the storage waits per read")
    args = parser.parse_args()
    print(f"{args.revisions} revisions x 2 scanned files (+1 skipped), {os.cpu_count()} CPUs, "
          f"storage latency {args.latency:g} s/read")
    with tempfile.TemporaryDirectory() as tmp, FakeHub() as hub:
        for n in range(args.revisions):
            hub.add("model", REPO, sha_of(n), revision_files(n))
        if args.latency:
            hub.storage.set_fault("stall", stall_seconds=args.latency)
        setups: list[tuple[str, dict[str, str] | None, int, bool]] = [
            ("in-process runner, SQLite (today)", {}, 0, False),
            ("procrastinate, 1 worker", None, 1, False),
            ("procrastinate, 2 workers", None, 2, False),
            ("procrastinate, 2 workers, one killed", None, 2, True)]
        for i, (name, database, workers, kill) in enumerate(setups):
            if database is None:
                if not args.pg:
                    print(f"{name:40s} skipped (no --pg)")
                    continue
                with postgres_schema(args.pg) as url:
                    seconds, recovery = run(hub, args.revisions, Path(tmp) / str(i), workers=workers,
                                            kill=kill, database={"CKPTGUARD_DATABASE_URL": url})
            else:
                seconds, recovery = run(hub, args.revisions, Path(tmp) / str(i), workers=workers,
                                        database=database)
            extra = f"   recovery after SIGKILL {recovery:5.1f} s" if recovery is not None else ""
            print(f"{name:40s} {args.revisions / seconds:6.2f} revisions/s  ({seconds:5.1f} s){extra}")


if __name__ == "__main__":
    main()
