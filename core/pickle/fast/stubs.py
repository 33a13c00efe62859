"""C-speed path for the common case: a clean torch pickle, judged without Python's pickle
ever touching a real global.

Strategy (the bench behind it: bench/scan_bench.py): the exact interpreters
(core.torch.weights_only + core.pickle.vm) run ~1 M opcodes/s, and a 100k-tensor data.pkl has 3 M.
Most checkpoints are clean, so we first try to prove this one is:

1. `core.pickle.fast.tokenize.tokenize` walks the opcodes exactly (one compiled regex,
   the length-prefixed ones in Python) and declines unless every opcode is in torch's
   accepted set, every GLOBAL is allowlisted and every memo index is small;
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

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptguard.core.pickle.fast.tokenize import (
    PLAIN_KEYS,
    BuildLedger,
    CheckedDict,
    Decline,
    StubUnpickler,
    Tokens,
    check_key,
    tokenize,
)
from ckptguard.core.torch.callables import INT64_SAFE
from ckptguard.core.torch.dtypes import FLOATING, ITEMSIZE
from ckptguard.core.values import Call, Global, PersId

__all__ = ["Decline", "FastResult", "Tokens", "check_rebuild", "fast_load", "tokenize"]

class _ODict(OrderedDict[Any, Any]):
    """`OrderedDict()` at C speed; BUILD updates `__dict__` with a dict, as torch does.
    Subclassed per load: `builds` is that load's count of judged BUILDs."""

    builds: BuildLedger
    # no arguments (`OrderedDict(pairs)` raises in C: the exact path models it); an
    # OrderedDict is valid without its __init__, which only adds the arguments
    __init__ = dict.clear  # type: ignore[assignment]

    def __setitem__(self, key: Any, value: Any) -> None:   # see pickletoken.CheckedDict
        if type(key) not in PLAIN_KEYS or key != key:
            check_key(key)
        OrderedDict.__setitem__(self, key, value)

    def __setstate__(self, state: Any) -> None:
        self.builds.judge(state)
        self.__dict__.update(state)


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
        return type("OrderedDict", (_ODict,), {"builds": builds})
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


@dataclass(slots=True)
class FastResult:
    root: Any
    tokens: Tokens
    calls: list[Call]
    persids: list[PersId]


def fast_load(data: bytes, *, allowed: Callable[[str], bool],
              check_pid: Callable[[tuple[Any, ...]], None],
              check_call: Callable[[str, tuple[Any, ...]], str | None] | None = None) -> FastResult:
    """Build the value graph of a clean torch pickle at C speed, or raise Decline.

    `check_pid` validates a persistent id like torch's persistent_load + the container
    (record present, exact size) and raises Decline otherwise; `check_call` may veto a
    rebuild call's arguments (torch's own checks) by raising Decline.
    """
    toks = tokenize(data, allowed, newobj=True)
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

    root = _Unpickler(data, toks).load_or_decline()
    return FastResult(root, toks, calls, persids)


def check_rebuild(full: str, args: tuple[Any, ...],
                  storage_info: Callable[[PersId], tuple[str, int] | None]) -> str | None:
    """Decline unless torch's rebuild function would accept `args` without complaint.

    `storage_info(persid) -> (dtype, nbytes)` describes a storage. The rules are torch's
    (`_rebuild_tensor` -> `Tensor.set_`, FORMATS.md §2.4, §2.6), kept deliberately narrow:
    anything outside them is left to the exact interpreter.
    """
    if full == "torch._utils._rebuild_parameter":
        if (len(args) != 3 or type(args[0]) is not Call or type(args[1]) is not bool
                or not _is_empty_hooks(args[2])):
            raise Decline("unusual _rebuild_parameter arguments")
        inner: str | None = args[0].attrs.get("dtype")
        if args[1] and inner not in FLOATING:
            raise Decline("requires_grad on a non-floating tensor")
        return inner
    if full == "torch._utils._rebuild_tensor_v2":
        if len(args) not in (6, 7):
            raise Decline("_rebuild_tensor_v2 arity")
        dtype = None
    else:  # _rebuild_tensor_v3
        if len(args) not in (7, 8) or type(args[6]) is not Global or args[6].module != "torch":
            raise Decline("_rebuild_tensor_v3 arguments")
        dtype = args[6].name
    storage, offset, size, stride, requires_grad, hooks = args[:6]
    metadata = args[7 if dtype else 6] if len(args) > (7 if dtype else 6) else None
    info = storage_info(storage) if type(storage) is PersId else None
    if info is None:
        raise Decline("tensor storage is not a storage")
    storage_dtype, nbytes = info
    if dtype is None:
        dtype = storage_dtype
    itemsize = ITEMSIZE.get(dtype)
    if (itemsize is None or type(offset) is not int or offset < 0
            or type(size) is not tuple or type(stride) is not tuple or len(size) != len(stride)
            or type(requires_grad) is not bool or not _is_empty_hooks(hooks)
            or not (metadata is None or (type(metadata) is CheckedDict and not metadata))):
        raise Decline("unusual tensor arguments")
    if requires_grad and (dtype not in FLOATING or full.endswith("_v3")):
        # _rebuild_tensor_v3 with requires_grad never loads (torch.empty(requires_grad=True)
        # then set_() on a leaf that requires grad: RuntimeError)
        raise Decline("requires_grad on a non-floating tensor, or in _rebuild_tensor_v3")
    if offset >= INT64_SAFE:
        raise Decline("a storage offset near int64 overflow")
    extent = 1
    empty = False
    for n, st in zip(size, stride, strict=True):   # every dim, also after a zero one
        if type(n) is not int or type(st) is not int or not (
                0 <= n < INT64_SAFE and 0 <= st < INT64_SAFE):
            raise Decline("negative, huge or non-integer size/stride (torch parses int64)")
        empty = empty or n == 0
        extent += (n - 1) * st
    if not empty and (offset + extent) * itemsize > nbytes:
        raise Decline("tensor view past the end of its storage")
    return dtype


def _is_empty_hooks(hooks: Any) -> bool:
    return isinstance(hooks, _ODict) and not hooks and not hooks.__dict__
