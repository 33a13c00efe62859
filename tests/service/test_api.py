"""POST /scan, GET /scans, problem+json, auth, metrics: through the ASGI app."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.service.conftest import codes, upload
from tests.service.payloads import (
    benign_pickle,
    malformed_pickle,
    malicious_pickle,
    nonce,
    torch_checkpoint,
)

PROBLEM = "application/problem+json"


def test_benign_torch_checkpoint_is_safe_with_manifest(client) -> None:
    data = torch_checkpoint(nonce())
    r = upload(client, data, name="model.pt")
    assert r.status_code == 200
    body = r.json()
    assert body["verdict"] == "safe" and body["format"] == "torch-zip"
    assert body["cached"] is False and len(body["id"]) == 32
    assert body["source"] == {"kind": "upload", "name": "model.pt", "url": None, "size": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()}
    assert sorted(t["name"] for t in body["tensors"]) == ["b", "w"]
    assert body["scanner"]["policy"] == "torch-2.13-weights-only"


def test_malicious_pickle_is_200_unsafe(client) -> None:
    r = upload(client, malicious_pickle(nonce()), name="evil.pkl")
    assert r.status_code == 200
    assert r.json()["verdict"] == "unsafe"
    assert "PICKLE_DANGEROUS_GLOBAL" in codes(r.json())
    assert any(g["module"] == "os" and g["status"] == "dangerous" for g in r.json()["globals"])


def test_malformed_is_200_invalid(client) -> None:
    r = upload(client, malformed_pickle(nonce()))
    assert r.status_code == 200
    assert r.json()["verdict"] == "invalid"


def test_filename_is_metadata_only(client, tmp_path: Path) -> None:
    target = f"ckptguard-{nonce()}.pkl"
    r = upload(client, benign_pickle(nonce()), name=f"../../../../tmp/{target}")
    assert r.json()["source"]["name"] == target
    assert not (Path("/tmp") / target).exists()
    assert list((tmp_path / "data" / "uploads").iterdir()) == []   # temp file removed


def test_oversize_is_413_problem_and_leaves_no_file(make_client, tmp_path: Path) -> None:
    client = make_client(max_upload_bytes=1000)
    r = upload(client, b"\0" * 1001)
    assert r.status_code == 413
    assert r.headers["content-type"] == PROBLEM
    assert r.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert list((tmp_path / "data" / "uploads").iterdir()) == []
    assert upload(client, benign_pickle(nonce())).status_code == 200     # under the cap: fine


def test_oversize_detected_while_streaming_without_content_length(make_client) -> None:
    client = make_client(max_upload_bytes=100_000)
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n"
            "\r\n").encode()

    def body():
        yield head
        for _ in range(50):
            yield b"\0" * 10_000
        yield f"\r\n--{boundary}--\r\n".encode()

    r = client.post("/scan", content=body(),
                    headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413 and r.json()["code"] == "PAYLOAD_TOO_LARGE"


def test_cache_hit_shares_the_analysis_and_returns_the_callers_own_record(client) -> None:
    data = malicious_pickle(nonce())
    first = upload(client, data, name="first-name.pkl").json()
    second = upload(client, data, name="other-name.pkl").json()
    assert first["cached"] is False and second["cached"] is True
    # the caller's own record: a new id, its file name; never the first uploader's
    assert second["id"] != first["id"]
    assert second["source"]["name"] == "other-name.pkl"
    assert "first-name" not in client.get(f"/scans/{second['id']}").text
    strip = ("cached", "id", "created_at", "source")
    assert {k: v for k, v in first.items() if k not in strip} == \
           {k: v for k, v in second.items() if k not in strip}
    assert first["source"]["sha256"] == second["source"]["sha256"]
    metrics = client.get("/metrics").text
    assert 'ckptguard_scans_total{cached="true",format="pickle",verdict="unsafe"} 1.0' in metrics
    assert 'ckptguard_scans_total{cached="false",format="pickle",verdict="unsafe"} 1.0' in metrics


def test_extra_allowed_globals_are_part_of_the_cache_key(tmp_path: Path, make_client) -> None:
    data = malicious_pickle(nonce())
    a = upload(make_client(), data).json()
    b = upload(make_client(allow_globals="collections.OrderedDict"), data).json()
    assert a["cached"] is False and b["cached"] is False and a["id"] != b["id"]


def test_get_scan_by_id_and_404(client) -> None:
    answer = upload(client, benign_pickle(nonce()))
    posted = answer.json()
    got = client.get(f"/scans/{posted['id']}")
    assert got.status_code == 200
    assert got.content == answer.content      # streamed from the store: the very same bytes
    for bad in ("0" * 32, "not-an-id", "../etc"):
        r = client.get(f"/scans/{bad}")
        assert r.status_code == 404 and r.headers["content-type"] == PROBLEM


def test_list_filters_and_paginates(client) -> None:
    ids = {"safe": [], "unsafe": []}
    for i in range(3):
        ids["safe"].append(upload(client, benign_pickle(f"{i}-{nonce()}")).json()["id"])
        ids["unsafe"].append(upload(client, malicious_pickle(f"{i}-{nonce()}")).json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/scans", params=params).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids["safe"] + ids["unsafe"]) and len(seen) == 6
    unsafe = client.get("/scans", params={"verdict": "unsafe"}).json()["items"]
    assert sorted(i["id"] for i in unsafe) == sorted(ids["unsafe"])
    one = client.get(f"/scans/{ids['safe'][0]}").json()
    by_sha = client.get("/scans", params={"sha256": one["source"]["sha256"].upper()}).json()
    assert [i["id"] for i in by_sha["items"]] == [one["id"]]


@pytest.mark.parametrize("params,code", [
    ({"limit": 0}, "VALIDATION_ERROR"), ({"verdict": "evil"}, "VALIDATION_ERROR"),
    ({"sha256": "xyz"}, "VALIDATION_ERROR"), ({"cursor": "!!notacursor"}, "BAD_CURSOR"),
])
def test_list_rejects_bad_queries_as_problems(client, params, code) -> None:
    r = client.get("/scans", params=params)
    assert r.status_code in (400, 422)
    assert r.headers["content-type"] == PROBLEM and r.json()["code"] == code


def test_request_problems(client) -> None:
    r = client.post("/scan", content=b"raw", headers={"content-type": "application/octet-stream"})
    assert (r.status_code, r.json()["code"]) == (415, "UNSUPPORTED_MEDIA_TYPE")
    r = client.post("/scan", files={"other": ("x", b"abc")})
    assert (r.status_code, r.json()["code"]) == (422, "MISSING_FILE")
    r = client.post("/scan", content=b"--x\r\ngarbage",
                    headers={"content-type": "multipart/form-data; boundary=y"})
    assert r.status_code in (400, 422) and r.headers["content-type"] == PROBLEM
    r = client.get("/nope")
    assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")
    r = client.delete("/scans")
    assert (r.status_code, r.json()["code"]) == (405, "METHOD_NOT_ALLOWED")


def test_internal_errors_hide_the_trace(client, monkeypatch) -> None:
    def boom(*a, **k):
        raise RuntimeError("secret internals /etc/shadow")

    monkeypatch.setattr(client.app.state.store, "save", boom)
    r = upload(client, benign_pickle(nonce()))
    assert r.status_code == 500 and r.headers["content-type"] == PROBLEM
    assert r.json()["code"] == "INTERNAL_ERROR"
    assert "secret" not in r.text and "Traceback" not in r.text


def test_api_keys(make_client) -> None:
    key = "k" * 32
    client = make_client(api_keys=f"{'o' * 20},{key}")
    data = benign_pickle(nonce())
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {key}"},
                    {"authorization": f"Bearer {key}x"}):
        r = upload(client, data, headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
        assert r.headers["www-authenticate"] == "Bearer"
    assert client.get("/scans").status_code == 401
    assert client.get("/metrics").status_code == 401
    assert client.get("/healthz").status_code == 200        # liveness stays open
    auth = {"authorization": f"Bearer {key}"}
    assert upload(client, data, headers=auth).json()["verdict"] == "safe"
    assert client.get("/scans", headers=auth).status_code == 200


def test_short_api_keys_are_refused() -> None:
    from pydantic import ValidationError

    from ckptguard.app.settings import Settings

    with pytest.raises(ValidationError):
        Settings(api_keys="short")


def test_health_and_metrics(client) -> None:
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["workers"] == 2
    upload(client, benign_pickle(nonce()))
    text = client.get("/metrics").text
    for name in ("ckptguard_scans_total", "ckptguard_scan_duration_seconds_bucket",
                 "ckptguard_scan_bytes_read_total", "ckptguard_queue_depth",
                 "ckptguard_workers_busy", "ckptguard_upload_bytes_total"):
        assert name in text, name
    assert 'ckptguard_scans_total{cached="false",format="pickle",verdict="safe"} 1.0' in text


def test_body_limit_on_json_routes(make_client) -> None:
    client = make_client(max_body_bytes=100)
    r = client.post("/scans", content=b"x" * 1000, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "PAYLOAD_TOO_LARGE"
