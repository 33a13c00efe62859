"""The architecture as a test: data flows one way, source -> sniff -> zip -> pickle -> torch
rules -> threats -> judge -> manifest -> formats -> lane -> scan -> loader, app, and the
public API (`ckptguard/__init__.py`) on top.

Every import counts, at module level and inside functions (a local import that runs back
up a layer is still a dependency), TYPE_CHECKING blocks included. A module may import
its own layer or a lower one; the graph has no cycles; core never imports app.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module belongs to the longest prefix listed.
LAYERS: tuple[tuple[str, ...], ...] = (
    # base: the error tree, caps, value nodes, the report and its accumulator, and the zip
    # format's byte layout (pure spec data: the remote source speculates with it)
    ("ckptguard.core", "ckptguard.core.errors", "ckptguard.core.limits", "ckptguard.core.values",
     "ckptguard.core.report", "ckptguard.core.state", "ckptguard.core.zip.layout",
     "ckptguard.core.regions.region"),   # a region record: every layer may declare one
    ("ckptguard.core.io",),
    # what a file's first bytes say: the sniff, and an .npy header (numpy's literal grammar)
    ("ckptguard.core.sniff", "ckptguard.core.pyliteral", "ckptguard.core.npyheader"),
    ("ckptguard.core.zip",),
    ("ckptguard.core.pickle",),
    ("ckptguard.core.torch",),
    ("ckptguard.core.threats",),
    ("ckptguard.core.judge", "ckptguard.core.regions"),   # regions are judged as pickles are
    ("ckptguard.core.manifest",),
    ("ckptguard.core.formats",),
    ("ckptguard.core.lane",),
    ("ckptguard.core.scan",),
    ("ckptguard.core.loader",),
    ("ckptguard.app", "ckptguard.__main__"),   # the service and the console entry
    # the public API on top: it re-exports core's functions and `scan(target)`
    # (ckptguard.app.api), whose folders, globs and hf:// targets need the app's hub client
    ("ckptguard",),
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    top = rel.parts[0]   # core, app or ckptguard: installed, all three are under ckptguard
    parts = list(rel.with_suffix("").parts)
    if top in ("core", "app"):
        parts = ["ckptguard", *parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [*ROOT.joinpath("core").rglob("*.py"), *ROOT.joinpath("app").rglob("*.py"),
             ROOT / "ckptguard" / "__init__.py", ROOT / "ckptguard" / "__main__.py"]
    return {_module_name(p): p for p in files if "migrations" not in p.parts}


MODULES = _sources()


def _resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """Every ckptguard module an import statement loads (a `from pkg import mod` loads mod)."""
    out: list[str] = []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] in ("ckptguard", "core", "app")]
    base = node.module or ""
    if node.level:
        pkg = module.split(".")
        if not MODULES[module].name == "__init__.py":
            pkg = pkg[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join([*pkg, base] if base else pkg)
    if base.split(".")[0] not in ("ckptguard", "core", "app"):
        return out
    for alias in node.names:
        full = f"{base}.{alias.name}"
        out.append(full if full in MODULES else base)
    return out


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(_resolve(name, node))
        edges[name] = {t for t in targets if t != name}
    return edges


EDGES = _edges()


def _layer(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{module} belongs to no layer: add it to LAYERS"
    return rank


def test_every_import_is_under_the_one_installed_name() -> None:
    bad = sorted(f"{m} imports {t}" for m, ts in EDGES.items() for t in ts
                 if t.split(".")[0] in ("core", "app"))
    assert not bad, "import ckptguard.core.x / ckptguard.app.x, never core.x or app.x:\n" + "\n".join(bad)


def test_every_import_exists() -> None:
    missing = sorted(f"{m} imports {t}" for m, ts in EDGES.items() for t in ts if t not in MODULES)
    assert not missing, "\n".join(missing)


def test_core_never_imports_app() -> None:
    bad = sorted(f"{m} -> {t}" for m, ts in EDGES.items() if m.startswith("ckptguard.core")
                 for t in ts if t.startswith("ckptguard.app") or t == "ckptguard")
    assert not bad, "\n".join(bad)


def test_no_import_runs_up_a_layer() -> None:
    bad = sorted(f"{m} (layer {_layer(m)}) -> {t} (layer {_layer(t)})"
                 for m, ts in EDGES.items() for t in ts if t in MODULES and _layer(t) > _layer(m))
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_cycles() -> None:
    # Tarjan's strongly connected components over every import (module level and local)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(EDGES.get(v, ())):
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_every_layer_has_modules(layer: int) -> None:
    """A layer nobody lives in is a typo in LAYERS that would let everything pass."""
    assert any(_layer(m) == layer for m in MODULES)
