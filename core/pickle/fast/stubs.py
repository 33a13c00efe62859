"""C-speed path for the common case: a clean torch pickle, judged without Python's pickle
ever touching a real global.

Strategy (the bench behind it: bench/scan_bench.py): the exact interpreters
(core.torch.weights_only + core.pickle.vm) run ~1 M opcodes/s, and a 100k-tensor data.pkl has 3 M.
Most checkpoints are clean, so we first try to prove this one is:

1. `core.pickle.fast.tokenize.tokenize` walks the opcodes exactly (one compiled regex,
   the length-prefixed ones and MARKs in Python) and declines unless every opcode is in
   torch's accepted set, every GLOBAL is allowlisted, every memo index is small and no
   cap of `Limits` can be reached;
2. the C `_pickle.Unpickler` then builds the value graph, but `find_class` returns only
   our own inert stub classes and `persistent_load` our `PersId` nodes. The stubs
   accept exactly the operations torch's restricted unpickler accepts on a clean
   state_dict (OrderedDict() + SETITEMS + BUILD, rebuild calls) and raise `Decline` for
   anything else, including any list that receives SETITEM and any tuple dict key
   (EMPTY_LIST and EMPTY_DICT are rewritten: `pickletoken.CheckedList`/`CheckedDict`).

Any doubt raises `Decline` and the caller runs the exact interpreters instead. So this
path can only be faster, never different: it answers "loadable" only for pickles the
exact path would also load, and gives the same globals, storages and graph shape.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptguard.core.errors import Decline
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.fast.containers import BuildLedger, OrderedDictStub
from ckptguard.core.pickle.fast.tokenize import StubUnpickler, Tokens, tokenize
from ckptguard.core.records import record
from ckptguard.core.values import Call, Global, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FastResult", "OrderedDictStub", "Tokens", "fast_load", "tokenize"]

class StubMeta(type):
    node: Global

    def __call__(cls, *args: Any) -> Any:
        return cls.reduce(args)

    def reduce(cls, args: tuple[Any, ...]) -> Any:
        raise Decline(f"call of {cls.node.full}")


class GlobalStub(metaclass=StubMeta):
    node: Global

    def __new__(cls, *args: Any) -> Any:  # NEWOBJ
        raise Decline(f"NEWOBJ of {cls.node.full}")


def _as_value(x: Any) -> Any:
    """Stub classes that appear as plain values become Global nodes."""
    return x.node if type(x) is StubMeta else x


# Only the rebuild calls a plain state_dict needs; the rest (quantized, sparse, meta,
# subclasses...) take the exact path, which models their argument checks.
_REBUILDERS = frozenset(("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
                         "torch._utils._rebuild_parameter"))


def _make_stub(node: Global, calls: list[Call], builds: BuildLedger,
               check_call: Callable[[str, tuple[Any, ...]], str | None] | None) -> Any:
    full = node.full
    if full == "collections.OrderedDict":
        return type("OrderedDict", (OrderedDictStub,), {"builds": builds})
    if full not in _REBUILDERS:
        return StubMeta(node.name, (GlobalStub,), {"node": node})

    def reduce(cls: type, args: tuple[Any, ...]) -> Any:
        if StubMeta in map(type, args):  # a dtype/layout global among the arguments
            args = tuple(map(_as_value, args))
        call = Call(node, args)
        if check_call is not None:
            call.attrs["dtype"] = check_call(full, args)
        calls.append(call)
        return call
    return StubMeta(node.name, (GlobalStub,), {"node": node, "reduce": classmethod(reduce)})


@record(slots=True)
class FastResult:
    root: Any
    tokens: Tokens
    calls: list[Call]
    persids: list[PersId]


def fast_load(data: bytes, *, allowed: Callable[[str], bool],
              check_pid: Callable[[tuple[Any, ...]], None],
              check_call: Callable[[str, tuple[Any, ...]], str | None] | None = None,
              limits: Limits = DEFAULT_LIMITS) -> FastResult:
    """Build the value graph of a clean torch pickle at C speed, or raise Decline.

    `check_pid` validates a persistent id like torch's persistent_load + the container
    (record present, exact size) and raises Decline otherwise; `check_call` may veto a
    rebuild call's arguments (torch's own checks, core.torch.rules.check_rebuild) by raising
    Decline. Past a cap of `limits`, or where one might be reached, it declines too (the
    exact interpreters report the cap).
    """
    toks = tokenize(data, allowed, newobj=True, limits=limits)
    calls: list[Call] = []
    persids: list[PersId] = []

    class _Unpickler(StubUnpickler):
        def make_stub(self, module: str, name: str) -> Any:
            return _make_stub(Global(module, name), calls, self.builds, check_call)

        def persistent_load(self, pid: Any) -> Any:
            if type(pid) is not tuple or len(pid) < 2:
                raise Decline("persistent id is not a storage tuple")
            if type(pid[1]) is StubMeta:
                pid = (pid[0], pid[1].node, *pid[2:])
            check_pid(pid)
            node = PersId(pid)
            persids.append(node)
            return node

    root = _Unpickler(data, toks, BuildLedger(limits.max_build_state_keys)).load_or_decline()
    return FastResult(root, toks, calls, persids)
