"""Fixtures for the service tests: an app on a temp data dir, driven by TestClient."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ckptguard.app.main import create_app
from ckptguard.app.settings import Settings

MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[MakeClient]:
    """`make_client(**settings)` -> a started TestClient (lifespan run) on `tmp_path`."""
    with ExitStack() as stack:
        def make(**overrides: Any) -> TestClient:
            overrides.setdefault("data_dir", tmp_path / "data")
            overrides.setdefault("workers", 2)
            app = create_app(Settings(**overrides))
            return stack.enter_context(TestClient(app, raise_server_exceptions=False))

        yield make


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    return make_client()


def upload(client: TestClient, data: bytes, name: str = "model.pt", **kwargs: Any) -> Any:
    return client.post("/scan", files={"file": (name, data, "application/octet-stream")}, **kwargs)


def stream_upload(client: TestClient, chunks: Iterable[bytes], name: str = "model.pt",
                  **kwargs: Any) -> Any:
    """A multipart upload whose body is generated chunk by chunk (never held in memory)."""
    yield_from = multipart_chunks(chunks, name)
    return client.post("/scan", content=yield_from,
                       headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"}, **kwargs)


BOUNDARY = "ckptguard-test-boundary-7d1f"


def multipart_chunks(chunks: Iterable[bytes], name: str) -> Iterator[bytes]:
    yield (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
           "Content-Type: application/octet-stream\r\n\r\n").encode()
    yield from chunks
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]
