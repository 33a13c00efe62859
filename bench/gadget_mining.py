"""Gadget mining for the threat table (issue 18, item 4; docs/threat-inventory.md).

    python bench/gadget_mining.py [--all] [ROOT ...]

Reads (never imports) every module under the roots (default: this interpreter's standard
library and site-packages) and lists the functions and methods whose parameters reach a sink
that runs code or loads something: `eval`, `exec`, `__import__`, a process (`os.system`,
`subprocess.*`, `os.exec*`), another deserializer (`pickle.load(s)`, `marshal.loads`,
`torch.load`, ...), directly or through one call of a function of the same module that does
(second order). This is the "risky function surface" method of arXiv 2508.19774, whose own
gadget list is not published. Prints how many functions reach a sink and those that
`classify_global` does not call dangerous (with `--all`, every one): each is then read by
hand and either listed in core/threats/table.py with a row in
tests/regressions/test_threat_inventory.py, or noted as not a gadget in the inventory.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import sysconfig

from ckptguard.core.threats.assess import classify_global

SINK_NAMES = frozenset({"eval", "exec", "__import__"})
SINK_CALLS = frozenset({
    ("os", "system"), ("os", "popen"), ("os", "execv"), ("os", "execvp"), ("os", "execvpe"),
    ("os", "spawnv"), ("os", "posix_spawn"), ("subprocess", "Popen"), ("subprocess", "run"),
    ("subprocess", "call"), ("subprocess", "check_output"), ("subprocess", "check_call"),
    ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"), ("pickle", "load"),
    ("pickle", "loads"), ("_pickle", "loads"), ("cPickle", "loads"), ("dill", "loads"),
    ("marshal", "loads"), ("importlib", "import_module"), ("runpy", "run_path"),
    ("runpy", "run_module"), ("yaml", "unsafe_load"), ("torch", "load")})
# test suites, tools and build helpers: not importable from a checkpoint's environment
SKIP_DIRS = frozenset({"tests", "test", "testing", "__pycache__", "idlelib", "lib2to3", "_pytest",
                       "mypy", "hypothesis", "xdist", "pip", "setuptools", "_distutils",
                       "torchgen"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _sink(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name) and f.id in SINK_NAMES:
        return f.id
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            and (f.value.id, f.attr) in SINK_CALLS:
        return f"{f.value.id}.{f.attr}"
    return None


def _params(fn: Function) -> set[str]:
    a = fn.args
    names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    names |= {v.arg for v in (a.vararg, a.kwarg) if v is not None}
    return names - {"self", "cls"}


def _reaches(fn: Function, helpers: set[str]) -> bool:
    """Does a parameter of `fn` flow (by name) into a sink, or into a call of `helpers`?"""
    params = _params(fn)
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        f = call.func
        helper = (isinstance(f, ast.Name) and f.id in helpers) or (
            isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            and f.value.id in ("self", "cls") and f.attr in helpers)
        args = call.args[:1] if _sink(call) else ([*call.args, *(k.value for k in call.keywords)]
                                                  if helper else [])
        if any(isinstance(n, ast.Name) and n.id in params for a in args for n in ast.walk(a)):
            return True
    return False


def _functions(tree: ast.Module) -> dict[str, Function]:
    out: dict[str, Function] = {}

    def walk(node: ast.AST, prefix: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, [*prefix, child.name])
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out[".".join([*prefix, child.name])] = child

    walk(tree, [])
    return out


def mine(root: str) -> list[tuple[str, str]]:
    """(module, qualified name) of every function under `root` that reaches a sink."""
    found: list[tuple[str, str]] = []
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if any(p in SKIP_DIRS or p == "site-packages" or p.endswith((".dist-info", ".egg-info"))
               for p in parts):
            dirs[:] = []
            continue
        for name in files:
            module = [*parts, *([] if name == "__init__.py" else [name[:-3]])]
            if not name.endswith(".py") or not module or not all(p.isidentifier() for p in module):
                continue
            try:
                with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, ValueError):
                continue
            functions = _functions(tree)
            first = {q for q, fn in functions.items() if _reaches(fn, set())}
            helpers = {q.rsplit(".", 1)[-1] for q in first}
            found += [(".".join(module), q) for q, fn in functions.items()
                      if q in first or _reaches(fn, helpers)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", help="folders to read (default: stdlib, site-packages)")
    parser.add_argument("--all", action="store_true", help="list the dangerous ones too")
    args = parser.parse_args()
    paths = sysconfig.get_paths()
    roots = args.roots or [paths["stdlib"], paths["purelib"]]
    found = sorted({hit for root in roots for hit in mine(root)})
    judged = [(m, q, classify_global(m, q).status) for m, q in found]
    open_ = [row for row in judged if row[2] != "dangerous"]
    print(f"{len(found)} functions reach a sink; {len(open_)} not dangerous in the table",
          file=sys.stderr)
    for module, qual, status in judged if args.all else open_:
        print(f"{module}\t{qual}\t{status}")


if __name__ == "__main__":
    main()
