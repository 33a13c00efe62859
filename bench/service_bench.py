"""POST /scan throughput and latency, the server's memory during a 2 GB upload, big reports
and a slow upstream.

    python bench/service_bench.py [--seconds S] [--clients 1,8,32] [--skip-big]
    python bench/service_bench.py --scenario big-report [--tensors 500000] [--root DIR]
    python bench/service_bench.py --scenario slow-upstream [--seconds S] [--root DIR]

`--root` runs the service from another checkout (e.g. main) for a before/after figure.

Starts the real service (`python -m ckptguard.app`, uvicorn, default workers) on 127.0.0.1 with a
fresh SQLite database, then:
  1. for each client count: clients POST a 1 MB torch checkpoint in a loop for S seconds;
     every request carries different bytes (a counter written into the tensor data), so
     every request is a real scan, never a cache hit; prints req/s, p50, p99;
  2. the same at 8 clients with one fixed file (cache hits), for comparison;
  3. streams a 2 GB upload (generated, never held in memory) and samples the server's RSS
     (the uvicorn process; workers listed apart) every 20 ms: baseline, peak, growth.
Issue 3's bar: >= 100 scans/s at 8 clients with p99 < 250 ms; 2 GB upload < ~100 MB RSS growth.

big-report (issue 15): three checkpoints of `--tensors` tensor views each (~7 MB files, ~130 MB
reports; tests/builders/many_views.py) are uploaded, then: GET /scans?limit=10 latency; /healthz
latency (p50, p99, max; one probe every 20 ms) while a client downloads one report in full, and
while the list runs; the API process' RSS growth over the baseline after the uploads; pages of
GET /scans/{id}/tensors (when the service has it). Targets: list < 200 ms, /healthz p99 < 50 ms,
RSS growth < 100 MB, tensor page < 200 ms.
slow-upstream (issue 15): two POST /scan/url against a local server that answers 206 and then
trickles a byte every 0.5 s, while 8 clients scan 1 MB uploads for S seconds: their throughput
and p99, and /healthz p99, beside the same load without the trickling scans.
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

from tests.e2e import service_server
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


class Probe:
    """/healthz every `every` s in a thread until stopped: latencies; the API's peak RSS."""

    def __init__(self, server: Server, every: float = 0.02) -> None:
        self.server, self.every = server, every
        self.latencies: list[float] = []
        self.proc = psutil.Process(server.process.pid)
        self.peak_rss = self.proc.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=120) as client:
            while not self._done.is_set():
                t0 = time.perf_counter()
                client.get("/healthz")
                self.latencies.append(time.perf_counter() - t0)
                self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
                time.sleep(self.every)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def line(self, label: str) -> str:
        lat = self.latencies or [0.0]
        return (f"{label:<44} /healthz p50 {statistics.median(lat) * 1000:7.1f} ms  p99 "
                f"{percentile(lat, 99) * 1000:7.1f} ms  max {max(lat) * 1000:7.1f} ms  n={len(lat)}")


def big_report(args: argparse.Namespace) -> None:
    from tests.builders.many_views import many_views_checkpoint

    mb = 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="ckptguard-bench-") as tmp, \
            running_server(Path(tmp) / "data", CKPTGUARD_WORKERS="2", CKPTGUARD_LOG_LEVEL="WARNING",
                           CKPTGUARD_WORKER_MEMORY_MB="4096") as server:
        ids = []
        for k in range(3):
            data = many_views_checkpoint(args.tensors + k)   # different bytes: three analyses
            t0 = time.perf_counter()
            with httpx.stream("POST", f"{server.url}/scan", timeout=900,
                              files={"file": (f"big{k}.pt", data)}) as r:
                body = r.read()
            print(f"upload {k}: {len(data) / mb:.1f} MB file, status {r.status_code}, report "
                  f"{len(body) / mb:.1f} MB, {time.perf_counter() - t0:.1f} s", flush=True)
            ids.append(httpx.Response(200, content=body).json()["id"])
            del body
        proc = psutil.Process(server.process.pid)
        time.sleep(2)
        base = proc.memory_info().rss
        print(f"API RSS after the uploads: {base / mb:.1f} MB", flush=True)
        with Probe(server) as probe:
            lat = []
            for _ in range(3):
                t0 = time.perf_counter()
                r = httpx.get(f"{server.url}/scans", params={"limit": 10}, timeout=300)
                lat.append(time.perf_counter() - t0)
            print(f"GET /scans?limit=10: median {statistics.median(lat) * 1000:.1f} ms, max "
                  f"{max(lat) * 1000:.1f} ms, {len(r.content) / 1024:.1f} KiB", flush=True)
        print(probe.line("while the list runs"), flush=True)
        with Probe(server) as probe:
            t0 = time.perf_counter()
            got = 0
            with httpx.stream("GET", f"{server.url}/scans/{ids[0]}", timeout=300) as r:
                for chunk in r.iter_bytes():
                    got += len(chunk)
            elapsed = time.perf_counter() - t0
        print(f"GET /scans/{{id}} in full: {got / mb:.1f} MB in {elapsed:.1f} s", flush=True)
        print(probe.line("while one report is downloaded"), flush=True)
        print(f"API RSS growth while listing/downloading: {(probe.peak_rss - base) / mb:.1f} MB "
              f"(peak {probe.peak_rss / mb:.1f} MB)", flush=True)
        tensor_pages(server, ids[0])


def tensor_pages(server: Server, scan_id: str) -> None:
    """Latency of one page of GET /scans/{id}/tensors per sort and filter (cold, then the next page)."""
    if httpx.get(f"{server.url}/scans/{scan_id}/tensors", timeout=60).status_code != 200:
        print("GET /scans/{id}/tensors: not in this version", flush=True)
        return
    worst = 0.0
    for sort in ("index", "nbytes", "-nbytes", "data_offset", "-data_offset"):
        for flt in ({}, {"dtype": "float16"}, {"name": "VIEW1"}, {"name": "block4999"},
                    {"name": "nothing-matches"}, {"name": "view", "dtype": "int64"}):
            times = []
            cursor = None
            for _ in range(2):
                params = {"sort": sort, "limit": 100, **flt, **({"cursor": cursor} if cursor else {})}
                t0 = time.perf_counter()
                page = httpx.get(f"{server.url}/scans/{scan_id}/tensors", params=params, timeout=60).json()
                times.append(time.perf_counter() - t0)
                cursor = page["next_cursor"]
                if not cursor:
                    break
            worst = max(worst, *times)
            print(f"tensors sort={sort:<13} {flt!s:<36} total {page['total']:>7}  "
                  + "  ".join(f"{t * 1000:6.1f} ms" for t in times), flush=True)
    print(f"tensor page, slowest: {worst * 1000:.1f} ms", flush=True)


def slow_upstream(args: argparse.Namespace) -> None:
    from tests.trickle import trickling_server

    data, offset = checkpoint_1mb()
    with trickling_server(every=0.5) as url, \
            tempfile.TemporaryDirectory(prefix="ckptguard-bench-") as tmp, \
            running_server(Path(tmp) / "data", CKPTGUARD_WORKERS="2", CKPTGUARD_LOG_LEVEL="WARNING",
                           CKPTGUARD_URL_ALLOWLIST="127.0.0.1") as server:
        asyncio.run(load(server, data, offset, 2, 2.0, 10**9))      # warm-up
        with Probe(server) as probe:
            n, elapsed, lat, errors = asyncio.run(load(server, data, offset, 8, args.seconds, 0))
        report_line("8 clients, no URL scan", n, elapsed, lat, errors)
        print(probe.line("  the same"), flush=True)
        outcomes: list[str] = []

        def url_scan() -> None:
            t0 = time.perf_counter()
            try:
                r = httpx.post(f"{server.url}/scan/url", json={"url": url}, timeout=600)
                outcomes.append(f"{r.status_code} {r.json().get('code', r.json().get('verdict'))} "
                                f"after {time.perf_counter() - t0:.1f} s")
            except httpx.HTTPError as exc:
                outcomes.append(f"{type(exc).__name__} after {time.perf_counter() - t0:.1f} s")

        scans = [threading.Thread(target=url_scan, daemon=True) for _ in range(2)]
        for t in scans:
            t.start()
        time.sleep(1.0)   # both hold a worker now
        with Probe(server) as probe:
            n, elapsed, lat, errors = asyncio.run(load(server, data, offset, 8, args.seconds, 10**6))
        report_line("8 clients, 2 trickling URL scans", n, elapsed, lat, errors)
        print(probe.line("  the same"), flush=True)
        for t in scans:
            t.join(timeout=600)
        print(f"trickling URL scans: {outcomes}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=("throughput", "big-report", "slow-upstream"),
                        default="throughput")
    parser.add_argument("--tensors", type=int, default=500_000)
    parser.add_argument("--root", type=Path, help="run the service from this checkout")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--big-bytes", type=int, default=2 * 1024**3)
    args = parser.parse_args()
    if args.root:
        service_server.ROOT = args.root.resolve()
    print(f"service from {service_server.ROOT}; CPUs: {psutil.cpu_count()}; "
          f"load average: {psutil.getloadavg()}", flush=True)
    if args.scenario == "big-report":
        big_report(args)
        return
    if args.scenario == "slow-upstream":
        slow_upstream(args)
        return
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
