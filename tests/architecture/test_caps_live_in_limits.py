"""Every resource cap of ours lives in `Limits` (core/limits.py), where a caller can change it
and where one look shows them all. A module-level `MAX_*` constant elsewhere must be one of
the named exceptions below, each with the reason it is not ours to tune."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "core"

# name -> why it is not a cap of ours
NOT_OURS = {
    # copies of a reference implementation's own limit, beside the parser that mirrors it
    "pickle/opcodes.py:MAX_INT_DIGITS": "CPython's int/str conversion limit (sys.int_info)",
    "formats/safetensors.py:MAX_HEADER_SIZE": "the safetensors library's MAX_HEADER_SIZE",
    "manifest/keynames.py:_MAX_DEVICE_INDEX": "c10::DeviceIndex is int8 in torch",
    # thresholds where a C-speed path declines to the exact engine (no verdict depends on them)
    "pickle/fast/tokenize.py:_MAX_MEMO_INDEX_FLOOR": "fast-path decline threshold",
    "pickle/fast/tokenize.py:_MAX_MEMO_BITS": "the widest memo index the fast path's regex takes",
    "lane/torch_zip.py:_MAX_NUMEL": "fast-lane decline threshold",
    "torch/rules.py:MAX_COLUMN_EXTENT": "fast-lane decline threshold",
    "torch/rules.py:MAX_COLUMN_DIMS": "fast-lane decline threshold",
    # where torch's answer starts to depend on the machine, not a cost of the scan
    "torch/rules.py:_MAX_ALLOCATION_MODELLED": "past it the loader's memory decides torch.load",
    # how a value is *named or classified*, not how much work a scan may do
    "pickle/vm.py:_MAX_KEY_DEPTH": "a deeper dict key is named Unhashable (a naming rule)",
    "pickle/vm.py:_MAX_KEY_NODES": "a larger dict key is named Unhashable (a naming rule)",
    "pickle/vm.py:_MAX_KEY_INT_BITS": "a larger int key is named Unhashable (a naming rule)",
    "manifest/keynames.py:_MAX_SET_MEMBERS": "a larger set key is named by its size (a naming rule)",
    "manifest/build.py:_MAX_WRAPPERS": "torch nests at most parameter(from_type(v2)): deeper is not torch",
    "threats/graph.py:_MAX_PATH_DEPTH": "how deep a call chain is spelled out in a finding",
    "pyliteral.py:MAX_DEPTH": "the .npy header grammar: numpy writes flat dicts",
    "formats/export/expressions.py:_MAX_EXPR_DEPTH": "the plain-expression grammar torch writes",
    "formats/export/expressions.py:_MAX_CONST_BITS": "the plain-expression grammar torch writes",
    "formats/export/expressions.py:_MAX_EXPONENT": "the plain-expression grammar torch writes",
    "formats/export/expressions.py:_MAX_FLOAT_PRECISION": "the plain-expression grammar torch writes",
}


def _module_caps() -> set[str]:
    found: set[str] = set()
    for path in CORE.rglob("*.py"):
        rel = path.relative_to(CORE).as_posix()
        if rel == "limits.py":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                if isinstance(target, ast.Name) and target.id.lstrip("_").startswith("MAX_"):
                    found.add(f"{rel}:{target.id}")
    return found


def test_no_cap_of_ours_outside_limits() -> None:
    assert _module_caps() - NOT_OURS.keys() == set(), "move these into Limits (core/limits.py)"


def test_the_exceptions_still_exist() -> None:
    assert NOT_OURS.keys() - _module_caps() == set(), "stale entries in NOT_OURS"
