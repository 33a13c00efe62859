"""A scan's verdict must not depend on the scans before it: a worker whose resident memory
grew in one scan by more than `worker_recycle_mb` (a large pickle leaves CPython's allocator
holding what it grew) is replaced before the next job, so the next file gets the whole
memory limit again. The report of the scan that grew stands (it did not fail)."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

from fastapi.testclient import TestClient

from ckptguard.app.main import create_app
from ckptguard.app.settings import Settings


def _restarts(client: TestClient, reason: str) -> float:
    text = client.get("/metrics").text
    found = re.findall(rf'^ckptguard_worker_restarts_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    return float(found[0]) if found else 0.0


def _scan(client: TestClient, data: bytes) -> dict[str, object]:
    r = client.post("/scan", files={"file": ("a.pkl", data, "application/octet-stream")})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_worker_that_grew_is_replaced_and_its_report_stands(tmp_path: Path) -> None:
    # a list of 200,000 ints: judging it builds millions of bytes of Python objects, so with
    # a 1 MiB threshold every such scan is the worker's last
    app = create_app(Settings(data_dir=tmp_path / "data", workers=1, worker_recycle_mb=1))
    with TestClient(app, raise_server_exceptions=False) as client:
        first = _scan(client, pickle.dumps(list(range(200_000)), protocol=2))
        assert first["verdict"] == "safe" and not first.get("cached")
        assert _restarts(client, "memory_growth") == 1
        assert _restarts(client, "RESOURCE_LIMIT") == 0     # grown is not failed
        second = _scan(client, pickle.dumps(list(range(200_001)), protocol=2))
        assert second["verdict"] == "safe"
        assert _restarts(client, "memory_growth") == 2


def test_a_worker_that_did_not_grow_is_kept(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", workers=1))   # 256 MiB default
    with TestClient(app, raise_server_exceptions=False) as client:
        for value in range(3):
            assert _scan(client, b"\x80\x04K%c." % value)["verdict"] == "safe"
        assert _restarts(client, "memory_growth") == 0
