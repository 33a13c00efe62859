"""Start the real service (`python -m ckptguard.app`, uvicorn) on 127.0.0.1:<free port> for e2e tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


@contextmanager
def running_server(data_dir: Path, **env: str) -> Iterator[Server]:
    """The service as a subprocess; SIGTERM on exit (graceful, like a real stop)."""
    port = free_port()
    full = {**os.environ, "CKPTGUARD_HOST": "127.0.0.1", "CKPTGUARD_PORT": str(port),
            "CKPTGUARD_DATA_DIR": str(data_dir), "CKPTGUARD_WORKERS": "2",
            "PYTHONPATH": str(ROOT), **env}
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / f"server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "ckptguard.app"], cwd=ROOT, env=full,
                                   stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield server
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a graceful stop, as an operator's), SIGKILL if it is not gone in 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def cli_process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`ckptguard ARGS` as a subprocess, its output in `log`; stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ckptguard.app.cli", *args], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop(proc)


# CI's PostgreSQL (.ci/run starts it and sets this); unset on a developer's machine
PG_URL = os.environ.get("CKPTGUARD_TEST_POSTGRES_URL")


@contextmanager
def private_postgres() -> Iterator[str]:
    """A private schema in CI's PostgreSQL (postgres_schema): skips on a developer's machine
    without CKPTGUARD_TEST_POSTGRES_URL, fails under CI=true (tests.components.missing)."""
    from tests.components import missing

    if not PG_URL:
        missing("CKPTGUARD_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)")
    with postgres_schema(PG_URL) as url:
        yield url


@contextmanager
def postgres_schema(base_url: str) -> Iterator[str]:
    """A private schema in the test database; the URL selects it via search_path."""
    schema = f"e2e_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
