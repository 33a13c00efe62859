"""What judging regions costs (issue 18): bytes read and time per carrier, in-process.

    python bench/regions_bench.py

Prints one row per case: verdict, io.bytes_read, io.region_bytes_read, regions met and left
unjudged, and the scan time (best of 3):
  clean           a torch.save-shaped archive (no region: the judge returns at once)
  appended        the same with an os.system pickle appended
  200k members    a 200,000-member zip whose last member is the payload (past the budget)
  1 GB gap/pickle a 1 GB gap before the central directory that starts like a pickle whose
                  string never ends (sparse file): the window grows to the budget only
  1 GB gap/zeros  the same gap, zeros: one sniff
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ckptguard.core.scan import scan_path  # noqa: E402
from tests.builders.carriers import appended, clean_archive, huge_gap  # noqa: E402
from tests.builders.pickle_asm import asm  # noqa: E402

PAYLOAD = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo pwned"), "TUPLE1",
              "REDUCE", "STOP")
NEVER_ENDS = asm(("PROTO", 2), ("RAW", b"X" + (100 << 20).to_bytes(4, "little")))


def _many_members(n: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for i in range(n):
            zf.writestr(f"m/{i}", PAYLOAD if i == n - 1 else b"\x00\x00")
    return buf.getvalue()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases: dict[str, Path] = {}
        for name, data in (("clean", clean_archive()), ("appended", appended(PAYLOAD)),
                           ("200k members", _many_members(200_000))):
            cases[name] = Path(tmp, name.replace(" ", "_"))
            cases[name].write_bytes(data)
        cases["1 GB gap/pickle"] = Path(tmp, "gap_pickle")
        huge_gap(cases["1 GB gap/pickle"], NEVER_ENDS)
        cases["1 GB gap/zeros"] = Path(tmp, "gap_zeros")
        huge_gap(cases["1 GB gap/zeros"], b"")
        print(f"{'case':16} {'verdict':10} {'bytes_read':>12} {'region_bytes':>12} "
              f"{'regions':>8} {'unjudged':>8} {'ms':>8}")
        for name, path in cases.items():
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                report = scan_path(path)
                best = min(best, time.perf_counter() - start)
            io_ = report.io
            print(f"{name:16} {report.verdict:10} {io_['bytes_read']:>12} "
                  f"{io_.get('region_bytes_read', 0):>12} {io_.get('regions', 0):>8} "
                  f"{io_.get('regions_unjudged', 0):>8} {best * 1000:>8.1f}")


if __name__ == "__main__":
    main()
