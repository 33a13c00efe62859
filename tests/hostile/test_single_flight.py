"""Identical uploads in flight share one scan: the first runs it, the others wait for its
analysis and get records of their own (a new id, their file name, cached: true)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.builders.pickle_asm import asm
from tests.e2e.service_server import Server, running_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("flight"), CKPTGUARD_WORKERS="2") as srv:
        yield srv


def _slow_benign_pickle() -> bytes:
    """A list of 400k distinct ints: a second or so of interpretation, verdict safe."""
    items = asm(*[("BININT", 1_000_000 + i) for i in range(400_000)])
    return asm(("PROTO", 2), "EMPTY_LIST", "MARK", ("RAW", items), "APPENDS", "STOP")


def _fresh_scans(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    fresh = re.findall(r'^ckptguard_scans_total\{cached="false"[^}]*\} (\S+)$', text, re.M)
    return sum(float(v) for v in fresh)


def test_six_identical_uploads_run_one_scan(server: Server) -> None:
    data = _slow_benign_pickle()
    before = _fresh_scans(server)
    answers: list[dict[str, object]] = []
    barrier = threading.Barrier(6)

    def post(i: int) -> None:
        barrier.wait()
        r = httpx.post(f"{server.url}/scan", files={"file": (f"copy{i}.pkl", data, "x/y")}, timeout=120)
        answers.append(r.json())

    threads = [threading.Thread(target=post, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 6 and {a["verdict"] for a in answers} == {"safe"}
    assert _fresh_scans(server) - before == 1              # one analysis ...
    assert len({a["id"] for a in answers}) == 6            # ... six records
    assert sorted(a["source"]["name"] for a in answers) == [f"copy{i}.pkl" for i in range(6)]  # type: ignore[index]
