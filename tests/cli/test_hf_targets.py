"""`ckptguard scan hf://...` against a fake hub on 127.0.0.1: listing, revision pinning,
private repositories (HF_TOKEN, the token file), datasets, paths, LFS files over Range."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import EVIL, run
from tests.hub.fakehub import FakeHub, blob_path

pytestmark = pytest.mark.e2e

SHA_MAIN = "a" * 40
SHA_V1 = "b" * 40
TOKEN = "hf_private_token_123"


@pytest.fixture(scope="module")
def big_model() -> bytes:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({f"layer{i}.weight": torch.ones(512, 512) for i in range(4)}, buf)   # 4 MB: LFS
    return buf.getvalue()


@pytest.fixture
def hub(big_model: bytes) -> Iterator[FakeHub]:
    with FakeHub(page_size=2) as fake:
        fake.add("model", "acme/tiny", SHA_MAIN, {"pytorch_model.bin": big_model, "README.md": b"# tiny\n",
                                                  "sub/evil.pkl": EVIL}, refs=("main",))
        fake.add("model", "acme/tiny", SHA_V1, {"pytorch_model.bin": big_model, "README.md": b"# v1\n"},
                 refs=("v1",))
        fake.add("dataset", "acme/data", SHA_MAIN, {"shards/evil.bin": EVIL, "data.csv": b"a,b\n1,2\n"},
                 refs=("main",))
        yield fake


def _env(hub: FakeHub, tmp_path: Path, token: str | None = None) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": token or "",
            "HUGGING_FACE_HUB_TOKEN": "", "HF_TOKEN_PATH": str(tmp_path / "hf-home" / "token")}


def test_a_repository_is_listed_sniffed_and_read_over_range(hub: FakeHub, big_model: bytes,
                                                            tmp_path: Path) -> None:
    out = run("scan", "hf://acme/tiny", "--format", "jsonl", env=_env(hub, tmp_path))
    assert out.returncode == 2, out.stderr
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["source"]["name"], r["verdict"]) for r in reports] == [
        (f"hf://acme/tiny@{SHA_MAIN}/pytorch_model.bin", "safe"),
        (f"hf://acme/tiny@{SHA_MAIN}/sub/evil.pkl", "unsafe")]     # README.md sniffed and skipped
    assert reports[0]["source"]["kind"] == "hub" and len(reports[0]["tensors"]) == 4
    # the LFS file was read with Range requests, never downloaded whole
    reads = [e for e in hub.storage.log if e.path == blob_path(big_model) and e.method == "GET"]
    assert reads and all(e.range for e in reads)
    assert reports[0]["io"]["bytes_read"] < len(big_model)
    text = run("scan", "hf://acme/tiny", env=_env(hub, tmp_path)).stdout
    assert "1 skipped (not checkpoints)" in text


def test_a_revision_is_pinned_to_its_commit(hub: FakeHub, tmp_path: Path) -> None:
    out = run("scan", "hf://acme/tiny@v1", "--json", env=_env(hub, tmp_path))
    assert out.returncode == 0, out.stdout
    reports = json.loads(out.stdout)
    assert [r["source"]["name"] for r in reports] == [f"hf://acme/tiny@{SHA_V1}/pytorch_model.bin"]
    paths = [r.raw_path for r in hub.log]
    assert any(p.startswith("/api/models/acme/tiny/revision/v1") for p in paths)
    assert any(p.startswith(f"/api/models/acme/tiny/tree/{SHA_V1}") for p in paths)
    assert any(p.startswith(f"/acme/tiny/resolve/{SHA_V1}/") for p in paths)   # every file at that commit
    assert not any("/resolve/v1/" in p for p in paths)


def test_a_path_and_a_dataset(hub: FakeHub, tmp_path: Path) -> None:
    one = run("scan", "hf://acme/tiny/sub/evil.pkl", "--json", env=_env(hub, tmp_path))
    assert one.returncode == 2 and [r["verdict"] for r in json.loads(one.stdout)] == ["unsafe"]
    data = run("scan", "hf://datasets/acme/data@main", "--format", "jsonl", env=_env(hub, tmp_path))
    assert data.returncode == 2
    assert [json.loads(line)["source"]["name"] for line in data.stdout.splitlines()] == [
        f"hf://datasets/acme/data@{SHA_MAIN}/shards/evil.bin"]
    missing = run("scan", "hf://acme/tiny/nope.bin", "--json", env=_env(hub, tmp_path))
    assert missing.returncode == 4 and json.loads(missing.stdout)[0]["unreadable"] is True


def test_a_private_repository_needs_the_token(hub: FakeHub, tmp_path: Path) -> None:
    hub.token = TOKEN
    refused = run("scan", "hf://acme/tiny", "--json", env=_env(hub, tmp_path))
    assert refused.returncode == 4
    assert "401" in json.loads(refused.stdout)[0]["findings"][0]["message"]
    with_env = run("scan", "hf://acme/tiny", "-q", env=_env(hub, tmp_path, TOKEN))
    assert with_env.returncode == 2, with_env.stderr
    # the token file huggingface_hub writes (`huggingface-cli login`)
    (tmp_path / "hf-home").mkdir()
    (tmp_path / "hf-home" / "token").write_text(TOKEN + "\n")
    with_file = run("scan", "hf://acme/tiny", "-q", env=_env(hub, tmp_path))
    assert with_file.returncode == 2
    # the token goes to the hub, never to its storage host
    assert all("Authorization" not in e.headers and "authorization" not in e.headers
               for e in hub.storage.log)


def test_the_python_api_scans_a_repository(hub: FakeHub, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptguard import scan

    for name, value in _env(hub, tmp_path).items():
        monkeypatch.setenv(name, value)
    reports = scan("hf://acme/tiny")
    assert [(r.source.name, r.verdict) for r in reports] == [
        (f"hf://acme/tiny@{SHA_MAIN}/pytorch_model.bin", "safe"),
        (f"hf://acme/tiny@{SHA_MAIN}/sub/evil.pkl", "unsafe")]
