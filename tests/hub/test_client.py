"""app/hub/client.py against the fake hub: listing, URL encoding, redirects, auth, sniffing."""

from __future__ import annotations

import pytest

from ckptguard.app.hub.client import HubClient, scan_remote_file
from ckptguard.core.errors import SourceError
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.state import ScanOptions
from tests.hub.checkpoints import REPO, REV_A, REV_B
from tests.hub.fakehub import FakeHub, sha256

GUARD = UrlGuard(allowlist=("127.0.0.1",))


def test_tree_pages_follow_link_header(hub: FakeHub, files_a: dict[str, bytes]) -> None:
    client = HubClient(hub.url)
    files = client.list_tree("model", REPO, REV_A)
    assert {f.path for f in files} == set(files_a)          # directories dropped, recursion kept
    assert sum("/tree/" in r.raw_path for r in hub.log) == -(-(len(files_a) + 1) // hub.page_size)
    first = next(r.raw_path for r in hub.log if "/tree/" in r.raw_path)
    assert first == f"/api/models/{REPO}/tree/{REV_A}?recursive=true&expand=true"
    lfs = {f.path: f.lfs_sha256 for f in files}
    assert lfs["pytorch_model.bin"] == sha256(files_a["pytorch_model.bin"])
    assert lfs["README.md"] is None                          # small text lives in git, not LFS


def test_revision_is_one_encoded_segment(hub: FakeHub) -> None:
    client = HubClient(hub.url)
    assert client.head_sha("model", REPO, "refs/pr/3") == REV_A
    assert client.head_sha("model", REPO, "main") == REV_B
    assert client.list_tree("model", REPO, "refs/pr/3")
    paths = [r.raw_path for r in hub.log]
    assert f"/api/models/{REPO}/revision/refs%2Fpr%2F3" in paths
    assert any(p.startswith(f"/api/models/{REPO}/tree/refs%2Fpr%2F3?") for p in paths)
    assert client.resolve_url("dataset", REPO, "refs/pr/3", "a b/c.bin") == \
        f"{hub.url}/datasets/{REPO}/resolve/refs%2Fpr%2F3/a%20b/c.bin"


def test_token_goes_to_the_hub(hub: FakeHub) -> None:
    hub.token = "hf_secret"
    with pytest.raises(SourceError, match="401"):
        HubClient(hub.url).list_tree("model", REPO, REV_A)
    assert HubClient(hub.url, token="hf_secret").list_tree("model", REPO, REV_A)


def test_next_page_on_another_host_is_refused(hub: FakeHub) -> None:
    client = HubClient(hub.url)
    assert client._next_link(hub.url + "/x", f'<{hub.url}/api/y?cursor=3>; rel="next"') == \
        f"{hub.url}/api/y?cursor=3"
    with pytest.raises(SourceError, match="another host"):
        client._next_link(hub.url + "/x", '<http://evil.example/api/y>; rel="next"')


def test_missing_revision_is_an_error(hub: FakeHub) -> None:
    with pytest.raises(SourceError, match="404"):
        HubClient(hub.url).list_tree("model", REPO, "f" * 40)


@pytest.mark.parametrize(("path", "container", "verdict"), [
    ("pytorch_model.bin", "zip", "safe"),
    ("evil.pt", "zip", "unsafe"),
    ("optimizer.bin", "pickle", "unsafe"),
    ("weights/model.safetensors", "safetensors", "safe"),
    ("stats.npy", "numpy", "safe"),
    ("README.md", "unknown", None),
])
def test_scan_through_the_redirect(hub: FakeHub, files_a: dict[str, bytes], path: str,
                                   container: str, verdict: str | None) -> None:
    client = HubClient(hub.url, token="hf_tok")
    url = client.resolve_url("model", REPO, REV_A, path)
    result = scan_remote_file(url, headers=client.auth_headers, guard=GUARD, options=ScanOptions(),
                              name=path, sha256="ab" * 32)
    assert result.container == container
    if verdict is None:
        assert result.report is None
    else:
        assert result.report is not None and result.report["verdict"] == verdict
        assert result.report["source"]["kind"] == "hub" and result.report["source"]["sha256"] == "ab" * 32
    hits = [r for r in hub.log if "/resolve/" in r.raw_path]
    assert hits and all(r.headers.get("Authorization") == "Bearer hf_tok" for r in hits)
    storage = [e for e in hub.storage.log if e.path == f"/blobs/{sha256(files_a[path])}"]
    assert storage and all(e.range for e in storage)                 # Range kept across the 302
    assert all("Authorization" not in e.headers for e in storage)    # never sent to storage
    assert all(e.headers.get("Accept-Encoding") == "identity" for e in storage)


def test_redirect_to_a_private_host_is_refused(hub: FakeHub) -> None:
    """The hub is allowed by name; its redirect to the storage's literal 127.0.0.1 is not."""
    url = HubClient(hub.url.replace("127.0.0.1", "localhost")).resolve_url("model", REPO, REV_A, "evil.pt")
    with pytest.raises(SourceError) as err:
        scan_remote_file(url, headers={}, guard=UrlGuard(allowlist=("localhost",)), options=ScanOptions(),
                         name="x", sha256=None)
    assert err.value.code == "SOURCE_URL_REFUSED"
    assert any("/resolve/" in r.raw_path for r in hub.log) and not hub.storage.log
