"""Where a torch-zip scan spends its time, stage by stage (best of N, warm, in-process).

    python bench/scan_stages.py PATH.pt [--repeat N]

First the full `scan_path` with the fast lane and with the lane switched off (the general
path: core.formats.torch_zip), then the lane's stages (core.lane.torch_zip: archive columns,
opcode walk, C unpickler with stubs, storage and view columns, the manifest). The stages
keep their results alive, so their sum is below `scan_path`, which also frees the value
graph and pays one collector pass over the report's objects.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptguard.core.errors import Decline
from ckptguard.core.io.source import FileSource
from ckptguard.core.lane import torch_zip as fastlane
from ckptguard.core.pickle.fast.column_stubs import load
from ckptguard.core.pickle.fast.tokenize import tokenize
from ckptguard.core.scan import scan_path
from ckptguard.core.state import Analysis
from ckptguard.core.torch.allowlist import allowed_checker
from ckptguard.core.zip.columns import read_plain_archive


def timed(label: str, fn: Callable[[], Any], repeat: int) -> Any:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    print(f"{label:<28}{best * 1000:9.1f} ms")
    return result


def lane_stages(path: Path, repeat: int) -> None:
    src = FileSource(path)
    limits = Analysis().options.limits
    arc = timed("archive columns", lambda: read_plain_archive(src, limits), repeat)
    row = arc.folded[f"{arc.prefix}/data.pkl".lower()]
    data = src.read_at(int(arc.data_offset[row]), int(arc.size[row]))
    allowed = allowed_checker(frozenset())
    timed("opcode walk (tokenize)", lambda: tokenize(data, allowed), repeat)
    loaded = timed("walk + C unpickler", lambda: load(data, allowed), repeat)
    storages = timed("storage columns + chain", lambda: _storages(loaded, arc), repeat)
    views = timed("view columns", lambda: fastlane._Views(loaded, storages), repeat)
    found = timed("names + TensorEntry rows", lambda: fastlane._walk(
        loaded, views, storages, "x", limits), repeat)
    timed("StorageEntry rows", lambda: storages.entries(found[1], arc), repeat)


def _storages(loaded: Any, arc: Any) -> Any:
    st = fastlane._Storages(loaded.pids, loaded.refs, arc)
    st.verify_chain(arc, arc.prefix, 64)
    return st


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    # whole scans first: the stages below keep their results alive with the collector
    # paused, and the heap they leave behind would slow every later scan's GC passes
    timed("scan_path (fast lane)", lambda: scan_path(args.path), args.repeat)
    original = fastlane.try_torch_zip
    fastlane.try_torch_zip = lambda source, an: False  # type: ignore[assignment]
    try:
        timed("scan_path (general path)", lambda: scan_path(args.path), args.repeat)
    finally:
        fastlane.try_torch_zip = original
    gc.disable()   # as during a scan (core.scan pauses the collector)
    try:
        lane_stages(args.path, args.repeat)
    except Decline as exc:
        print(f"the fast lane declines this file: {exc}")
    gc.enable()


if __name__ == "__main__":
    main()
