"""Storing a big analysis and paging its tensors, in process (issue 15).

    python bench/store_bench.py [--tensors 500000] [--url URL]

Scans a many-views checkpoint (tests/builders/many_views.py) once, then stores its report
twice (as two analyses) and prints the time of each save and how long the store's write lock
was held, then one page of GET /scans/{id}/tensors per sort under name filters (cold, then
the next page). `--url`: a database URL (default: a new SQLite file)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptguard.app.store import Store
from ckptguard.core.scan import scan_bytes
from tests.builders.many_views import many_views_checkpoint


class TimedLock:
    """The store's write lock, timed: how long each save held it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.held, self.since = inner, [], 0.0

    def __enter__(self) -> None:
        self.inner.__enter__()
        self.since = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.held.append(time.perf_counter() - self.since)
        self.inner.__exit__(*exc)


def two_pages(store: Store, stored: Any, sort: str, flt: dict[str, str]) -> tuple[list[float], int]:
    """Seconds for the first page and (if any) the next one; the filter's total."""
    times: list[float] = []
    cursor: str | None = None
    while len(times) < 2 and (cursor or not times):
        t0 = time.perf_counter()
        page = store.tensors(stored, limit=100, cursor=cursor, sort=sort, **flt)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
        cursor = page.next_cursor
    return times, page.total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=500_000)
    parser.add_argument("--url")
    args = parser.parse_args()
    t0 = time.perf_counter()
    report = scan_bytes(many_views_checkpoint(args.tensors), name="big.pt").to_json()
    print(f"scan: {args.tensors} tensors in {time.perf_counter() - t0:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="ckptguard-bench-") as tmp:
        store = Store.open(args.url or f"sqlite:///{tmp}/c.db")
        lock = TimedLock(store._write_lock)
        store._write_lock = lock
        ids = []
        for k in range(2):
            report["source"] = {**report["source"], "sha256": f"{k:064x}"}
            t0 = time.perf_counter()
            ids.append(store.save(report, policy="p", cacheable=True).id)
            print(f"save {k}: {time.perf_counter() - t0:.2f} s, write lock {lock.held[-1]:.2f} s",
                  flush=True)
        stored = store.get(ids[0])
        assert stored is not None
        worst = 0.0
        for sort in ("index", "nbytes", "-nbytes", "data_offset", "-data_offset"):
            for flt in ({"name": "VIEW1"}, {"name": "block4999"}, {"name": "nothing-matches"},
                        {"name": "view9"}, {"name": "view", "dtype": "int64"}):
                times, total = two_pages(store, stored, sort, flt)
                worst = max(worst, *times)
                print(f"tensors sort={sort:<13} {flt!s:<36} total {total:>7}  "
                      + "  ".join(f"{t * 1000:6.1f} ms" for t in times), flush=True)
        print(f"tensor page, slowest: {worst * 1000:.1f} ms", flush=True)
        store.close()


if __name__ == "__main__":
    main()
