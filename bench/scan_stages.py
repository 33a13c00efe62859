"""Where a torch-zip scan spends its time, stage by stage (best of 3, warm, in-process).

    python bench/scan_stages.py PATH.pt

The stages are the ones `core.formats.torch_zip.analyze_zip` runs; the sum is lower than a
full `scan_path` by the cost of freeing the value graph.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.analysis import Analysis
from core.formats import torch_zip
from core.pickle_scan import scan_pickle
from core.scan import scan_path
from core.source import FileSource
from core.tensors import SiteTable, build_manifest
from core.zipcheck import check_archive
from core.zipdir import read_directory, read_local_headers, read_record


def timed(label: str, fn: Callable[[], Any]) -> Any:
    best, result = float("inf"), None
    for _ in range(3):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    print(f"{label:<24}{best * 1000:9.1f} ms")
    return result


def main() -> None:
    path = Path(sys.argv[1])
    src = FileSource(path)
    directory = timed("read_directory", lambda: read_directory(src))
    prefix = directory.prefix()
    locals_ = timed("read_local_headers", lambda: read_local_headers(src, directory.entries))
    timed("check_archive", lambda: check_archive(directory, locals_, Analysis()))
    data = timed("read data.pkl", lambda: read_record(src, directory, f"{prefix}/data.pkl"))
    resolver = torch_zip.ZipStorageResolver(directory, prefix)
    scan = timed("scan_pickle", lambda: scan_pickle(data, Analysis(), record="data.pkl",
                                                    base_offset=0, resolver=resolver))
    print(f"{'  (fast path used)':<24}{scan.fast!s:>9}")
    storages = [(u.key, u.nbytes) for u in scan.storages]
    sites = timed("storage sites + chain", lambda: torch_zip._storage_sites(
        src, directory, prefix, {".format_version": b"1"}, locals_, storages, Analysis()))
    timed("build_manifest", lambda: build_manifest(scan.root, SiteTable(sites), Analysis()))
    timed("scan_path (total)", lambda: scan_path(path))


if __name__ == "__main__":
    main()
