"""Test helpers: wrap a data.pkl in a torch zip, and ask real torch 2.13 what it does.

The oracle runs in ONE fresh subprocess per batch (FORMATS.md §3.2: the user safe set
depends on what was imported; a fresh `import torch` is the emulated baseline).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

_ORACLE = r'''
import json, sys, importlib, warnings
warnings.simplefilter("ignore")
import torch
cases = json.load(open(sys.argv[1]))
out = []
def resolve(name):
    mod, _, attr = name.rpartition(".")
    obj = importlib.import_module(mod)
    return getattr(obj, attr)
for case in cases:
    allow = [(resolve(n), n) for n in case.get("allow", [])]
    res = {}
    try:
        with torch.serialization.safe_globals(allow):
            if case.get("mode") == "baseline":
                res["globals"] = sorted(f"{f.__module__}.{f.__qualname__}"
                                        for f in torch.serialization.get_safe_globals())
            elif case.get("mode") == "unsafe":
                res["globals"] = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(case["path"]))
            else:
                torch.load(case["path"], weights_only=True)
        res["ok"] = True
    except BaseException as e:
        res.update(ok=False, type=type(e).__name__, msg=str(e) if not isinstance(e, KeyError) else str(e))
    out.append(res)
json.dump(out, open(sys.argv[2], "w"))
'''


def write_zip(path: Path, pkl: bytes, records: dict[str, bytes] | None = None,
              prefix: str = "archive") -> Path:
    """A stored zip that torch.load reads: data.pkl, metadata records, `records` (data/<k>...)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        recs = {".format_version": b"1", ".storage_alignment": b"64", "byteorder": b"little",
                **(records or {})}
        recs.setdefault("version", b"3\n")
        zf.writestr(f"{prefix}/data.pkl", pkl)
        for name, data in recs.items():
            zf.writestr(f"{prefix}/{name}", data)
    return path


def run_oracle(cases: list[dict[str, Any]], workdir: Path) -> list[dict[str, Any]]:
    """Each case: {"path": str, "allow": [names], "mode": "load"|"unsafe"} -> torch's outcome."""
    src = workdir / "oracle_cases.json"
    dst = workdir / "oracle_out.json"
    src.write_text(json.dumps(cases))
    subprocess.run([sys.executable, "-c", _ORACLE, str(src), str(dst)], check=True, timeout=600)
    result: list[dict[str, Any]] = json.loads(dst.read_text())
    return result


def zip_records(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """(data.pkl, {record: bytes}) of a torch.save zip, names without the prefix."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        prefix = names[0].split("/", 1)[0]
        recs = {n[len(prefix) + 1:]: zf.read(n) for n in names}
    return recs.pop("data.pkl"), recs
