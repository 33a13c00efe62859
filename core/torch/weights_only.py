"""torch 2.13 `torch.load(weights_only=True)`, emulated without torch (FORMATS.md §2-§4, §8).

Strategy: `emulate` mirrors `torch/_weights_only_unpickler.py` `Unpickler.load` op by op
over the same restricted opcode set, on inert values (core.values): GLOBAL pushes a
`Global` after the allow/block policy, REDUCE/NEWOBJ push `Call` nodes typed with the
class torch would produce (core.torch.callables checks the callee's arguments), BINPERSID
replays `serialization._load.persistent_load` (or `_legacy_load`'s) against a
`StorageResolver`, BUILD on a Tensor/Parameter replays `set_(*state)` / `__setstate__`
(core.torch.tensor_build). The first failure ends the run with the exception torch would raise,
in torch's words; shapes of input we did not measure end it with type "Unmodelled".
Limits end it with type "LimitExceeded" (never an exception out of `emulate`).

Assumptions (each a deliberate choice, see tests/differential):
- the process is a fresh `import torch`: the user safe set holds BASELINE_USER_GLOBALS
  (FORMATS.md §3.2), plus the caller's `allow` (like `add_safe_globals` with strings);
- storage locations "cpu", "cuda[:N]" and "mps" are restorable (the host's devices are
  not the file's business; a CPU-only torch would refuse "cuda" records);
- a user-allowlisted class accepts its own NEWOBJ args and BUILD state (that is what
  allowlisting it asserts); a user-allowlisted *function*'s result type is unknown;
- sparse invariant checks are off (torch's default), so sparse tensors are judged on
  their shapes only; nested tensors (strided) through their metadata records, read by the
  resolver; a device-copy rebuild to cpu, meta or a restorable device is modelled, one to
  an int device (the current accelerator) or another backend is Unmodelled (the host's);
  a wrapper-subclass rebuild fails for every class a fresh torch allows.
"""

from __future__ import annotations

import re
import struct

from ckptguard.core.gcpause import collector_paused
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.opcodes import BY_NAME
from ckptguard.core.pickle.renames import last_dot_split, torch_map
from ckptguard.core.records import field, record
from ckptguard.core.torch.allowlist import (
    ALLOWED_GLOBALS,
    BASELINE_USER_GLOBALS,
    STORAGE_GLOBALS,
)
from ckptguard.core.torch.callables import (
    HashBudget,
    call_allowed,
    class_repr,
    global_kind,
    rebuild_nested_tensor,
    str_value,
    type_name,
)
from ckptguard.core.torch.dtypes import ITEMSIZE, STORAGE_DTYPE
from ckptguard.core.torch.rules import (
    BLOCKED_MODULES,
    TORCH_ACCEPTED,
    Capacity,
    Fail,
    StorageInfo,
    restorable,
)
from ckptguard.core.torch.tensor_build import TensorView, build_parameter, build_tensor
from ckptguard.core.torch.torch_error import TorchError
from ckptguard.core.torch.user_models import (
    check_numpy_state,
    check_partial_state,
    user_model,
)
from ckptguard.core.typenames import Protocol
from ckptguard.core.values import Call, Global, PersId, as_built, as_called, brief

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

# torch's accepted opcodes (core.torch.rules) as bytes, from the one opcode table: here, not
# in rules, which the fast lane imports without the opcode table
TORCH_ACCEPTED_CODES: frozenset[int] = frozenset(BY_NAME[name].code for name in TORCH_ACCEPTED)
_CALLABLE_KINDS = frozenset(("type", "function", "builtin_function_or_method", "torch._C._TensorMeta",
                             "torch.nn.parameter._ParameterMeta", "torch.tensortype"))
_NJT = ("torch.nested._internal.nested_tensor.NestedTensor",
        "torch.nested._internal.nested_tensor._rebuild_njt", "torch._dynamo.decorators._DimRange")
_DTENSOR = ("torch.distributed.device_mesh.DeviceMesh",
            "torch.distributed.tensor._dtensor_spec.DTensorSpec",
            "torch.distributed.tensor._dtensor_spec.TensorMeta", "torch.distributed.tensor.DTensor",
            "torch.distributed.tensor.placement_types.Partial",
            "torch.distributed.tensor.placement_types.Replicate",
            "torch.distributed.tensor.placement_types.Shard")


class StorageResolver(Protocol):
    def check(self, key: str, nbytes: int) -> TorchError | None: ...


@record(frozen=True, slots=True)
class StorageUse:
    key: str
    storage_type: str
    dtype: str
    numel: int
    nbytes: int
    location: str
    offset: int


@record(slots=True)
class WeightsOnlyResult:
    loadable: bool
    error: TorchError | None
    root: Any
    storages: list[StorageUse] = field(default_factory=list)
    end: int = 0
    protocol: int | None = None
    read_to: int = 0   # how far the replay read: bytes past it could not change the answer
    # legacy: key -> (dtype, byte size) of every storage torch's deserialized_objects holds
    # once the pickle is read (views are slices; a root grows when a view runs past its end)
    deserialized: dict[Any, tuple[str, int]] | None = None
    # offset of a tensor's rebuild call -> (its view, requires_grad) as torch ends up with it,
    # for every tensor a BUILD changed (the manifest describes those from here)
    built: dict[int, tuple[TensorView, bool]] = field(default_factory=dict)


_U32 = struct.Struct("<I")


def _re_refusal(kind: type) -> str:
    """`re.match(pattern, value)`'s TypeError for a value of `kind`, in this interpreter's words
    (they changed between CPython releases; the message names only the type)."""
    try:
        re.match("cuda(:|[0-9]+)", kind())
    except TypeError as exc:
        return str(exc)
    raise AssertionError(kind)


# the plain types a storage location can be besides str (bytes are decoded before)
_RE_REFUSES = {kind: _re_refusal(kind) for kind in (tuple, list, dict, int, float, bool, type(None))}


def _global_error(module: str, name: str, allowed: frozenset[str]) -> str | None:
    full = f"{module}.{name}"
    if module in BLOCKED_MODULES:
        return f"Trying to load unsupported GLOBAL {full} whose module {module} is blocked."
    if full in ALLOWED_GLOBALS or full in allowed:
        return None
    if full in _NJT:
        return ("``torch.nested`` and ``torch._dynamo`` must be imported to load nested jagged "
                "tensors (NJTs)")
    if full in _DTENSOR:
        return "``torch.distributed.tensor`` must be imported to load DTensors"
    if full.startswith("builtins"):
        rest = full[len("builtins"):]
        full = rest[1:] if rest.startswith(".") else "builtins" + rest
    return (f"Unsupported global: GLOBAL {full} was not an allowed global by default. Please use "
            f"`torch.serialization.add_safe_globals([{full}])` or the "
            f"`torch.serialization.safe_globals([{full}])` context manager to allowlist this global "
            "if you trust this class/function.")


class _Stop(Exception):
    def __init__(self, error: TorchError) -> None:
        super().__init__(error)
        self.error = error


class _Reader:
    """io.BytesIO semantics over the pickle: short reads return what is there."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def read(self, n: int) -> bytes:
        out = self.buf[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def readline(self) -> bytes:
        end = self.buf.find(b"\n", self.pos)
        return self.read((len(self.buf) if end < 0 else end + 1) - self.pos)


class _Emulator:
    def __init__(self, data: bytes, allow: frozenset[str], resolver: StorageResolver | None,
                 base: int, limits: Limits, legacy: bool, persistent_load: bool = True) -> None:
        self.r = _Reader(data)
        self.persistent_load = persistent_load
        self.allow = allow
        self.allowed = allow | BASELINE_USER_GLOBALS
        self.resolver = resolver
        self.base = base
        self.limits = limits
        self.legacy = legacy
        self.storages: list[StorageUse] = []
        self.seen_keys: set[str] = set()
        self.hashing = HashBudget()       # dict keys and set members hashed so far
        self.copied_items = 0             # items copied by BUILDs and calls so far (charge_copies)
        self.copied: dict[int, Any] = {}  # containers a call copied (kept alive: ids stay unique)
        self.built: dict[int, Call] = {}   # offset -> a tensor whose view a BUILD changed
        self.loaded: dict[Any, StorageInfo] = {}      # torch's loaded_storages / deserialized_objects
        self.info: dict[int, StorageInfo] = {}        # id(PersId) -> the storage it stands for
        self.keep: list[PersId] = []
        self.protocol: int | None = None
        self.op_offset = base

    # -- helpers ---------------------------------------------------------------------------
    def fail(self, type_: str, message: str) -> _Stop:
        return _Stop(TorchError(type_, message, self.op_offset))

    def storage_of(self, v: Any) -> StorageInfo | None:
        return self.info.get(id(v)) if isinstance(v, PersId) else None

    def tname(self, v: Any) -> str:
        t = type_name(v, self.storage_of)
        if t is None:
            raise self.fail("Unmodelled", f"not modelled: the type of {brief(v)}")
        return t

    def unpack(self, fmt: str, n: int) -> Any:
        raw = self.r.read(n)
        if len(raw) != n:
            raise self.fail("error", f"unpack requires a buffer of {n} bytes")
        return struct.unpack(fmt, raw)[0]

    def byte(self) -> int:
        raw = self.r.read(1)
        if not raw:
            raise self.fail("IndexError", "index out of range")
        return raw[0]

    # -- the loop (torch/_weights_only_unpickler.py Unpickler.load) -------------------------
    def run(self) -> Any:
        r, limits = self.r, self.limits
        metastack: list[list[Any]] = []
        stack: list[Any] = []
        memo: dict[int, Any] = {}
        count = 0
        buf, end, base = r.buf, len(r.buf), self.base
        max_ops, max_stack, max_depth = limits.max_opcodes, limits.max_stack, limits.max_depth
        max_memo, max_str = limits.max_memo_entries, limits.max_str_bytes
        u32 = _U32.unpack_from
        while True:
            pos = r.pos
            count += 1
            if count > max_ops or len(stack) > max_stack:
                self.op_offset = base + pos
                raise self.fail("LimitExceeded", "opcode count or stack size over the limit")
            if pos >= end:
                self.op_offset = base + pos
                raise self.fail("EOFError", "")
            op = buf[pos]
            pos += 1
            # fast paths (the bulk of any torch.save pickle); each only when it cannot fail,
            # anything else falls through to the op-by-op mirror of torch's loop below
            if op == 0x71 and pos < end and stack and (buf[pos] in memo or len(memo) < max_memo):
                memo[buf[pos]] = stack[-1]  # BINPUT
                r.pos = pos + 1
                continue
            if op == 0x58 and pos + 4 <= end:  # BINUNICODE
                n = u32(buf, pos)[0]
                if min(n, end - pos - 4) <= max_str:  # a short read is what torch gets too
                    try:
                        stack.append(str(buf[pos + 4:pos + 4 + n], "utf-8", "surrogatepass"))
                        r.pos = min(pos + 4 + n, end)
                        continue
                    except UnicodeDecodeError:
                        pass
            elif op == 0x4B and pos < end:  # BININT1
                stack.append(buf[pos])
                r.pos = pos + 1
                continue
            elif op == 0x68 and pos < end and buf[pos] in memo:  # BINGET
                stack.append(memo[buf[pos]])
                r.pos = pos + 1
                continue
            elif op == 0x28 and len(metastack) < max_depth:  # MARK
                metastack.append(stack)
                stack = []
                r.pos = pos
                continue
            elif op == 0x74 and metastack:  # TUPLE
                items = stack
                stack = metastack.pop()
                stack.append(tuple(items))
                r.pos = pos
                continue
            elif op == 0x89 or op == 0x29:  # NEWFALSE / EMPTY_TUPLE
                stack.append(False if op == 0x89 else ())
                r.pos = pos
                continue
            self.op_offset = base + pos - 1
            r.pos = pos
            if op not in TORCH_ACCEPTED_CODES:
                raise self.fail("UnpicklingError", f"Unsupported operand {op}")
            try:
                if op == 0x63:  # GLOBAL
                    stack.append(self.op_global())
                elif op == 0x81:  # NEWOBJ
                    args = stack.pop()
                    cls = stack.pop()
                    stack.append(self.op_newobj(cls, args))
                elif op == 0x52:  # REDUCE
                    args = stack.pop()
                    func = stack[-1]
                    stack[-1] = self.op_reduce(func, args)
                elif op == 0x62:  # BUILD
                    state = stack.pop()
                    self.op_build(stack[-1], state)
                elif op == 0x61:  # APPEND
                    item = stack.pop()
                    lst = stack[-1]
                    if type(lst) is not list:
                        raise self.fail("UnpicklingError",
                                        f"Can only append to lists, but got {class_repr(self.tname(lst))}")
                    self.grow(lst, 1)
                    lst.append(item)
                elif op == 0x65:  # APPENDS
                    items = stack
                    stack = metastack.pop()
                    lst = stack[-1]
                    if type(lst) is not list:
                        raise self.fail("UnpicklingError",
                                        f"Can only extend lists, but got {class_repr(self.tname(lst))}")
                    self.grow(lst, len(items))
                    lst.extend(items)
                elif op == 0x73:  # SETITEM
                    v, k = stack.pop(), stack.pop()
                    self.check_setitem_target(stack[-1], "SETITEM")
                    self.setitem(stack[-1], k, v)
                elif op == 0x75:  # SETITEMS
                    items = stack
                    stack = metastack.pop()
                    self.check_setitem_target(stack[-1], "SETITEMS")
                    for i in range(0, len(items), 2):
                        if i + 1 >= len(items):
                            raise self.fail("IndexError", "list index out of range")
                        self.setitem(stack[-1], items[i], items[i + 1])
                elif op == 0x28:  # MARK
                    if len(metastack) >= max_depth:
                        raise self.fail("LimitExceeded", "MARK nesting over the limit")
                    metastack.append(stack)
                    stack = []
                elif op == 0x74:  # TUPLE
                    items = stack
                    stack = metastack.pop()
                    stack.append(tuple(items))
                elif op == 0x85:  # TUPLE1
                    stack[-1] = (stack[-1],)
                elif op == 0x86:  # TUPLE2
                    stack[-2:] = [(stack[-2], stack[-1])]
                elif op == 0x87:  # TUPLE3
                    stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
                elif op == 0x4E:
                    stack.append(None)
                elif op == 0x89:
                    stack.append(False)
                elif op == 0x88:
                    stack.append(True)
                elif op == 0x29:
                    stack.append(())
                elif op == 0x5D:
                    stack.append([])
                elif op == 0x7D:
                    stack.append({})
                elif op == 0x8F:
                    stack.append(set())
                elif op == 0x4A:  # BININT
                    stack.append(self.unpack("<i", 4))
                elif op == 0x4B:  # BININT1
                    stack.append(self.byte())
                elif op == 0x4D:  # BININT2
                    stack.append(self.unpack("<H", 2))
                elif op == 0x47:  # BINFLOAT, big-endian (FORMATS.md §2.1)
                    stack.append(self.unpack(">d", 8))
                elif op == 0x58:  # BINUNICODE
                    n = self.unpack("<I", 4)
                    if min(n, end - r.pos) > max_str:
                        raise self.fail("LimitExceeded", f"{n}-byte string")
                    raw = r.read(n)
                    try:
                        stack.append(str(raw, "utf-8", "surrogatepass"))
                    except UnicodeDecodeError as exc:
                        raise self.fail("UnicodeDecodeError", str(exc)) from None
                elif op == 0x55:  # SHORT_BINSTRING, decoded with torch.load's encoding="utf-8"
                    raw = r.read(self.byte())
                    try:
                        stack.append(raw.decode("utf-8", "strict"))
                    except UnicodeDecodeError as exc:
                        raise self.fail("UnicodeDecodeError", str(exc)) from None
                elif op == 0x51:  # BINPERSID
                    pid = stack.pop()
                    stack.append(self.op_persid(pid))
                elif op in (0x68, 0x6A):  # BINGET / LONG_BINGET
                    idx = self.byte() if op == 0x68 else self.unpack("<I", 4)
                    if idx not in memo:
                        raise self.fail("KeyError", str(idx))
                    stack.append(memo[idx])
                elif op in (0x71, 0x72):  # BINPUT / LONG_BINPUT
                    idx = self.byte() if op == 0x71 else self.unpack("<I", 4)
                    if len(memo) >= limits.max_memo_entries and idx not in memo:
                        raise self.fail("LimitExceeded", "memo over the limit")
                    memo[idx] = stack[-1]
                elif op == 0x8A:  # LONG1
                    n = self.byte()
                    stack.append(int.from_bytes(r.read(n), "little", signed=True))
                elif op == 0x80:  # PROTO
                    self.protocol = self.byte()
                elif op == 0x2E:  # STOP
                    return stack.pop()
            except IndexError as exc:
                # list.pop() / stack[-1] on an empty (MARK-split) stack, exactly as torch
                raise self.fail("IndexError", str(exc)) from None

    def grow(self, container: Any, n: int) -> None:
        if len(container) + n > self.limits.max_container_items:
            raise self.fail("LimitExceeded", "container over the item limit")

    # -- risky operators --------------------------------------------------------------------
    def op_global(self) -> Global:
        try:
            module = self.r.readline()[:-1].decode("utf-8")
            name = self.r.readline()[:-1].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail("UnicodeDecodeError", str(exc)) from None
        module, name = torch_map(module, name)
        err = _global_error(module, name, self.allowed)
        if err is not None:
            raise self.fail("UnpicklingError", err)
        return Global(*last_dot_split(module, name))   # allowed: torch found it by the joined path

    def op_newobj(self, cls: Any, args: Any) -> Any:
        if isinstance(cls, Global) and cls.full == "torch.nn.parameter.Parameter":
            raise self.fail("Unmodelled", "not modelled: NEWOBJ of nn.Parameter")
        if isinstance(cls, Global):
            if cls.full in self.allow:
                return self.user_call(cls, args, "NEWOBJ")
            if cls.full in ("collections.OrderedDict", "collections.Counter") and type(args) is tuple:
                c = Call(cls, args, "NEWOBJ", self.op_offset)  # dict.__new__ ignores its args
                c.attrs["type"] = cls.full
                return c
            raise self.fail("Unmodelled", f"not modelled: NEWOBJ of {cls.full}")
        text = str_value(cls, self.storage_of)
        if text is None:
            raise self.fail("Unmodelled", "not modelled: the text of a NEWOBJ class")
        raise self.fail("UnpicklingError", "Can only create new object for nn.Parameter or classes "
                        f"allowlisted via `add_safe_globals` but got {text}")

    def op_reduce(self, func: Any, args: Any) -> Any:
        if not isinstance(func, Global):
            text = str_value(func, self.storage_of)
            # an OrderedDict never equals an allowlisted global; another instance might
            if text is None or (isinstance(func, Call)
                                and func.attrs.get("type") != "collections.OrderedDict"):
                raise self.fail("Unmodelled", "not modelled: REDUCE of a non-global")
            raise self.fail("UnpicklingError", f"Trying to call reduce for unrecognized function {text}")
        if func.full in BASELINE_USER_GLOBALS and func.full not in self.allow:
            raise self.fail("Unmodelled", f"not modelled: a call of {func.full}")
        if func.full in self.allowed and func.full not in ALLOWED_GLOBALS:
            return self.user_call(func, args, "REDUCE")
        try:
            if func.full == "torch._utils._rebuild_nested_tensor":   # needs the metadata's bytes
                return rebuild_nested_tensor(func, args, self.storage_of, "REDUCE", self.op_offset,
                                             getattr(self.resolver, "read", None))
            args, copied = as_called(func, args)
            if copied is not None:   # one copy of a container is linear in the pickle: its
                if id(copied) in self.copied:   # copies again are what can multiply
                    self.charge_copies(len(copied))
                self.copied[id(copied)] = copied
            result = call_allowed(func, args, self.storage_of, "REDUCE", self.op_offset, self.hashing)
            if result.attrs.get("built"):   # a Parameter or subclass of a tensor a BUILD moved
                self.built[result.offset] = result
            return result
        except Fail as exc:
            raise self.fail(exc.type, exc.message) from None

    def callable_global(self, v: Any) -> bool:
        """`v` is a global torch can call: a user-allowlisted one, or an allowlisted class/function."""
        return isinstance(v, Global) and (v.full in self.allowed or global_kind(v.full) in _CALLABLE_KINDS)

    def user_call(self, func: Global, args: Any, opcode: str) -> Call:
        # a user-allowlisted callable: its behaviour is the user's; the result is taken to be
        # an instance of that class (BUILD/SETITEM checks then follow type(inst)), unless we
        # measured what it returns (numpy dtype/ndarray/scalar, defaultdict, deque, partial)
        if opcode == "REDUCE":
            known = user_model(func, args, self.callable_global, self.storage_of)
            if known is not None:
                known.offset = self.op_offset
                return known
        c = Call(func, args, opcode, self.op_offset)
        # NEWOBJ makes an instance of `func`; REDUCE does too when `func` is a class, which we
        # can only guess from the name (a factory function's result has an unknown type)
        is_class = opcode == "NEWOBJ" or func.name[:1].isupper()
        c.attrs["type"] = func.full if is_class else None
        c.attrs["user"] = is_class
        return c

    def charge_copies(self, items: int) -> None:
        """Count the items torch copies out of the pickle's containers (an OrderedDict BUILD's
        state into `__dict__`; `set(list)`, `OrderedDict(pairs)` of a container copied
        before): a memoized 10k-item one copied by 100k calls is 1 G steps, torch's and
        ours. Past the cap: Unmodelled."""
        self.copied_items += items
        if self.copied_items > self.limits.max_build_state_keys:
            raise self.fail("Unmodelled", "not modelled: BUILD states and call arguments of more "
                            f"than {self.limits.max_build_state_keys} items in all (torch.load "
                            "would take minutes or hang)")

    def op_build(self, inst: Any, state: Any) -> None:
        t = self.tname(inst)
        if isinstance(inst, Call) and t in ("collections.OrderedDict",):
            if not isinstance(state, dict):
                raise self.fail("Unmodelled", "not modelled: OrderedDict BUILD with a non-dict state")
            self.charge_copies(len(state))
            if not all(isinstance(k, str) for k in state):
                raise self.fail("Unmodelled", "not modelled: OrderedDict BUILD state with a key "
                                "that is not a string")
            inst.state.append(as_built(state))   # __dict__.update: the keys it has now
            return
        if isinstance(inst, Call) and inst.attrs.get("build") and t in self.allowed:
            try:  # type(inst) allowlisted: torch calls its __setstate__
                if inst.attrs["build"] == "partial":
                    check_partial_state(state, self.callable_global)
                else:
                    check_numpy_state(inst, state)
            except Fail as exc:
                raise self.fail(exc.type, exc.message) from None
            inst.state.append(state)
            return
        if isinstance(inst, Call) and inst.attrs.get("user"):
            inst.state.append(state)
            return
        if isinstance(inst, Call) and t in ("torch.Tensor", "torch.nn.parameter.Parameter"):
            build = build_tensor if t == "torch.Tensor" else build_parameter
            try:   # Tensor.set_(*state) / Parameter.__setstate__(state)
                build(inst, state, lambda v: type_name(v, self.storage_of), self.storage_of)
            except Fail as exc:
                raise self.fail(exc.type, exc.message) from None
            inst.state.append(as_built(state))
            self.built[inst.offset] = inst
            return
        if t in ALLOWED_GLOBALS or f"builtins.{t}" in ALLOWED_GLOBALS or t in self.allowed:
            raise self.fail("Unmodelled", f"not modelled: BUILD on {t}")
        raise self.fail("UnpicklingError", "Can only build Tensor, Parameter, OrderedDict or types "
                        f"allowlisted via `add_safe_globals`, but got {class_repr(t)}")

    def check_setitem_target(self, target: Any, opcode: str) -> None:
        t = self.tname(target)
        if t not in ("dict", "collections.OrderedDict", "collections.Counter"):
            raise self.fail("UnpicklingError", f"Can only {opcode} for dict, collections.OrderedDict, "
                            f"collections.Counter, but got {class_repr(t)}")

    def setitem(self, target: Any, k: Any, v: Any) -> None:
        try:
            # inserting hashes k (and compares it with an equal key): two hashes of the budget
            err = self.hashing.error(k, self.storage_of, times=2)
        except Fail as exc:
            raise self.fail(exc.type, exc.message) from None
        if err is not None:
            raise self.fail("TypeError", err)
        if isinstance(target, dict):
            if isinstance(k, float) and k != k:
                raise self.fail("Unmodelled", "not modelled: NaN dict key")
            if k not in target:
                self.grow(target, 1)
            target[k] = v
        else:
            self.grow(target.setitems, 1)
            target.setitems.append((k, v))

    # -- persistent ids (serialization._load / _legacy_load persistent_load) ----------------
    def op_persid(self, pid: Any) -> PersId:
        if type(pid) is not tuple and type(pid) is not int:
            raise self.fail("UnpicklingError",
                            f"persistent_load id must be tuple or int, but got {class_repr(self.tname(pid))}")
        if type(pid) is tuple and len(pid) > 0:
            tag = self.decode_ascii(pid[0])
            if tag != "storage":
                # plain values and allowlisted globals (classes, functions, dtypes) never
                # equal a str; an instance of some other class might
                if not (isinstance(tag, (str, int, float, bool, tuple, list, dict)) or tag is None
                        or (isinstance(tag, Global) and type_name(tag, self.storage_of) is not None)):
                    raise self.fail("Unmodelled", "not modelled: comparing a pid tag with 'storage'")
                raise self.fail("UnpicklingError", "Only persistent_load of storage is allowed, but got "
                                f"{class_repr(self.tname(pid[0]))}")
        if not self.persistent_load:
            # a bare `pickle_module.load(f)` (torch's legacy magic, protocol, sys_info and key
            # list pickles): the restricted Unpickler's own persistent_load refuses every id
            raise self.fail("UnpicklingError", "unsupported persistent id encountered")
        if type(pid) is int:
            raise self.fail("AssertionError", "saved_id must be a tuple, got int")
        if len(pid) == 0:
            raise self.fail("IndexError", "tuple index out of range")
        data = pid[1:]
        want = 5 if self.legacy else 4
        if len(data) != want:
            if len(data) < want:
                raise self.fail("ValueError",
                                f"not enough values to unpack (expected {want}, got {len(data)})")
            raise self.fail("ValueError", f"too many values to unpack (expected {want})")
        storage_type, key, location, numel = data[:4]
        if self.legacy:  # _legacy_load decodes the location before it looks at the type
            location = self.decode_ascii(location)
        if isinstance(storage_type, Global) and storage_type.full == "torch.storage.UntypedStorage" \
                and not self.legacy:
            dtype, st_name = "uint8", storage_type.full
        elif isinstance(storage_type, Global) and storage_type.full in STORAGE_GLOBALS:
            dtype, st_name = STORAGE_DTYPE[storage_type.name], storage_type.full
        elif isinstance(storage_type, Global) and storage_type.full == "torch.storage.UntypedStorage":
            raise self.fail("AttributeError",
                            "type object 'torch.storage.UntypedStorage' has no attribute 'dtype'")
        elif storage_type is None or isinstance(storage_type, (bool, int, float, str, tuple, list, dict)):
            raise self.fail("AttributeError",
                            f"'{self.tname(storage_type)}' object has no attribute 'dtype'")
        else:
            raise self.fail("Unmodelled", "not modelled: this storage type in a persistent id")
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise self.fail("Unmodelled", "not modelled: a storage key that is not a str/int")
        if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0 or numel >= 1 << 56:
            raise self.fail("Unmodelled", "not modelled: a storage numel that is not a small int")
        nbytes = numel * ITEMSIZE[dtype]
        return self.load_storage(pid, st_name, dtype, key, location, numel, nbytes, data)

    def decode_ascii(self, v: Any) -> Any:
        if isinstance(v, Call) and v.attrs.get("type") == "bytes":
            raw = v.attrs.get("value", b"")
            try:
                return raw.decode("ascii")
            except UnicodeDecodeError as exc:
                raise self.fail("UnicodeDecodeError", str(exc)) from None
        return v

    def load_storage(self, pid: tuple[Any, ...], st_name: str, dtype: str, key: str | int,
                     location: Any, numel: int, nbytes: int, data: tuple[Any, ...]) -> PersId:
        persid = PersId(pid, self.op_offset)
        self.keep.append(persid)
        skey = str(key)
        cached = self.loaded.get(key)
        if cached is None:
            if not self.legacy:
                location = self.decode_ascii(location)
            if self.resolver is not None and not self.legacy:  # the record is read first
                err = self.resolver.check(skey, nbytes)
                if err is not None:
                    raise _Stop(TorchError(err.type, err.message, self.op_offset))
            self.check_location(location)
            info = StorageInfo(skey, dtype, nbytes, Capacity(nbytes) if self.legacy else None)
            if skey not in self.seen_keys:
                self.seen_keys.add(skey)
                self.storages.append(StorageUse(skey, st_name, dtype, numel, nbytes, location,
                                                self.op_offset))
            if nbytes > 0 or self.legacy:  # torch caches only storages with a data pointer
                self.loaded[key] = info
        elif self.legacy and cached.nbytes_now == 0:
            # no data pointer: torch hands out a fresh empty TypedStorage, not the cached one
            info = StorageInfo(skey, dtype, 0, Capacity(0))
        else:
            info = cached  # torch returns the first TypedStorage of a key, with its dtype
        if self.legacy and data[4] is not None:
            info = self.legacy_view(info, data[4], dtype)
        self.info[id(persid)] = info
        return persid

    def check_location(self, location: Any) -> None:
        """serialization.default_restore_location over the registered deserializers."""
        if not isinstance(location, str):
            if type(location) in _RE_REFUSES:   # `location == "cpu"` is False, then cuda's re.match
                raise self.fail("TypeError", _RE_REFUSES[type(location)])
            raise self.fail("Unmodelled", f"not modelled: restoring storage location {brief(location)}")
        if restorable(location):
            return
        if (location.startswith(("mps", "meta")) or re.match(r"cuda(:|[0-9]+)", location)
                or any(location == b or re.match(f"{b}(:|[0-9]+)", location)
                       for b in ("privateuseone", "hpu", "xpu", "mtia"))):
            raise self.fail("Unmodelled", f"not modelled: restoring storage location {brief(location)}")
        raise self.fail("RuntimeError", "don't know how to restore data location of "
                        f"torch.storage.UntypedStorage (tagged with {location})")

    def legacy_view(self, info: StorageInfo, view: Any, dtype: str) -> StorageInfo:
        """`_legacy_load`'s view: a slice of the root, cached under its own key in the same
        deserialized_objects as the roots (a view key that names a root returns the root),
        typed by this persistent id's storage type, not the root's."""
        if not (isinstance(view, tuple) and len(view) == 3 and all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 56 for x in view[1:])):
            raise self.fail("Unmodelled", "not modelled: legacy view metadata of this shape")
        view_key = view[0]
        if isinstance(view_key, bool) or not isinstance(view_key, (str, int)):
            raise self.fail("Unmodelled", "not modelled: a legacy view key that is not a str/int")
        cached = self.loaded.get(view_key)
        if cached is not None:
            return cached
        size, have = ITEMSIZE[dtype], info.nbytes_now
        start, stop = min(view[1] * size, have), min((view[1] + view[2]) * size, have)
        # UntypedStorage slices clip like Python's (measured); a slice is not resizable
        sliced = StorageInfo(f"{info.key}:{view_key}", dtype, max(0, stop - start))
        self.loaded[view_key] = sliced
        return sliced

    def built_views(self) -> dict[int, tuple[TensorView, bool]]:
        return {offset: (c.attrs["view"], bool(c.attrs.get("requires_grad")))
                for offset, c in self.built.items()}

    def deserialized(self) -> dict[Any, tuple[str, int]] | None:
        if not self.legacy:
            return None
        return {key: (info.dtype, info.nbytes_now) for key, info in self.loaded.items()}


def _as_bytes(data: bytes | memoryview) -> bytes:
    # one copy of a memoryview (bounded by Limits.max_pickle_bytes upstream) buys bytes.find
    return data if isinstance(data, bytes) else memoryview(data).cast("B").tobytes()


def emulate(data: bytes | memoryview, *, allow: frozenset[str] = frozenset(),
            resolver: StorageResolver | None = None, base_offset: int = 0,
            limits: Limits = DEFAULT_LIMITS, legacy: bool = False,
            persistent_load: bool = True) -> WeightsOnlyResult:
    """Replay torch.load(weights_only=True) on one pickle; never raises.

    `persistent_load=False`: a pickle torch loads without its storage hook (the legacy
    stream's magic number, protocol, sys_info and key list), where any persistent id fails.

    >>> emulate(b"\\x80\\x02}q\\x00.").loadable
    True
    """
    em = _Emulator(_as_bytes(data), frozenset(allow), resolver, base_offset, limits, legacy,
                   persistent_load)
    try:
        with collector_paused():   # millions of young containers: the GC would rescan them all
            root = em.run()
            return WeightsOnlyResult(True, None, root, em.storages, em.r.pos, em.protocol,
                                     deserialized=em.deserialized(), built=em.built_views())
    except _Stop as stop:
        error = stop.error
    except RecursionError:
        error = TorchError("LimitExceeded", "value nesting too deep", em.op_offset)
    except MemoryError:
        error = TorchError("LimitExceeded", "out of memory", em.op_offset)
    return WeightsOnlyResult(False, error, None, em.storages, em.op_offset - base_offset, em.protocol,
                             em.r.pos)


_WALK_ARGS = {0x4A: 4, 0x4B: 1, 0x4D: 2, 0x47: 8, 0x68: 1, 0x6A: 4, 0x71: 1, 0x72: 4}


def unsafe_globals(data: bytes | memoryview, allow: frozenset[str] = frozenset()) -> list[str] | TorchError:
    """`torch.serialization.get_unsafe_globals_in_checkpoint`'s walk of data.pkl (sorted)."""
    r = _Reader(_as_bytes(data))
    found: set[str] = set()
    allowed = ALLOWED_GLOBALS | BASELINE_USER_GLOBALS | allow
    while True:
        offset = r.pos
        key = r.read(1)
        if not key:
            return TorchError("EOFError", "", offset)
        op = key[0]
        try:
            if op == 0x63:
                try:
                    module = r.readline()[:-1].decode("utf-8")
                    name = r.readline()[:-1].decode("utf-8")
                except UnicodeDecodeError as exc:
                    return TorchError("UnicodeDecodeError", str(exc), offset)
                module, name = torch_map(module, name)
                found.add(f"{module}.{name}")
            elif op in _WALK_ARGS:
                r.read(_WALK_ARGS[op])
            elif op == 0x58:
                raw = r.read(4)
                if len(raw) < 4:
                    return TorchError("error", "unpack requires a buffer of 4 bytes", offset)
                r.read(struct.unpack("<I", raw)[0])
            elif op in (0x55, 0x8A, 0x80):
                raw = r.read(1)
                if not raw:
                    return TorchError("IndexError", "index out of range", offset)
                if op != 0x80:
                    r.read(raw[0])
            elif op == 0x2E:
                return sorted(found - allowed)
            elif op not in TORCH_ACCEPTED_CODES:
                return TorchError("UnpicklingError", f"Unsupported operand {op}", offset)
        except MemoryError:
            return TorchError("LimitExceeded", "out of memory", offset)
