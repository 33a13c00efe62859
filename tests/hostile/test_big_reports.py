"""Large reports against a real uvicorn (issue 15): a checkpoint of 50,000 tensor views
(2 MB file, 13 MB report). Lists carry summaries, never a manifest; the report streams
while /healthz keeps answering; the tensor endpoint pages it; a cache hit stores no copy;
DELETE and retention remove what no scan references. Tight figures: bench/service_bench.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from ckptguard.app.tables import analyses, manifest_chunks, scans, tensor_keys
from tests.builders.many_views import STORAGES, many_views_checkpoint, view_name
from tests.e2e.service_server import Server, running_server
from tests.service.payloads import benign_pickle, nonce

pytestmark = pytest.mark.e2e

VIEWS = 50_000
HEALTH_BOUND_S = 2.0      # generous: a report encoded on the event loop stalled it for seconds
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("big")


@pytest.fixture(scope="module")
def server(data_dir: Path) -> Iterator[Server]:
    with running_server(data_dir, CKPTGUARD_WORKERS="2") as srv:
        yield srv


@pytest.fixture(scope="module")
def checkpoint() -> bytes:
    return many_views_checkpoint(VIEWS)


@pytest.fixture(scope="module")
def first(server: Server, checkpoint: bytes) -> httpx.Response:
    r = httpx.post(f"{server.url}/scan", files={"file": ("views.pt", checkpoint)}, timeout=600)
    assert r.status_code == 200, r.text[:500]
    return r


@pytest.fixture(scope="module")
def report(first: httpx.Response) -> dict[str, Any]:
    """`first`'s body, parsed once for the module: each parse of its 13 MB takes about a second."""
    doc: dict[str, Any] = first.json()
    assert doc["verdict"] == "safe" and len(doc["tensors"]) == VIEWS
    return doc


def _db(data_dir: Path) -> sa.Engine:
    return sa.create_engine(f"sqlite:///{data_dir / 'ckptguard.db'}")


def _counts(data_dir: Path) -> dict[str, int]:
    engine = _db(data_dir)
    try:
        with engine.connect() as conn:
            return {t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
                    for t in (scans, analyses, manifest_chunks, tensor_keys)}
    finally:
        engine.dispose()


class HealthProbe:
    """/healthz in a loop on its own connection while something else runs; the slowest answer."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.slowest = 0.0
        self.count = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            while not self._done.is_set():
                t0 = time.monotonic()
                assert client.get("/healthz").status_code == 200
                self.slowest = max(self.slowest, time.monotonic() - t0)
                self.count += 1
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


def test_the_report_is_stored_and_served_as_it_was_answered(server: Server, first: httpx.Response,
                                                            report: dict[str, Any]) -> None:
    scan_id = report["id"]
    with HealthProbe(server) as probe, \
            httpx.stream("GET", f"{server.url}/scans/{scan_id}", timeout=600) as r:
        assert r.headers["content-type"] == "application/json"
        assert "content-length" not in r.headers          # streamed, not built whole
        body = b"".join(r.iter_bytes())
    assert body == first.content
    assert probe.count > 0 and probe.slowest < HEALTH_BOUND_S, probe.slowest


def test_healthz_answers_while_slow_readers_download_and_lists_run(
        server: Server, first: httpx.Response, report: dict[str, Any]) -> None:
    scan_id = report["id"]
    sizes: list[int] = []

    def slow_reader() -> None:
        got = 0
        with httpx.stream("GET", f"{server.url}/scans/{scan_id}", timeout=600) as r:
            for i, chunk in enumerate(r.iter_raw(65536)):
                got += len(chunk)
                if i % 20 == 0:
                    time.sleep(0.05)
        sizes.append(got)

    def lister() -> None:
        for _ in range(20):
            assert httpx.get(f"{server.url}/scans", params={"limit": 50}, timeout=60).status_code == 200

    with HealthProbe(server) as probe:
        threads = [threading.Thread(target=slow_reader) for _ in range(3)]
        threads.append(threading.Thread(target=lister))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sizes == [len(first.content)] * 3
    assert probe.count > 0 and probe.slowest < HEALTH_BOUND_S, probe.slowest


def test_the_list_has_summaries_never_a_manifest(server: Server, report: dict[str, Any]) -> None:
    r = httpx.get(f"{server.url}/scans", params={"format": "torch-zip"}, timeout=60)
    item = next(i for i in r.json()["items"] if i["id"] == report["id"])
    assert len(r.content) < 64 * 1024
    assert set(item) == {"id", "created_at", "cached", "source", "format", "verdict", "scanner",
                         "counts", "findings"}
    assert item["counts"]["tensors"] == VIEWS and item["counts"]["storages"] == len(STORAGES)
    pickles = httpx.get(f"{server.url}/scans", params={"format": "pickle"}, timeout=60).json()["items"]
    assert item["id"] not in {i["id"] for i in pickles}
    short = httpx.get(f"{server.url}/scans/{item['id']}", params={"manifest": "false"}, timeout=60).json()
    assert "tensors" not in short and short["tensor_count"] == VIEWS
    assert short["links"]["tensors"] == f"/scans/{item['id']}/tensors"


def test_tensor_pages(server: Server, report: dict[str, Any]) -> None:
    scan_id = report["id"]
    url = f"{server.url}/scans/{scan_id}/tensors"
    page = httpx.get(url, params={"name": "BLOCK49.VIEW1", "sort": "-nbytes", "limit": 7}, timeout=60).json()
    expected = sorted(((t["nbytes"], i) for i, t in enumerate(report["tensors"])
                       if "block49.view1" in t["name"]), reverse=True)
    assert page["total"] == len(expected) and len(page["items"]) == 7
    assert [(t["nbytes"], t["index"]) for t in page["items"]] == expected[:7]
    assert page["items"][0] == {"index": page["items"][0]["index"],
                                **report["tensors"][page["items"][0]["index"]]}
    assert sum(d["count"] for d in page["dtypes"]) == VIEWS
    following = httpx.get(url, params={"name": "block49.view1", "sort": "-nbytes", "limit": 7,
                                       "cursor": page["next_cursor"]}, timeout=60).json()
    assert [(t["nbytes"], t["index"]) for t in following["items"]] == expected[7:14]
    whole = httpx.get(url, params={"limit": 1000, "dtype": "int64", "sort": "data_offset"}, timeout=60).json()
    assert whole["total"] == sum(1 for t in report["tensors"] if t["dtype"] == "int64")
    assert [t["index"] for t in whole["items"]] == sorted(
        (i for i, t in enumerate(report["tensors"]) if t["dtype"] == "int64"),
        key=lambda i: (report["tensors"][i]["data_offset"], i))[:1000]
    bad = httpx.get(url, params={"cursor": "bm90LWEtY3Vyc29y"}, timeout=60)
    assert bad.status_code == 400 and bad.headers["content-type"] == PROBLEM
    assert bad.json()["code"] == "BAD_CURSOR"
    missing = httpx.get(f"{server.url}/scans/{'0' * 32}/tensors", timeout=60)
    assert missing.status_code == 404 and missing.json()["code"] == "SCAN_NOT_FOUND"
    assert httpx.get(url, params={"limit": 1001}, timeout=60).status_code == 422
    assert httpx.get(url, params={"sort": "name"}, timeout=60).status_code == 422
    assert view_name(0) == report["tensors"][0]["name"]


def test_a_cache_hit_stores_no_copy_and_delete_frees_it(server: Server, report: dict[str, Any],
                                                       checkpoint: bytes, data_dir: Path) -> None:
    before = _counts(data_dir)
    answer = httpx.post(f"{server.url}/scan", files={"file": ("again.pt", checkpoint)}, timeout=600)
    again = answer.json()   # parsed once: 13 MB
    first_id, again_id = report["id"], again["id"]
    assert again["cached"] is True and again_id != first_id
    after = _counts(data_dir)
    assert after == {**before, "scans": before["scans"] + 1}        # one record, nothing else
    assert httpx.delete(f"{server.url}/scans/{first_id}", timeout=60).status_code == 204
    assert httpx.get(f"{server.url}/scans/{first_id}", timeout=60).status_code == 404
    assert _counts(data_dir)["tensor_keys"] == after["tensor_keys"]   # still referenced
    assert httpx.get(f"{server.url}/scans/{again_id}/tensors", timeout=60).json()["total"] == VIEWS
    assert httpx.delete(f"{server.url}/scans/{again_id}", timeout=60).status_code == 204
    gone = _counts(data_dir)
    assert gone["analyses"] == after["analyses"] - 1
    assert gone["tensor_keys"] == after["tensor_keys"] - VIEWS
    r = httpx.delete(f"{server.url}/scans/{again_id}", timeout=60)
    assert r.status_code == 404 and r.json()["code"] == "SCAN_NOT_FOUND"


def test_retention_deletes_old_scans(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", CKPTGUARD_WORKERS="1", CKPTGUARD_RETENTION_DAYS="0.00002",
                        CKPTGUARD_RETENTION_SWEEP_SECONDS="0.5") as srv:   # 1.7 s
        scan_id = httpx.post(f"{srv.url}/scan", files={"file": ("a.pkl", benign_pickle(nonce()))},
                             timeout=120).json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{srv.url}/scans/{scan_id}", timeout=30).status_code == 200:
            assert time.monotonic() < deadline, "retention never removed the scan"
            time.sleep(0.3)
        assert _counts(tmp_path / "data") == {"scans": 0, "analyses": 0, "manifest_chunks": 0,
                                              "tensor_keys": 0}


def test_the_openapi_document_describes_the_answers(server: Server) -> None:
    doc = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]

    def ref(path: str, method: str = "get", status: str = "200") -> str:
        content = doc["paths"][path][method]["responses"][status]["content"]
        return str(content["application/json"]["schema"]["$ref"]).rsplit("/", 1)[-1]

    assert set(schemas[ref("/scans")]["properties"]) == {"items", "next_cursor"}
    assert "counts" in schemas["ScanSummary"]["properties"]
    assert set(schemas[ref("/scans/{scan_id}/tensors")]["properties"]) == {"items", "next_cursor",
                                                                           "total", "dtypes"}
    assert ref("/scans/{scan_id}") == ref("/scan", "post") == ref("/scan/url", "post") == "ScanReport"
    assert "204" in doc["paths"]["/scans/{scan_id}"]["delete"]["responses"]
