"""A model folder scanned by `ckptguard scan` next to picklescan and modelscan, and the -j speedup.

    python bench/cli_bench.py [--files 295] [--tools-bin DIR] [--per-file-sample 20]

Builds a folder like a downloaded model collection: torch.save checkpoints (zip and legacy),
NumPy and safetensors files, malicious pickles (tests/builders/pickle_asm.py), a malformed
zip, and non-checkpoints (text, JSON). Then prints, per tool: wall time, files judged,
findings (files the tool flags) and whether it crashed (a traceback or an exit status that
is no verdict). picklescan (`picklescan -p DIR`) and modelscan (`modelscan -p DIR -r json`)
run if their commands are found on PATH or in --tools-bin (install them in their own venv:
`python -m venv /tmp/tools && /tmp/tools/bin/pip install picklescan modelscan`).
ckptguard runs with -j 1 and -j <cores>; --per-file-sample also times one process per file
(the way the issue found the old single-target command) on a sample, extrapolated.
Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.builders.pickle_asm import asm  # noqa: E402


def build_folder(root: Path, files: int) -> dict[str, int]:
    """`files` files in a few subfolders; returns how many of each kind."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    kinds = {"torch-zip": 0, "torch-legacy": 0, "numpy": 0, "safetensors": 0, "malicious": 0,
             "malformed-zip": 0, "text": 0}
    evil = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo pwned"), "TUPLE1",
               "REDUCE", "STOP")
    for i in range(files):
        folder = root / f"model{i % 12:02d}"
        folder.mkdir(exist_ok=True)
        kind = i % 10
        if kind <= 3:
            torch.save({f"layer{j}.weight": torch.randn(16, 16) for j in range(1 + i % 40)},
                       folder / f"pytorch_model_{i}.bin")
            kinds["torch-zip"] += 1
        elif kind == 4:
            buf = io.BytesIO()
            torch.save({"w": torch.ones(8)}, buf, _use_new_zipfile_serialization=False)
            (folder / f"legacy_{i}.pt").write_bytes(buf.getvalue())
            kinds["torch-legacy"] += 1
        elif kind == 5:
            np.save(folder / f"array_{i}.npy", np.arange(100 + i, dtype=np.float32))
            kinds["numpy"] += 1
        elif kind == 6:
            save_file({"w": np.ones((8, 8), dtype=np.float32)}, str(folder / f"model_{i}.safetensors"))
            kinds["safetensors"] += 1
        elif kind == 7:
            if i % 20 == 7:
                (folder / f"broken_{i}.pt").write_bytes(b"PK\x03\x04" + os.urandom(300))
                kinds["malformed-zip"] += 1
            else:
                (folder / f"evil_{i}.pkl").write_bytes(evil)
                kinds["malicious"] += 1
        else:
            (folder / f"notes_{i}.{'md' if kind == 8 else 'json'}").write_text(
                "# model card\n" if kind == 8 else json.dumps({"hidden": i}))
            kinds["text"] += 1
    return kinds


def timed(cmd: list[str], **kw: object) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - started, out


def crashed(out: subprocess.CompletedProcess[str]) -> str:
    if "Traceback" in out.stderr or "Traceback" in out.stdout:
        last = (out.stderr or out.stdout).strip().splitlines()[-1]
        return f"yes: {last[:90]}"
    return "no"


def run_ckptguard(folder: Path, jobs: int) -> tuple[float, int, int, str, int]:
    exe = str(Path(sys.executable).with_name("ckptguard"))
    seconds, out = timed([exe, "scan", str(folder), "-j", str(jobs), "--format", "jsonl", "--no-progress"])
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    flagged = sum(r["verdict"] != "safe" for r in reports)
    return seconds, len(reports), flagged, crashed(out), out.returncode


def run_picklescan(exe: str, folder: Path) -> tuple[float, str, str, str]:
    seconds, out = timed([exe, "-p", str(folder)])
    text = out.stdout + out.stderr
    scanned = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.lower().startswith("scanned files")), "?")
    infected = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                     if line.lower().startswith("infected files")), "?")
    return seconds, scanned, infected, crashed(out)


def run_modelscan(exe: str, folder: Path, report: Path) -> tuple[float, str, str, str]:
    seconds, out = timed([exe, "-p", str(folder), "-r", "json", "-o", str(report)])
    scanned = flagged = "?"
    try:
        summary = json.loads(report.read_text())
        scanned = str(summary["summary"]["scanned"]["total_scanned"])
        flagged = str(len({i.get("source") for i in summary.get("issues", [])}))
        errors = summary.get("errors") or []
        if errors:
            flagged += f" ({len(errors)} errors)"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return seconds, scanned, flagged, crashed(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=295)
    parser.add_argument("--tools-bin", help="folder with picklescan / modelscan executables")
    parser.add_argument("--per-file-sample", type=int, default=0,
                        help="also time one ckptguard process per file on this many files")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        kinds = build_folder(folder, args.files)
        total = sum(1 for p in folder.rglob("*") if p.is_file())
        print(f"folder: {total} files {kinds}; {cores} cores")
        print(f"{'tool':<28} {'wall s':>8} {'judged':>8} {'flagged':>10}  crashed")
        rows: dict[int, float] = {}
        for jobs in sorted({1, cores}):
            seconds, judged, flagged, crash, code = run_ckptguard(folder, jobs)
            rows[jobs] = seconds
            print(f"{f'ckptguard scan -j {jobs}':<28} {seconds:>8.2f} {judged:>8} {flagged:>10}  "
                  f"{crash} (exit {code})")
        if cores > 1:
            print(f"-j {cores} speedup over -j 1: {rows[1] / rows[cores]:.2f}x")
        if args.per_file_sample:
            exe = str(Path(sys.executable).with_name("ckptguard"))
            sample = sorted(p for p in folder.rglob("*") if p.is_file())[: args.per_file_sample]
            started = time.perf_counter()
            for path in sample:
                subprocess.run([exe, "scan", str(path), "-q", "-j", "1"], capture_output=True)
            each = (time.perf_counter() - started) / len(sample)
            print(f"{'one process per file':<28} {each * total:>8.2f} (extrapolated from {len(sample)})")
        search = os.pathsep.join(filter(None, [args.tools_bin, os.environ.get("PATH")]))
        picklescan = shutil.which("picklescan", path=search)
        modelscan = shutil.which("modelscan", path=search)
        if picklescan:
            seconds, scanned, infected, crash = run_picklescan(picklescan, folder)
            print(f"{'picklescan -p':<28} {seconds:>8.2f} {scanned:>8} {infected:>10}  {crash}")
        else:
            print("picklescan: not found (see --tools-bin)")
        if modelscan:
            seconds, scanned, flagged, crash = run_modelscan(modelscan, folder, Path(tmp) / "ms.json")
            print(f"{'modelscan -p -r json':<28} {seconds:>8.2f} {scanned:>8} {flagged:>10}  {crash}")
        else:
            print("modelscan: not found (see --tools-bin)")


if __name__ == "__main__":
    main()
