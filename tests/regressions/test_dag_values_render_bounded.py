"""A few hundred bytes of pickle that the scan never finished (found by a red-team round).

A list (or tuple) DAG built from the memo, each level holding the previous one twice,
40 levels deep: 2**40 paths through a ~500-byte pickle. Two places render such a value
without bounding the total work:
* core.torch.callables.str_value (torch's words for a refused REDUCE / torch.device call)
  recurses into every path (its depth cap is 50, its length cap per container);
* core.manifest.build._storage_pid formats `{pid!r}` of a non-storage persistent id (a
  tuple DAG fed to BINPERSID in a zip): CPython's repr walks every path, in C.
Every engine hung. Messages now render input values bounded (core.values.brief, and
str_value stops past 100,000 values: torch would never finish printing such a value)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout

DEPTH = 40
TIMEOUT_S = 30   # the red-team bound for "hangs"; a fixed scan takes well under a second


def dag(kind: str) -> list[Any]:
    """Memo slot i holds a `kind` of slot i - 1 twice: 2**DEPTH paths to the int at the bottom."""
    ops: list[Any] = [("PROTO", 2), "EMPTY_LIST", ("BININT1", 1), "APPEND", ("BINPUT", 0)]
    for i in range(1, DEPTH + 1):
        pair = [("LONG_BINGET", i - 1), ("LONG_BINGET", i - 1)]
        ops += (["EMPTY_LIST", "MARK", *pair, "APPENDS"] if kind == "list" else [*pair, "TUPLE2"])
        ops.append(("LONG_BINPUT", i))
    return ops


CASES = {
    "reduce_of_a_list": lambda: asm(*dag("list"), "EMPTY_TUPLE", "REDUCE", "STOP"),
    "device_of_a_tuple": lambda: asm(("GLOBAL", "torch", "device"), *dag("tuple")[1:], "TUPLE1",
                                     "REDUCE", "STOP"),
    "persid_of_a_tuple_in_a_zip": lambda: torch_layout(
        "archive", asm(*dag("tuple"), "BINPERSID", "STOP"), []),
    "get_layout_of_a_tuple": lambda: asm(("GLOBAL", "torch.serialization", "_get_layout"),
                                         *dag("tuple")[1:], "TUPLE1", "REDUCE", "STOP"),
    "encode_of_a_tuple": lambda: asm(("GLOBAL", "_codecs", "encode"), *dag("tuple")[1:],
                                     ("BINUNICODE", "latin1"), "TUPLE2", "REDUCE", "STOP"),
    "size_of_a_tuple": lambda: asm(("GLOBAL", "torch", "Size"), *dag("tuple")[1:], "TUPLE1",
                                   "REDUCE", "STOP"),
    "newobj_of_a_list": lambda: asm(*dag("list"), "EMPTY_TUPLE", "NEWOBJ", "STOP"),
}

SCAN = ("import sys; from ckptguard.core.scan import scan_path; "
        "from ckptguard.core.state import ScanOptions; "
        "r = scan_path(sys.argv[1], options=ScanOptions(engine=sys.argv[2])); "
        "print(r.verdict, *sorted({f.code for f in r.findings}))")


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("engine", ["exact", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dag_values_are_rendered_in_bounded_time(tmp_path: Path, case: str, engine: str) -> None:
    path = tmp_path / "dag.pt"
    data = CASES[case]()
    assert len(data) < 4096
    path.write_bytes(data)
    try:
        done = subprocess.run([sys.executable, "-c", SCAN, str(path), engine], capture_output=True,
                              text=True, timeout=TIMEOUT_S, preexec_fn=_cap_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the scan of a {len(data)}-byte file ran past {TIMEOUT_S} s")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "INTERNAL_ERROR" not in done.stdout.split()
