"""Opcodes per second of the symbolic pickle VM (core/pickle/vm.py) on a torch state_dict data.pkl.

    python bench/vm_bench.py [--tensors 100000] [--repeat 5]

Builds data.pkl of `torch.save({f"w{i}": torch.zeros(2) for i in range(N)})` in memory
and prints the best-of-N CPU time of `run_vm` over it, with pickle.py's `_Unpickler`
(pure Python, globals stubbed) and `pickletools.genops` (decode only) for scale.
"""

from __future__ import annotations

import argparse
import io
import pickle
import pickletools
import time
import zipfile
from collections.abc import Callable
from typing import Any

from ckptguard.core.pickle.vm import run_vm


def data_pkl(tensors: int) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({f"w{i}": torch.zeros(2) for i in range(tensors)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))


class _Stubbed(pickle._Unpickler):  # type: ignore[name-defined,misc]
    def find_class(self, module: str, name: str) -> Any:
        return lambda *a, **k: None

    def persistent_load(self, pid: Any) -> Any:
        return pid


def best_cpu(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = data_pkl(args.tensors)
    result = run_vm(data)
    assert result.complete, result.error
    n = result.opcode_count
    print(f"data.pkl: {len(data):,} bytes, {n:,} opcodes, {args.tensors:,} tensors")
    for label, fn in [
        ("core.pickle.vm.run_vm", lambda: run_vm(data)),
        ("pickle._Unpickler (stubbed)", lambda: _Stubbed(io.BytesIO(data)).load()),
        ("pickletools.genops", lambda: sum(1 for _ in pickletools.genops(data))),
    ]:
        t = best_cpu(fn, args.repeat)
        print(f"{label:30s} {t:7.3f} s CPU  {n / t / 1e6:5.2f} M opcodes/s")


if __name__ == "__main__":
    main()
