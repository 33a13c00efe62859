"""Malformed multipart bodies are a 400 BAD_MULTIPART, never a 500 and never a stored scan."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from ckptguard.app.main import create_app
from ckptguard.app.settings import Settings


def _client(tmp_path: Path) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path / "data", workers=1)),
                      raise_server_exceptions=False)


def _body(boundary: str, payload: bytes, *, close: bool) -> bytes:
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.pkl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return head + payload + (f"\r\n--{boundary}--\r\n".encode() if close else b"")


def test_a_long_boundary_is_a_400(tmp_path: Path) -> None:
    boundary = "b" * 300
    with _client(tmp_path) as client:
        r = client.post("/scan", content=_body(boundary, b"\x80\x04K\x01.", close=True),
                        headers={"content-type": f"multipart/form-data; boundary={boundary}"})
        assert r.status_code == 400 and r.json()["code"] == "BAD_MULTIPART", r.text


def test_a_body_without_its_closing_boundary_is_not_scanned(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        r = client.post("/scan", content=_body("xyz", b"\x80\x04K\x01.", close=False),
                        headers={"content-type": "multipart/form-data; boundary=xyz"})
        assert r.status_code == 400 and r.json()["code"] == "BAD_MULTIPART", r.text
        assert client.get("/scans").json()["items"] == []
        ok = client.post("/scan", content=_body("xyz", b"\x80\x04K\x01.", close=True),
                         headers={"content-type": "multipart/form-data; boundary=xyz"})
        assert ok.status_code == 200 and ok.json()["verdict"] == "safe"
