"""Static reading of the call graph a pickle builds: what a value resolves to, and
bounded renderings of it for messages. Pure functions over core.values nodes.

    getattr(__import__('os'), 'system')   -> resolve_path(...) == "os.system"
    operator.attrgetter('system')(m)      -> "<m>.system"
"""

from __future__ import annotations

from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.values import Call, Global, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

_MAX_PATH_DEPTH = 16

_IMPORTERS = frozenset({"builtins.__import__", "importlib.import_module", "importlib.__import__",
                        "pkgutil.resolve_name", "pydoc.locate", "sys.modules.get",
                        "operator.getitem", "_operator.getitem"})
_GETATTRS = frozenset({"builtins.getattr", "inspect.getattr_static"})
_ATTRGETTERS = frozenset({"operator.attrgetter", "_operator.attrgetter",
                          "operator.methodcaller", "_operator.methodcaller"})


def module_pid_class(persid: PersId) -> Global | None:
    """The class a legacy ('module', cls, source_file, source) persistent id resolves to."""
    pid = persid.pid
    if type(pid) is tuple and len(pid) >= 2 and pid[0] in ("module", b"module") \
            and type(pid[1]) is Global:
        return pid[1]
    return None


def payload(value: Any, level: int) -> bytes | None:
    """Bytes a nested loads would read: a literal, `_codecs.encode(s, 'latin1')`, BytesIO(...)."""
    t = type(value)
    if t is bytes or t is bytearray:
        return bytes(value)
    if t is str:
        return str(value).encode("latin-1", "ignore")
    if t is Call and level < 4 and type(value.args) is tuple and value.args:
        name = value.func_name
        if name in ("_codecs.encode", "codecs.encode") and type(value.args[0]) is str:
            return str(value.args[0]).encode("latin-1", "ignore")
        if name in ("io.BytesIO", "_io.BytesIO", "builtins.bytes", "builtins.bytearray"):
            return payload(value.args[0], level + 1)
    if t is Call:   # pickle.loads(base64.b64decode(b'...')): what pure decoders compute
        folded = constant(value)
        if type(folded) in (bytes, bytearray, str):
            return payload(folded, level + 1)
    return None


def constant(value: Any) -> Any:
    """What `value` folds to (core.pickle.fold), or None when it cannot be folded."""
    if type(value) is not Call:
        return value
    # only a call needs the folder (a small benign pickle's scan never imports it)
    from ckptguard.core.pickle.fold import FoldBudget, Unfoldable, fold

    try:
        return fold(value, limits=DEFAULT_LIMITS, budget=FoldBudget(DEFAULT_LIMITS.max_fold_calls * 4))
    except Unfoldable:
        return None


def _folded_str(value: Any) -> Any:
    """A computed argument that folds to a str (`getattr(m, b'c3lzdGVt'.decode())`), else as is."""
    if type(value) is not Call:
        return value
    folded = constant(value)
    return folded if type(folded) is str else value


def resolve_path(value: Any, level: int = 0) -> str | None:
    """The dotted path a value resolves to statically: Global, getattr/import/attrgetter chains."""
    if level > _MAX_PATH_DEPTH:
        return None
    t = type(value)
    if t is Global:
        return str(value.full)
    if t is not Call:
        return None
    args = value.args if type(value.args) is tuple else ()
    func = value.func
    if type(func) is Global:
        name = func.full
        args = tuple(_folded_str(a) for a in args[:8])
        if name in _GETATTRS and len(args) >= 2 and type(args[1]) is str:
            base = resolve_path(args[0], level + 1)
            return f"{base or '?'}.{args[1]}"
        if name in _IMPORTERS and args and type(args[-1]) is str:
            if len(args) >= 2 and name.endswith("getitem"):
                base = resolve_path(args[0], level + 1)
                return f"{base or '?'}.{args[1]}"
            return str(args[0]) if type(args[0]) is str else None
        return None
    if type(func) is Call and func.func_name in _ATTRGETTERS:
        fargs = func.args if type(func.args) is tuple else ()
        if fargs and type(fargs[0]) is str and args:
            base = resolve_path(args[0], level + 1)
            return f"{base or '?'}.{fargs[0]}"
    return None


def preview(value: Any, budget: int = 80) -> str:
    """A short, bounded rendering of call arguments (cycles and huge values are safe)."""
    out: list[str] = []
    _render(value, out, 0)
    text = "".join(out)
    return text if len(text) <= budget else text[: budget - 3] + "..."


def _render(value: Any, out: list[str], level: int) -> None:
    if sum(map(len, out)) > 120:
        return
    t = type(value)
    if t is tuple or t is list:
        if level > 2:
            out.append("...")
            return
        inner = value[:4]
        for i, v in enumerate(inner):
            if i:
                out.append(", ")
            _render(v, out, level + 1)
        if len(value) > 4:
            out.append(", ...")
    elif t is str or t is bytes:
        out.append(repr(value[:60]))
    elif t is Global:
        out.append(value.full)
    elif t is Call:
        path = resolve_path(value)
        out.append(path if path else f"{value.func_name or '<call>'}(...)")
    elif t in (int, float, bool) or value is None:
        out.append(repr(value)[:40])
    else:
        out.append(f"<{t.__name__}>")
