"""Spool files left by a killed server are swept while the service runs, not only at start."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastapi.testclient import TestClient

from ckptguard.app.main import create_app
from ckptguard.app.settings import Settings


def test_stale_spool_files_are_swept_periodically(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", workers=1, upload_sweep_seconds=0.2)
    with TestClient(create_app(settings), raise_server_exceptions=False):
        spool = settings.resolved_upload_dir
        spool.mkdir(parents=True, exist_ok=True)   # made by the first upload
        stale, fresh = spool / "upload-stale.bin", spool / "upload-fresh.bin"
        stale.write_bytes(b"x")
        fresh.write_bytes(b"y")
        two_hours_ago = time.time() - 7200
        os.utime(stale, (two_hours_ago, two_hours_ago))
        deadline = time.monotonic() + 10
        while stale.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not stale.exists()
        assert fresh.exists()        # an upload in progress keeps its file
