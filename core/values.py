"""Inert value nodes that the pickle interpreters build instead of real objects.

A pickle is interpreted into a graph of plain Python data (None, bool, int, float,
str, bytes, list, tuple, dict, set, frozenset) and these nodes, which stand for
what would have been imported or called. Nothing here imports or calls anything
from the input: a `Global` is just two strings.

    GLOBAL torch._utils _rebuild_tensor_v2      -> Global("torch._utils", "_rebuild_tensor_v2")
    ... REDUCE                                  -> Call(func=Global(...), args=(...))
    BINPERSID ('storage', ...)                  -> PersId(pid=(...))

`Call` is mutable on purpose: BUILD, SETITEM(S) and APPEND(S) applied to an
object that is a call result are recorded on the node, in order.
"""

from __future__ import annotations

import reprlib

from ckptguard.core.records import field, record

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any


@record(frozen=True, slots=True)
class Global:
    """A reference to `module.name` (after pickle's Python 2 name mapping); never resolved."""

    module: str
    name: str

    @property
    def full(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"Global({self.full})"


@record(eq=False, slots=True)
class Call:
    """The result of calling `func` (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ) — never performed."""

    func: Any
    args: Any                      # normally a tuple; hostile pickles may push anything
    opcode: str = "REDUCE"
    offset: int = -1               # offset (in the file) of the opcode that made the call
    kwargs: Any = None             # NEWOBJ_EX only
    state: list[Any] = field(default_factory=list)          # BUILD states, in order
    setitems: list[tuple[Any, Any]] = field(default_factory=list)  # SETITEM(S) on this object
    appends: list[Any] = field(default_factory=list)        # APPEND(S) on this object
    attrs: dict[str, Any] = field(default_factory=dict)     # free-form annotations

    @property
    def func_name(self) -> str | None:
        return self.func.full if isinstance(self.func, Global) else None

    def __repr__(self) -> str:
        return f"Call({self.func!r}, {self.opcode}, @{self.offset})"


@record(eq=False, slots=True)
class PersId:
    """A persistent reference (BINPERSID / PERSID): in torch, a storage."""

    pid: Any
    offset: int = -1

    def __repr__(self) -> str:
        return f"PersId({brief(self.pid)})"


@record(eq=False, slots=True)
class ExtRef:
    """EXT1/EXT2/EXT4: a copyreg extension code; the global behind it is unknowable."""

    code: int
    offset: int = -1


@record(eq=False, slots=True)
class Buffer:
    """NEXT_BUFFER / READONLY_BUFFER: out-of-band data the file does not contain."""

    readonly: bool
    offset: int = -1


@record(eq=False, slots=True)
class Unhashable:
    """Wraps a value used as a dict key or set member that Python cannot hash (a list)."""

    value: Any

    def __repr__(self) -> str:
        return f"Unhashable({brief(self.value)})"


class _Brief(reprlib.Repr):
    """reprlib's bounds (6 levels, 6 items a container, 80 characters a string), and this
    module's wrappers shown through them too."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 80

    def repr_PersId(self, x: PersId, level: int) -> str:
        return f"PersId({self.repr1(x.pid, level - 1)})"

    def repr_int(self, x: int, level: int) -> str:
        """An int in digits up to 80 of them (reprlib's cut), past ~4,000 by its size: `str`
        refuses ints past 4,300 digits, and a LONG4 may hold one."""
        if x.bit_length() > 13_000:
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)

    def repr_Unhashable(self, x: Unhashable, level: int) -> str:
        return f"Unhashable({self.repr1(x.value, level - 1)})"


_BRIEF = _Brief()


def brief(value: Any) -> str:
    """repr() of a value from a pickle for a message, bounded in depth, items and length:
    memoized parts can give a few hundred bytes 2**40 paths, which repr() would walk."""
    return _BRIEF.repr(value)


# Callees that read a container argument when they are called (REDUCE): the object they
# build holds its contents as they were then, not as a later APPEND or SETITEM on the
# memoized original leaves them. -> the index of that argument.
_READ_AT_CALL = {
    Global("builtins", "set"): 0, Global("builtins", "frozenset"): 0,
    Global("builtins", "dict"): 0, Global("collections", "OrderedDict"): 0,
    Global("collections", "Counter"): 0, Global("collections", "defaultdict"): 1,
    Global("torch._utils", "_rebuild_tensor_v2"): 6,   # metadata: conj / neg bits, set then
    Global("torch._utils", "_rebuild_tensor_v3"): 7,
}


def as_called(func: Any, args: Any) -> tuple[Any, Any]:
    """(`args` with the container a callee reads at the call (`_READ_AT_CALL`) copied, one
    level deep, as the callee copies it; the container copied, or None)."""
    at = _READ_AT_CALL.get(func) if type(func) is Global else None
    if at is None or type(args) is not tuple or len(args) <= at:
        return args, None
    arg = args[at]
    if type(arg) is dict:
        copy: Any = dict(arg)
    elif type(arg) is list:
        copy = list(arg)
    else:
        return args, None
    return (*args[:at], copy, *args[at + 1:]), arg


def as_built(state: Any) -> Any:
    """A BUILD state as `__setstate__` / `__dict__.update` take it: its dicts copied then."""
    if type(state) is dict:
        return dict(state)
    if type(state) is tuple and len(state) == 2:
        return tuple(dict(part) if type(part) is dict else part for part in state)
    return state
