"""Remote manifest cost: ckptguard's HttpSource vs a whole download vs torch's meta load.

Generates (in a temp dir, deleted afterwards) a ~2 GB checkpoint (one big uint8 tensor
+ a few small ones), a 10,000-tensor and a 100,000-tensor checkpoint, and 1,000 tensors
of 128 KB (records too far apart to coalesce: multi-range requests) with torch.save,
serves them from tests/rangeserver.py on 127.0.0.1, and prints for each:
requests, round trips, bytes read and wall time for
  ckptguard   HttpSource + core.scan.scan_source (the full report, zip forensics included)
  manifest    the same source, only the open + speculation (what the manifest needs)
  download    one GET of the whole file
  torch-meta  torch.load(map_location="meta", weights_only=True) over a file object that
              does one Range GET per read() (sequential: every request is a round trip)

Run:  python bench/remote_bench.py [--big-gb 2] [--only 10k,100k,2gb]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptguard.core.io.http import HttpSource
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.scan import scan_source

GUARD = UrlGuard(allowlist=("127.0.0.1",))


@dataclass
class Row:
    method: str
    requests: int
    round_trips: int
    bytes_read: int
    seconds: float
    note: str = ""


class RangedFile(io.RawIOBase):
    """A read-only file object doing one HTTP Range GET per read (what naive remote loading does)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(headers={"Accept-Encoding": "identity"})
        self.requests = 0
        self.bytes_read = 0
        self.pos = 0
        head = self.client.get(url, headers={"Range": "bytes=0-0"})
        self.requests += 1
        self.size = int(head.headers["content-range"].rsplit("/", 1)[1])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        r = self.client.get(self.url, headers={"Range": f"bytes={self.pos}-{self.pos + n - 1}"})
        self.requests += 1
        self.bytes_read += len(r.content)
        buf[: len(r.content)] = r.content
        self.pos += len(r.content)
        return len(r.content)

    def close(self) -> None:
        self.client.close()
        super().close()


def bench_ckptguard(url: str) -> tuple[Row, Row, int]:
    t0 = time.perf_counter()
    with HttpSource(url, guard=GUARD) as src:
        opened = Row("manifest (open+speculation)", src.stats.requests, src.round_trips,
                     src.stats.bytes_read, time.perf_counter() - t0)
        report = scan_source(src)
        full = Row("ckptguard scan (full report)", src.stats.requests, src.round_trips,
                   src.stats.bytes_read, time.perf_counter() - t0,
                   f"verdict={report.verdict} tensors={len(report.tensors)}")
    return opened, full, len(report.tensors)


def bench_download(url: str) -> Row:
    t0 = time.perf_counter()
    n = 0
    with httpx.Client() as client, client.stream("GET", url) as resp:
        for chunk in resp.iter_raw(1 << 20):
            n += len(chunk)
    return Row("download whole", 1, 1, n, time.perf_counter() - t0)


def bench_torch_meta(url: str) -> Row:
    t0 = time.perf_counter()
    f = RangedFile(url)
    try:
        sd = torch.load(f, map_location="meta", weights_only=True)
        note = f"tensors={len(sd)}"
    except Exception as exc:  # report, do not hide
        note = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
    row = Row("torch.load(meta) ranged", f.requests, f.requests, f.bytes_read,
              time.perf_counter() - t0, note)
    f.close()
    return row


def make_files(tmp: Path, big_gb: float, only: set[str]) -> dict[str, Path]:
    files: dict[str, Path] = {}
    if "10k" in only:
        p = tmp / "t10k.pt"
        torch.save({f"model.layers.{i}.weight": torch.randn(64) for i in range(10_000)}, p)
        files["10k tensors"] = p
    if "100k" in only:
        p = tmp / "t100k.pt"
        torch.save({f"model.layers.{i}.weight": torch.randn(16) for i in range(100_000)}, p)
        files["100k tensors"] = p
    if "spread" in only:
        p = tmp / "spread.pt"
        torch.save({f"model.layers.{i}.weight": torch.randn(32 * 1024) for i in range(1000)}, p)
        files["1000 x 128 KB tensors"] = p
    if "2gb" in only:
        p = tmp / "big.pt"
        big = torch.zeros(int(big_gb * (1 << 30)), dtype=torch.uint8)
        torch.save({"embed.weight": big, "norm.weight": torch.ones(4096),
                    "lm_head.bias": torch.zeros(4096)}, p)
        del big
        files[f"{big_gb:g} GB"] = p
    return files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-gb", type=float, default=2.0)
    ap.add_argument("--only", default="10k,100k,2gb,spread")
    ap.add_argument("--skip-torch-meta-over", type=float, default=1e18,
                    help="skip torch's meta load for files larger than this many bytes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckptguard-bench-") as d:
        files = make_files(Path(d), args.big_gb, set(args.only.split(",")))
        # the server runs in its own process: no GIL contention with the client being measured
        root = Path(__file__).resolve().parents[1]
        server = subprocess.Popen([sys.executable, "-m", "tests.rangeserver", *map(str, files.values())],
                                  cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            for label, path in files.items():
                size = os.path.getsize(path)
                url = f"http://127.0.0.1:{port}/{path.name}"
                opened, full, _ = bench_ckptguard(url)
                rows = [opened, full, bench_download(url)]
                if size <= args.skip_torch_meta_over:
                    rows.append(bench_torch_meta(url))
                print(f"\n== {label}: {size:,} bytes ==")
                print(f"{'method':<30} {'requests':>8} {'round trips':>11} {'bytes read':>14} "
                      f"{'x fewer':>9} {'wall s':>8}  note")
                for r in rows:
                    ratio = size / r.bytes_read if r.bytes_read else float("inf")
                    print(f"{r.method:<30} {r.requests:>8} {r.round_trips:>11} {r.bytes_read:>14,} "
                          f"{ratio:>9.1f} {r.seconds:>8.3f}  {r.note}", flush=True)
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
