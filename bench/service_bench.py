"""POST /scan throughput and latency, and the server's memory during a 2 GB upload.

    python bench/service_bench.py [--seconds S] [--clients 1,8,32] [--skip-big]

Starts the real service (`python -m ckptguard.app`, uvicorn, default workers) on 127.0.0.1 with a
fresh SQLite database, then:
  1. for each client count: clients POST a 1 MB torch checkpoint in a loop for S seconds;
     every request carries different bytes (a counter written into the tensor data), so
     every request is a real scan, never a cache hit; prints req/s, p50, p99;
  2. the same at 8 clients with one fixed file (cache hits), for comparison;
  3. streams a 2 GB upload (generated, never held in memory) and samples the server's RSS
     (the uvicorn process; workers listed apart) every 20 ms: baseline, peak, growth.
Issue 3's bar: >= 100 scans/s at 8 clients with p99 < 250 ms; 2 GB upload < ~100 MB RSS growth.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.service_server import Server, running_server

BOUNDARY = "ckptguard-bench-boundary"


def checkpoint_1mb() -> tuple[bytes, int]:
    """A 1 MiB float32 torch checkpoint and the absolute offset of its tensor data."""
    import torch

    from ckptguard.core.io.source import BytesSource
    from ckptguard.core.scan import scan_source

    buf = io.BytesIO()
    torch.save({"weight": torch.randn(256, 1024)}, buf)
    data = buf.getvalue()
    report = scan_source(BytesSource(data))
    offset = report.storages[0].data_offset
    assert report.verdict == "safe" and offset is not None
    return data, offset


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def load(server: Server, data: bytes, offset: int | None, clients: int, seconds: float,
               start: int) -> tuple[int, float, list[float], int]:
    counter = start
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal counter, errors
        while time.perf_counter() < stop_at:
            counter += 1
            body = data
            if offset is not None:   # different bytes -> different sha256 -> a real scan
                body = data[:offset] + struct.pack("<Q", counter) + data[offset + 8:]
            t0 = time.perf_counter()
            r = await client.post("/scan", files={"file": ("bench.pt", body)})
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200 or r.json()["verdict"] != "safe":
                errors += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return len(latencies), elapsed, latencies, errors


def report_line(label: str, n: int, elapsed: float, lat: list[float], errors: int) -> None:
    print(f"{label:<28} {n / elapsed:8.1f} req/s   p50 {statistics.median(lat) * 1000:7.1f} ms   "
          f"p99 {percentile(lat, 99) * 1000:7.1f} ms   n={n} errors={errors}", flush=True)


def big_upload(server: Server, nbytes: int) -> None:
    proc = psutil.Process(server.process.pid)
    base_rss = proc.memory_info().rss
    peak = base_rss
    worker_peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, worker_peak
        while not done.is_set():
            try:
                peak = max(peak, proc.memory_info().rss)
                for child in proc.children(recursive=True):
                    worker_peak = max(worker_peak, child.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.02)

    def body():
        yield (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; "
               "filename=\"big.bin\"\r\n\r\n").encode()
        chunk = b"\x5a" * (1 << 20)
        for _ in range(nbytes // len(chunk)):
            yield chunk
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    r = httpx.post(f"{server.url}/scan", content=body(), timeout=900,
                   headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"})
    elapsed = time.perf_counter() - t0
    done.set()
    sampler.join()
    mb = 1024 * 1024
    print(f"2 GB upload: status {r.status_code}, verdict {r.json().get('verdict')}, "
          f"{nbytes / mb / elapsed:.0f} MB/s, {elapsed:.1f} s", flush=True)
    print(f"server RSS: baseline {base_rss / mb:.1f} MB, peak {peak / mb:.1f} MB, "
          f"growth {(peak - base_rss) / mb:.1f} MB; largest worker RSS {worker_peak / mb:.1f} MB",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--big-bytes", type=int, default=2 * 1024**3)
    args = parser.parse_args()
    data, offset = checkpoint_1mb()
    print(f"checkpoint: {len(data)} bytes; CPUs: {psutil.cpu_count()}; "
          f"load average: {psutil.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ckptguard-bench-") as tmp, \
            running_server(Path(tmp) / "data", CKPTGUARD_WORKERS="2",
                           CKPTGUARD_LOG_LEVEL="WARNING") as server:
        start = 0
        asyncio.run(load(server, data, offset, 2, 2.0, 10**9))      # warm-up
        for clients in (int(c) for c in args.clients.split(",")):
            n, elapsed, lat, errors = asyncio.run(load(server, data, offset, clients, args.seconds, start))
            start += n + 1
            report_line(f"scan, {clients} client(s)", n, elapsed, lat, errors)
        n, elapsed, lat, errors = asyncio.run(load(server, data, None, 8, args.seconds, 0))
        report_line("cache hit, 8 clients", n, elapsed, lat, errors)
        if not args.skip_big:
            big_upload(server, args.big_bytes)


if __name__ == "__main__":
    main()
