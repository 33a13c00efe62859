"""A server killed mid-scan takes its workers with it: none keeps scanning for nobody."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.service_server import running_server

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_workers_die_with_a_killed_server(tmp_path: Path) -> None:
    with running_server(tmp_path / "d", CKPTGUARD_WORKERS="1", CKPTGUARD_TEST_HOOKS="true") as server:
        def busy() -> None:   # the worker sleeps in its scan (test hook) until killed
            try:
                httpx.post(f"{server.url}/scan", headers={"X-Ckptguard-Test-Hook": "sleep"},
                           files={"file": ("a.pkl", b"\x80\x04K\x07.", "x/y")}, timeout=30)
            except httpx.HTTPError:
                pass

        threading.Thread(target=busy, daemon=True).start()
        time.sleep(1.5)
        children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
        workers = [int(p) for p in children.read_text().split()
                   if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert workers
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers)
