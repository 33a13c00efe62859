"""safetensors / npy / pt2 over HTTP Range requests: same report, few requests, no weights read."""

from __future__ import annotations

import numpy as np
import pytest

from ckptguard.core.io.http import HttpSource
from ckptguard.core.io.source import BytesSource
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.scan import scan_source
from tests.core.formats.fmt_cases import npy_bytes, npz_bytes, st_file
from tests.rangeserver import RangeServer

GUARD = UrlGuard(allowlist=("127.0.0.1",))
BIG = 8 * 1024 * 1024


def _remote_and_local(data: bytes, name: str) -> tuple[object, object, int]:
    with RangeServer({f"/{name}": data}) as srv:
        src = HttpSource(srv.url(f"/{name}"), guard=GUARD)
        remote = scan_source(src)
        requests = srv.requests
    local = scan_source(BytesSource(data, name=name))
    return remote, local, requests


def _same(remote: object, local: object) -> None:
    r, lo = remote.to_json(), local.to_json()  # type: ignore[attr-defined]
    for key in ("format", "verdict", "tensors", "findings", "weights_only"):
        assert r[key] == lo[key], key


@pytest.mark.parametrize("pad", [0, 200_000])
def test_safetensors_header_in_at_most_two_ranged_requests(pad: int) -> None:
    header = {"__metadata__": {"pad": "x" * pad},
              "w": {"dtype": "U8", "shape": [BIG], "data_offsets": [0, BIG]}}
    data = st_file(header, bytes(BIG), pad=True)
    remote, local, requests = _remote_and_local(data, "m.safetensors")
    _same(remote, local)
    assert remote.verdict == "safe"  # type: ignore[attr-defined]
    # head+tail of the sniffer, then at most two header reads of ours
    assert requests <= 3
    assert remote.io["bytes_read"] < pad + 300_000  # type: ignore[attr-defined]


def test_npy_and_npz_remote_equal_local() -> None:
    for name, data in [("a.npy", npy_bytes(np.zeros(BIG // 4, np.float32))),
                       ("a.npz", npz_bytes({"y": np.arange(10), "x": np.zeros(BIG // 8)}))]:
        remote, local, _ = _remote_and_local(data, name)
        _same(remote, local)
        assert remote.verdict == "safe", name  # type: ignore[attr-defined]
        assert remote.io["bytes_read"] < 300_000, name  # type: ignore[attr-defined]


@pytest.mark.torch
def test_pt2_remote_equals_local(pt2_full: bytes) -> None:
    remote, local, _ = _remote_and_local(pt2_full, "m.pt2")
    _same(remote, local)


def test_npz_with_a_big_first_member_reads_little() -> None:
    data = npz_bytes({"x": np.zeros(BIG // 8), "y": np.arange(10)})
    remote, local, _ = _remote_and_local(data, "b.npz")
    _same(remote, local)
    assert remote.io["bytes_read"] < 300_000  # type: ignore[attr-defined]
