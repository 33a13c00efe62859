"""Reads follow the metadata: a scan of a local zip reads the pickle, the directories and the
local headers (fixed part, name, extra field), plus at most 1 MB, whatever the tensor sizes,
and no byte twice (issue 14)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ckptguard.core.io.source import FileSource
from ckptguard.core.scan import scan_source
from ckptguard.core.state import ScanOptions

SLACK = 1 << 20


class _Recording(FileSource):
    """A FileSource that remembers every byte range it read."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.ranges: list[tuple[int, int]] = []

    def read_at(self, offset: int, nbytes: int) -> bytes:
        self.ranges.append((offset, offset + nbytes))
        return super().read_at(offset, nbytes)

    def read_many(self, spans: list[tuple[int, int]]) -> list[bytes]:   # type: ignore[override]
        before = self.stats.requests
        out = super().read_many(spans)
        if self.stats.requests - before == len(spans):   # one pread a span, not via read_at
            self.ranges.extend((off, off + n) for off, n in spans)
        return out


def _metadata_bytes(path: Path) -> int:
    """Pickle records + central directory + every local header (fixed part, name, extra)."""
    total = 0
    with zipfile.ZipFile(path) as zf, path.open("rb") as fh:
        infos = zf.infolist()
        total += sum(i.file_size for i in infos if i.filename.endswith(".pkl"))
        total += sum(46 + len(i.filename.encode()) + len(i.extra) + len(i.comment) for i in infos)
        for info in infos:
            fh.seek(info.header_offset)
            head = fh.read(30)
            nlen, xlen = struct.unpack_from("<HH", head, 26)
            total += 30 + nlen + xlen
    return total


@pytest.fixture(scope="module")
def many_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    path = tmp_path_factory.mktemp("many") / "many_small.pt"
    # 2,000 float32 tensors of 40 KB: each record is smaller than the old 64 KB coalescing gap
    torch.save({f"layer.{i}.weight": torch.full((10_000,), float(i)) for i in range(2_000)}, path)
    return path


@pytest.mark.parametrize("engine", ["auto", "general", "exact"])
def test_a_many_small_tensor_checkpoint_is_not_read_whole(many_small: Path, engine: str) -> None:
    size = many_small.stat().st_size
    bound = _metadata_bytes(many_small) + SLACK
    with _Recording(many_small) as src:
        report = scan_source(src, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        ranges = sorted(src.ranges)
    assert report.verdict == "safe"
    assert len(report.tensors) == 2_000
    read = report.io["bytes_read"]
    assert read <= bound, (engine, read, bound, size)
    assert read < size // 10
    # no byte read twice
    overlap, reach = 0, 0
    for start, end in ranges:
        overlap += max(0, min(reach, end) - start)
        reach = max(reach, end)
    assert overlap == 0, (engine, overlap)


def _remote_scan(path: Path, engine: str) -> tuple[Any, int, list[str | None]]:
    from ckptguard.core.io.http import HttpSource
    from ckptguard.core.io.urlguard import UrlGuard
    from tests.rangeserver import RangeServer

    with RangeServer({"/m.pt": path}) as srv, \
            HttpSource(srv.url("/m.pt"), guard=UrlGuard(allowlist=("127.0.0.1",))) as src:
        report = scan_source(src, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        return report, srv.requests, srv.ranged()


@pytest.mark.parametrize("engine", ["auto", "general"])
def test_a_remote_scan_saves_round_trips_but_does_not_read_the_weights(
        many_small: Path, engine: str) -> None:
    """Over HTTP Range: at most 4 requests (the fast lane and the general path alike), and
    bytes read within the metadata + 1 MB although remote reads coalesce across gaps."""
    report, requests, _ = _remote_scan(many_small, engine)
    assert report.verdict == "safe" and len(report.tensors) == 2_000
    assert requests <= 4, requests
    assert report.io["requests"] <= 4
    assert report.io["bytes_read"] <= _metadata_bytes(many_small) + SLACK
    # the local headers torch's offset chain needs, not one per record
    assert report.io["zip_local_headers_read"] < 10 < report.io["zip_entries"]


def test_a_remote_scan_reports_what_a_local_one_does(many_small: Path) -> None:
    report, _, _ = _remote_scan(many_small, "auto")
    local = scan_source(FileSource(many_small))
    assert report.to_json()["tensors"] == local.to_json()["tensors"]
    assert report.to_json()["storages"] == local.to_json()["storages"]
