"""Bounded cost (issue 14), side by side in one run, as ratios.

    python bench/cost_bench.py [--quick] [--python PATH ...] [--tools-bin DIR] [--tensors-small N]

Writes into a temp dir (deleted afterwards) and prints one table:
  many-small   a torch.save of N float32 tensors of 40 KB (default 40,000: 1.6 GB): ckptguard's
               bytes read, peak RSS (VmHWM) and time (a fresh process each, best of 3; on every
               --python too), next to
               torch.load(weights_only=True, mmap=True) and picklescan (importable here, or
               in the venv of the `picklescan` in --tools-bin or on PATH);
  report size  report JSON bytes on hostile cases (one memoized long key under many nested dicts,
               views sharing a long shape or storage key, globals sharing a long module) next
               to the issue's bound (8 x pickle + 2 KiB per tensor) and the report cap;
  cold start   whole-process `ckptguard scan` of a ~250-byte pickle vs `python -c pass`, and of
               the 10,000-tensor file (with every --python's ckptguard) vs a whole-process
               torch.load(weights_only, mmap) (5 alternating rounds: the lowest and the
               median ratio);
  10k          the 10,000-tensor scan (in-process, best of 5) on every --python given (each
               needs ckptguard installed) and whether the fast lane took it, vs torch.load;
  remote       the 100,000-tensor file over HTTP Range from tests/rangeserver.py on 127.0.0.1
               (and with 50 ms added to every answer) vs the same scan from disk: requests,
               round trips and bytes read;
  --million    the 1,000,000-tensor safetensors file: scan time and report size; and a
               torch.save of 1,000,000 views of one storage (a ~100 MB data.pkl, past
               Limits.max_opcodes in bytes, so the walk counts its opcodes) vs torch.load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# run in a fresh interpreter: prints one JSON line
_SCAN_ONE = r"""
import json, sys, time
from ckptguard.core.scan import scan_path
best, report = float("inf"), None
for _ in range(int(sys.argv[2])):
    # the previous report is freed before the clock starts, as torch's row frees its dict
    report = None
    t = time.perf_counter(); report = scan_path(sys.argv[1]); best = min(best, time.perf_counter() - t)
from ckptguard.core.io.source import FileSource
from ckptguard.core.lane import torch_zip
from ckptguard.core.state import Analysis
with FileSource(sys.argv[1]) as src:
    lane = torch_zip.try_torch_zip(src, Analysis())
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"s": best, "rss_mb": int(hwm) / 1024,
                  "bytes_read": report.io["bytes_read"], "verdict": report.verdict, "lane": lane,
                  "python": sys.version.split()[0]}))
"""
_TORCH_ONE = r"""
import json, sys, time, torch
best = float("inf")
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); sd = torch.load(sys.argv[1], weights_only=True, mmap=True)
    best = min(best, time.perf_counter() - t); del sd
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"s": best, "rss_mb": int(hwm) / 1024}))
"""
_PICKLESCAN_ONE = r"""
import json, sys, time
from picklescan.scanner import scan_file_path
t = time.perf_counter(); scan_file_path(sys.argv[1])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"s": time.perf_counter() - t, "rss_mb": int(hwm) / 1024}))
"""


# the version, and how ckptguard is installed there: an editable install (the README's
# `pip install -e`) has every process of that venv import setuptools' finder at start-up
# (~15-25 ms: it imports pathlib), which a wheel install (`pip install .`, the image) has not
_VERSION_AND_INSTALL = r"""
import json, sys, site
from pathlib import Path
dirs = [*site.getsitepackages(), site.getusersitepackages()]
editable = any(Path(d).is_dir() and any(Path(d).glob("__editable__*ckptguard*")) for d in dirs)
print(json.dumps({"v": sys.version.split()[0] + (" (editable)" if editable else " (wheel)")}))
"""


def _run_json(python: str, code: str, *args: str) -> dict[str, object]:
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _wall(cmd: list[str], repeat: int = 5, env: dict[str, str] | None = None) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       env=env)
        best = min(best, time.perf_counter() - t)
    return best


def _row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def many_small(tmp: Path, n: int, pythons: list[str], tools_bin: str | None) -> None:
    path = tmp / "many_small.pt"
    torch.save({f"layer.{i}.weight": torch.full((10_000,), float(i)) for i in range(n)}, path)
    os.sync()   # 1.6 GB of dirty pages: written back now, not during the first timed scans
    size = path.stat().st_size
    scans = [_run_json(py, _SCAN_ONE, str(path), "3") for py in pythons]
    cg = scans[0]
    tl = _run_json(sys.executable, _TORCH_ONE, str(path), "3")
    print(f"\n### many-small: {n:,} x 40 KB float32, {size / 1e9:.2f} GB\n")
    _row("tool", "bytes read", "peak RSS MB", "time s", "vs ckptguard")
    _row("---", "---", "---", "---", "---")
    for each in scans:
        _row(f"ckptguard scan on {each['python']}", f"{each['bytes_read']:,}",
             f"{each['rss_mb']:.0f}", f"{each['s']:.3f}", f"{float(each['s']) / float(cg['s']):.2f}x")  # type: ignore[arg-type]
    _row("torch.load(weights_only, mmap)", "mmap", f"{tl['rss_mb']:.0f}", f"{tl['s']:.3f}",
         f"{float(tl['s']) / float(cg['s']):.1f}x slower")  # type: ignore[arg-type]
    picklescan_python = _python_with("picklescan", tools_bin)
    if picklescan_python is not None:
        ps = _run_json(picklescan_python, _PICKLESCAN_ONE, str(path))
        _row("picklescan", "whole file", f"{ps['rss_mb']:.0f}", f"{ps['s']:.3f}",
             f"{float(ps['s']) / float(cg['s']):.1f}x slower")  # type: ignore[arg-type]
    else:
        _row("picklescan", "not installed (--tools-bin)", "", "", "")


def _python_with(module: str, tools_bin: str | None) -> str | None:
    """A Python that imports `module`: this one, or the venv's next to the tool's executable
    in `tools_bin` or on PATH (peers live in a venv of their own, README)."""
    import importlib.util
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    exe = shutil.which(module, path=tools_bin) if tools_bin else shutil.which(module)
    python = Path(exe).with_name("python") if exe else None
    return str(python) if python is not None and python.exists() else None


def report_size() -> None:
    from ckptguard.core.limits import Limits
    from ckptguard.core.reportsize import report_budget
    from ckptguard.core.scan import scan_bytes
    from tests.builders import hostile_names as hn

    cases: list[tuple[str, bytes, int, int]] = []
    for depth, tensors, keylen in ((256, 1_000, 1_000), (64, 100, 4_000), (1, 1_000, 100_000)):
        data, pkl = hn.memoized_key_checkpoint(depth, tensors, "k" * keylen)
        cases.append((f"{depth} dicts x key of {keylen:,} chars", data, pkl, tensors))
    for label, built in (
            ("1,000 views x one memoized 1,000-dim shape", hn.memoized_shape_views(1_000, 1_000)),
            ("2,000 views x one memoized 30,000-char storage key",
             hn.memoized_storage_views(2_000, "s" * 30_000)),
            ("3,000 globals x one memoized 10,000-char module",
             hn.memoized_module_globals(3_000, "m" * 10_000))):
        cases.append((label, *built))
    print("\n### report size on hostile cases (issue's bound: 8 x pickle + 2 KiB per tensor; "
          "cap: 8 x pickle bytes + 2 KiB per tensor + 256 per zip entry, at least 64 KiB, <= 256 MiB)\n")
    _row("case", "pickle bytes", "tensors", "report bytes", "report / issue bound",
         "report / cap", "verdict", "cut")
    _row("---", "---", "---", "---", "---", "---", "---", "---")
    for label, data, pkl, tensors in cases:
        report = scan_bytes(data)
        size = len(json.dumps(report.to_json()).encode())
        cap = report_budget(Limits(), report.io["pickle_bytes"], tensors, report.io.get("zip_entries", 0))
        cut = any(f.code == "LIMIT_REPORT" for f in report.findings)
        _row(label, f"{pkl:,}", tensors, f"{size:,}", f"{size / (8 * pkl + 2048 * tensors):.2f}",
             f"{size / cap:.2f}", report.verdict,
             f"{len(report.tensors):,} tensors, {len(report.globals):,} globals listed" if cut
             else "no")


def million_safetensors(tmp: Path) -> None:
    """1,000,000 one-element tensors in a safetensors file (the issue's 68 MB case)."""
    import struct

    from ckptguard.core.scan import scan_path

    path = tmp / "1m.safetensors"
    n = 1_000_000
    header = json.dumps({f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                         for i in range(n)}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + 4 * n)
    t = time.perf_counter()
    report = scan_path(path)
    scan_s = time.perf_counter() - t
    t = time.perf_counter()
    size = len(json.dumps(report.to_json()))
    dump_s = time.perf_counter() - t
    print(f"\n### 1,000,000-tensor safetensors ({path.stat().st_size / 1e6:.0f} MB)\n")
    _row("scan s", "report bytes", "to_json + dumps s", "verdict", "tensors listed")
    _row("---", "---", "---", "---", "---")
    _row(f"{scan_s:.1f}", f"{size:,}", f"{dump_s:.1f}", report.verdict, f"{len(report.tensors):,}")


def million_torch(tmp: Path) -> None:
    """torch.save of 1,000,000 one-element views of one storage: a data.pkl larger than
    Limits.max_opcodes in bytes, whose opcodes the walk counts to keep it on the fast path."""
    import zipfile

    from ckptguard.core.io.source import FileSource
    from ckptguard.core.lane import torch_zip
    from ckptguard.core.limits import DEFAULT_LIMITS
    from ckptguard.core.scan import scan_path
    from ckptguard.core.state import Analysis

    path = tmp / "1m.pt"
    base = torch.zeros(1_000_000)
    torch.save({f"model.layers.{i}.weight": base[i:i + 1] for i in range(len(base))}, path)
    del base
    with zipfile.ZipFile(path) as archive:
        pkl = next(i.file_size for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    t = time.perf_counter()
    verdict = scan_path(path).verdict
    scan_s = time.perf_counter() - t
    with FileSource(str(path)) as src:
        lane = torch_zip.try_torch_zip(src, Analysis())
    t = time.perf_counter()
    loaded = torch.load(path, weights_only=True, mmap=True)
    torch_s = time.perf_counter() - t
    del loaded
    print(f"\n### 1,000,000-tensor torch.save (data.pkl {pkl / 1e6:.0f} MB, "
          f"max_opcodes {DEFAULT_LIMITS.max_opcodes:,})\n")
    _row("ckptguard s", "torch.load s", "ratio", "verdict", "fast lane")
    _row("---", "---", "---", "---", "---")
    _row(f"{scan_s:.1f}", f"{torch_s:.1f}", f"{torch_s / scan_s:.1f}x", verdict, lane)


def cold_start(tmp: Path, ten_k: Path, pythons: list[str]) -> None:
    import pickle

    tiny = tmp / "tiny.pkl"
    tiny.write_bytes(pickle.dumps({"a": [1, 2, 3], "b": "x" * 200}, protocol=2))
    # An installed package has its bytecode compiled (pip does it); PYTHONDONTWRITEBYTECODE=1
    # (set in some containers) makes every process compile ckptguard's sources again
    # (~0.25 s here): both are shown, caches first written by one run.
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    clis = {py: str(Path(py).with_name("ckptguard")) for py in pythons}
    for each in clis.values():
        subprocess.run([each, "scan", str(tiny)], env=cached, capture_output=True, check=False)
    uncached = {**cached, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(tmp / "pyc")}
    scan_tiny = {py: (_wall([py, "-c", "pass"], env=cached), _wall([each, "scan", str(tiny)], env=cached))
                 for py, each in clis.items()}
    base = scan_tiny[sys.executable][0]
    scan_tiny_nocache = _wall([clis[sys.executable], "scan", str(tiny)], env=uncached)
    # the processes alternate, round by round: the VM's speed drifts by tens of per cent
    # within minutes, so a ratio is only fair between neighbours
    rounds: dict[str, list[tuple[float, float, float]]] = {py: [] for py in clis}
    for _ in range(5):
        scans = {py: _wall([each, "scan", str(ten_k)], 3, env=cached) for py, each in clis.items()}
        load_s = _wall([sys.executable, "-c", f"import torch; torch.load({str(ten_k)!r}, "
                        "weights_only=True, mmap=True)"], 1, env=cached)
        for py, scan_s in scans.items():
            rounds[py].append((load_s / scan_s, scan_s, load_s))
    print("\n### cold start (whole process, best of 5 / 3)\n")
    _row("command", "wall s", "ratio")
    _row("---", "---", "---")
    versions = {py: _run_json(py, _VERSION_AND_INSTALL)["v"] for py in clis}
    for py, (pass_s, tiny_s) in scan_tiny.items():
        _row(f"python -c pass on {versions[py]}", f"{pass_s:.3f}", "1.0x")
        _row(f"ckptguard scan tiny.pkl ({tiny.stat().st_size} B) on {versions[py]}", f"{tiny_s:.3f}",
             f"{tiny_s / pass_s:.1f}x python -c pass")
    _row(f"  the same on {versions[sys.executable]}, no bytecode cache (PYTHONDONTWRITEBYTECODE=1)",
         f"{scan_tiny_nocache:.3f}", f"{scan_tiny_nocache / base:.1f}x python -c pass")
    for py, runs in rounds.items():
        runs.sort()
        ratio_min, scan_10k, load_10k = runs[0]
        version = versions[py]
        _row(f"ckptguard scan 10k.pt on {version} (the round of the lowest ratio)",
             f"{scan_10k:.3f}", "")
        _row("python -c 'torch.load(10k.pt, weights_only, mmap)'", f"{load_10k:.3f}",
             f"{ratio_min:.1f}x slower than ckptguard (lowest of 5 rounds; median "
             f"{runs[len(runs) // 2][0]:.1f}x)")


def ten_k(ten_k_path: Path, pythons: list[str]) -> None:
    tl = _run_json(sys.executable, _TORCH_ONE, str(ten_k_path), "5")
    print("\n### 10,000 tensors, in-process, best of 5\n")
    _row("python", "fast lane took it", "ckptguard ms", "torch.load ms", "ratio")
    _row("---", "---", "---", "---", "---")
    for py in pythons:
        r = _run_json(py, _SCAN_ONE, str(ten_k_path), "5")
        _row(r["python"], r["lane"], f"{float(r['s']) * 1e3:.1f}",  # type: ignore[arg-type]
             f"{float(tl['s']) * 1e3:.1f}", f"{float(tl['s']) / float(r['s']):.1f}x")  # type: ignore[arg-type]


def remote(tmp: Path) -> None:
    from ckptguard.core.scan import scan_path

    path = tmp / "100k.pt"
    torch.save({f"model.layers.{i}.weight": torch.zeros(2) for i in range(100_000)}, path)
    local = min(_timed(lambda: scan_path(path)) for _ in range(3))
    load = min(_timed(lambda: torch.load(path, weights_only=True, mmap=True)) for _ in range(3))
    near = _remote_scan(path, 0.0, 3)
    far = _remote_scan(path, 0.05, 2)
    print("\n### remote vs local: 100,000 tensors, best of 3 (2 with latency)\n")
    _row("source", "time s", "requests", "round trips", "bytes read", "ratio")
    _row("---", "---", "---", "---", "---", "---")
    _row("local file", f"{local:.3f}", "", "", "", "1.0x")
    _row("HTTP Range, 127.0.0.1", f"{near[0]:.3f}", near[1], near[2], f"{near[3]:,}",
         f"{near[0] / local:.2f}x")
    _row("HTTP Range, 127.0.0.1 + 50 ms per answer", f"{far[0]:.3f}", far[1], far[2],
         f"{far[3]:,}", f"{far[0] / local:.2f}x")
    _row("torch.load(local file, weights_only, mmap)", f"{load:.3f}", "", "", "(mmap)",
         f"{load / local:.1f}x")


def _remote_scan(path: Path, latency: float, repeat: int) -> tuple[float, int, int, int]:
    """(best seconds, requests, round trips, bytes read) of a scan over HTTP Range from
    tests/rangeserver.py, each answer delayed by `latency` seconds."""
    from ckptguard.core.io.http import HttpSource
    from ckptguard.core.io.urlguard import UrlGuard
    from ckptguard.core.scan import scan_source

    server = subprocess.Popen([sys.executable, "-m", "tests.rangeserver", "--latency",
                               str(latency), str(path)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/{path.name}"
        best, requests, trips, read = float("inf"), 0, 0, 0
        for _ in range(repeat):
            t = time.perf_counter()
            with HttpSource(url, guard=UrlGuard(allowlist=("127.0.0.1",))) as src:
                scan_source(src)
                requests, trips, read = src.stats.requests, src.round_trips, src.stats.bytes_read
            best = min(best, time.perf_counter() - t)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
    return best, requests, trips, read


def _timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4,000 small tensors instead of 40,000")
    ap.add_argument("--python", action="append", default=[],
                    help="more interpreters for the many-small, cold-start and 10k rows (each "
                         "with ckptguard installed)")
    ap.add_argument("--tools-bin", help="folder with a peer's executable in its own venv "
                    "(e.g. /tmp/tools/bin after `pip install picklescan` there)")
    ap.add_argument("--skip", default="", help="comma-separated: many,report,cold,10k,remote")
    ap.add_argument("--million", action="store_true",
                    help="also the 1,000,000-tensor safetensors file (minutes)")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory(prefix="ckptguard-i14-") as d:
        tmp = Path(d)
        ten_k_path = tmp / "10k.pt"
        torch.save({f"layer.{i}.weight": torch.zeros(2, 2) for i in range(10_000)}, ten_k_path)
        if "many" not in skip:
            many_small(tmp, 4_000 if args.quick else 40_000, [sys.executable, *args.python],
                       args.tools_bin)
        if "report" not in skip:
            report_size()
        if "cold" not in skip:
            cold_start(tmp, ten_k_path, [sys.executable, *args.python])
        if "10k" not in skip:
            ten_k(ten_k_path, [sys.executable, *args.python])
        if "remote" not in skip:
            remote(tmp)
        if args.million:
            million_safetensors(tmp)
            million_torch(tmp)


if __name__ == "__main__":
    main()
