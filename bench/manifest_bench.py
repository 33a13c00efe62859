"""build_manifest on a 100k-tensor state_dict graph: prints the best of N runs.

    python -m bench.manifest_bench [--file CKPT.pt] [--runs 7]

Without --file the graph is synthetic (100k `_rebuild_tensor_v2` calls, distinct storages,
as `core.pickle.vm` builds them); with --file, the data.pkl of a torch zip checkpoint is
interpreted by core.pickle.vm first, and only build_manifest is
timed. Locator: a precomputed dict, as core.formats.torch_zip passes.
"""

from __future__ import annotations

import argparse
import time
import zipfile
from typing import Any

from ckptguard.core.manifest.build import StorageSite, build_manifest
from ckptguard.core.state import Analysis
from ckptguard.core.values import Call, Global, PersId


class _Sites:
    def __init__(self, sites: dict[str, StorageSite]) -> None:
        self.sites = sites

    def locate(self, key: str) -> StorageSite | None:
        return self.sites.get(key)


def synthetic(n: int) -> tuple[Any, _Sites]:
    v2, fs, od = (Global("torch._utils", "_rebuild_tensor_v2"), Global("torch", "FloatStorage"),
                  Global("collections", "OrderedDict"))
    root = Call(od, ())
    for i in range(n):
        pid = PersId(("storage", fs, str(i), "cpu", 12))
        root.setitems.append((f"block{i // 100}.layer{i % 100}.weight",
                              Call(v2, (pid, 0, (3, 4), (4, 1), False, Call(od, ())))))
    return root, _Sites({str(i): StorageSite(f"archive/data/{i}", 1000 + 64 * i, 48, True)
                         for i in range(n)})


def from_file(path: str) -> tuple[Any, _Sites]:
    from ckptguard.core.pickle.vm import run_vm
    with zipfile.ZipFile(path) as zf:
        prefix = zf.namelist()[0].split("/")[0]
        pkl = zf.read(f"{prefix}/data.pkl")
        sites = {i.filename.rsplit("/", 1)[1]: StorageSite(i.filename, i.header_offset + 64, i.file_size,
                                                           True)
                 for i in zf.infolist() if i.filename.startswith(f"{prefix}/data/")}
    return run_vm(pkl).root, _Sites(sites)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    root, sites = from_file(args.file) if args.file else synthetic(args.n)
    best, cpu = float("inf"), float("inf")
    for _ in range(args.runs):
        an = Analysis()
        t0, c0 = time.perf_counter(), time.process_time()
        build_manifest(root, sites, an)
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    per = best / max(len(an.tensors), 1) * 1e6
    print(f"build_manifest: {len(an.tensors)} tensors, {len(an.storages)} storages: "
          f"best {best * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms cpu ({per:.2f} us/tensor)")


if __name__ == "__main__":
    main()
