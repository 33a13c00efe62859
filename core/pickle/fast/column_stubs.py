"""The C unpickler over a clean torch pickle, with stubs that cost no Python per tensor.

Strategy (the fast lane, core.lane.torch_zip): `core.pickle.fast.stubs` already proves clean pickles at C
speed, but its stubs run Python for every rebuild call and persistent id. Here the stubs
are built so the C `_pickle.Unpickler` does almost everything itself:

* a rebuild function (`_rebuild_tensor_v2/_v3`, `_rebuild_parameter`) becomes a
  `BaseException` subclass: REDUCE constructs it in C and `.args` keeps the arguments;
  its `__init__` only appends the instance to a list, so calls that end up unreachable
  (a dict key set twice, leftovers on the stack at STOP) are still validated, as torch
  runs every call;
* `collections.OrderedDict` becomes a dict subclass whose `__init__` is `dict.clear`,
  so `OrderedDict(anything)` fails (left to the exact interpreters) and `OrderedDict()`
  costs a C call; BUILD (`__setstate__`) keeps its state dict, as torch does;
* every other allowlisted global is an inert `StubGlobal` marker: not callable, not a
  type, so any use beyond being an argument fails inside the unpickler;
* `persistent_load` returns `(pid,)`, a 1-tuple only it makes: what torch returns is a
  storage, not the id, so the id itself (a memoized pid tuple fetched again) or the
  result fed to BINPERSID again must not pass for one (checked by identity in fastlane).

`tokenize` walks every opcode first (one compiled regex; GLOBAL, PROTO, EMPTY_LIST, MARK
outside a tensor entry and unusual lengths reach Python) and declines on any opcode torch's
unpickler refuses, on NEWOBJ (torch accepts it only for a few classes), on any global
outside the allowlist, on large memo indexes and wherever a cap of `Limits` might be
reached. Anything unusual raises `Decline`: the caller then uses the exact interpreters,
so this path can only be faster, never different.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptguard.core.errors import Decline
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.fast.containers import BuildLedger, CheckedDict
from ckptguard.core.pickle.fast.tokenize import StubUnpickler, Tokens, tokenize
from ckptguard.core.records import record

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any


class StubGlobal(tuple[str, str]):
    """An allowlisted global used as a value (a storage class, a dtype): (module, name)."""

    __slots__ = ()

    @property
    def full(self) -> str:
        return f"{self[0]}.{self[1]}"


class StubDict(CheckedDict):
    """`OrderedDict()`: a dict (that refuses tuple keys, as every dict of this path does).
    `dict.clear` as `__init__` takes no arguments, so
    `OrderedDict(pairs)` raises in C (the exact path models it) and `OrderedDict()` costs
    no Python frame. (`object.__init__` would not do: it accepts arguments silently when
    the class's `__new__` is not object's.) No `__dict__`: BUILD's attributes go to the
    per-load `attributes` table, so the 10k empty hook dicts of a state_dict stay small."""

    __slots__ = ()
    __init__ = dict.clear  # type: ignore[assignment]
    attributes: dict[int, tuple[StubDict, dict[Any, Any]]]
    builds: BuildLedger    # the loading StubUnpickler's judged BUILDs

    def __setstate__(self, state: Any) -> None:   # BUILD: torch updates __dict__
        self.builds.judge(state)
        self.attributes.setdefault(id(self), (self, {}))[1].update(state)


class RebuildCall(BaseException):
    """A rebuild call captured in C: `.args` are its arguments. Subclassed per function."""

    made: list[RebuildCall]

    def __init__(self, *args: Any) -> None:
        self.made.append(self)

    def __setstate__(self, state: Any) -> None:   # BUILD on a tensor: the exact path models it
        raise Decline("BUILD on a rebuilt tensor")


class RebuildV2(RebuildCall):
    __slots__ = ()


class RebuildV3(RebuildCall):
    __slots__ = ()


class RebuildParameter(RebuildCall):
    __slots__ = ()


_REBUILD_STUBS: dict[tuple[str, str], type[RebuildCall]] = {
    ("torch._utils", "_rebuild_tensor_v2"): RebuildV2,
    ("torch._utils", "_rebuild_tensor_v3"): RebuildV3,
    ("torch._utils", "_rebuild_parameter"): RebuildParameter,
}


@record(slots=True)
class Loaded:
    root: Any
    tokens: Tokens
    pids: list[Any]                       # every persistent id, in load order
    refs: list[tuple[Any]]                # what persistent_load returned for each: (pid,)
    calls: dict[type[RebuildCall], list[RebuildCall]]   # every rebuild call, per function
    kinds: dict[type, type[RebuildCall]]  # this load's stub class -> its base above
    dict_type: type[StubDict]             # this load's OrderedDict stand-in
    attributes: dict[int, tuple[StubDict, dict[Any, Any]]]  # id -> (OrderedDict, BUILD state)


class _StubUnpickler(StubUnpickler):
    """Our stubs over the shared C-unpickler driver. No closures: nothing here may form a
    reference cycle, or the whole value graph would wait for the cyclic GC to be freed."""

    def __init__(self, data: bytes, toks: Tokens, stubs: dict[tuple[str, str], Any],
                 refs: list[tuple[Any]], builds: BuildLedger) -> None:
        super().__init__(data, toks, builds)
        self.stubs.update(stubs)
        self.refs = refs

    def make_stub(self, module: str, name: str) -> Any:
        return StubGlobal((module, name))

    def persistent_load(self, pid: Any) -> Any:
        ref = (pid,)
        self.refs.append(ref)
        return ref


def load(data: bytes, allowed: Callable[[str], bool], *,
         limits: Limits = DEFAULT_LIMITS) -> Loaded:
    """Build the value graph of a clean torch pickle at C speed, or raise Decline (also past a
    cap of `limits`, or where one might be reached: the exact interpreters report the cap)."""
    toks = tokenize(data, allowed, limits=limits)
    refs: list[tuple[Any]] = []
    # one class per load: `made` must not be shared between concurrent scans
    made: dict[type[RebuildCall], list[RebuildCall]] = {b: [] for b in _REBUILD_STUBS.values()}
    kinds: dict[type, type[RebuildCall]] = {}
    stubs: dict[tuple[str, str], Any] = {}
    for key, base in _REBUILD_STUBS.items():
        stub = type(base.__name__, (base,), {"__slots__": (), "made": made[base]})
        stubs[key] = stub
        kinds[stub] = base
    attributes: dict[int, tuple[StubDict, dict[Any, Any]]] = {}
    builds = BuildLedger(limits.max_build_state_keys)
    dict_type = type("OrderedDict", (StubDict,), {"__slots__": (), "attributes": attributes,
                                                   "builds": builds})
    stubs[("collections", "OrderedDict")] = dict_type

    try:
        root = _StubUnpickler(data, toks, stubs, refs, builds).load_or_decline()
    finally:
        # the stub classes must not keep the instances (a class <-> instance cycle)
        calls = {base: list(found) for base, found in made.items()}
        for found in made.values():
            found.clear()
        built = dict(attributes)
        attributes.clear()
    pids = [ref[0] for ref in refs]
    return Loaded(root, toks, pids, refs, calls, kinds, dict_type, built)
