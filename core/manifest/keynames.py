"""Names of dict keys in the tensor manifest: what a user writes to index the loaded object.

A tensor's `name` joins its path segments; a segment is a key as the user would type it.
Split from core.manifest.build (which walks the graph) because naming is a rule of its own:
the differential oracle (tests/differential/test_manifest_vs_torch.py) checks it against
torch, and the fast lane names its keys with the same `segment`.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from ckptguard.core.pickle.fast.containers import CheckedDict
from ckptguard.core.pickle.fast.stubs import StubMeta
from ckptguard.core.torch.dtypes import (
    DEVICE_TYPES,
    LAYOUTS,
)
from ckptguard.core.values import Buffer, Call, ExtRef, Global, PersId, Unhashable

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

# ---- the rules ------------------------------------------------------------------------------
#
# A name segment is what a user writes to index the loaded object, as the differential oracle
# derives it (tests/differential/test_manifest_vs_torch.py `_key`): a `str` or `int` key as is,
# a `bytes` key decoded latin-1, any other key `repr()` of the object torch would build. Keys
# that are not plain data reach us as value nodes, so `repr()` is computed from the graph
# (`key_text`), never from a node's own repr (which holds a file offset):
# - `_codecs.encode(s, 'latin1')` / `bytes()` (how protocol 2 pickles bytes): the bytes, so a
#   top-level key decodes latin-1 like real bytes, and inside a tuple shows as `b'...'`;
# - a global: `module.name`, which is repr() for torch's dtypes, qschemes and layouts
#   (`torch.float16`); for a class or function repr() would be `<class ...>` / an address, and
#   `module.name` stays the stable rendering; core.pickle.fast.stubs's stub classes count as their global;
# - `torch.device(type[, index])`: `device(type='cuda', index=1)`; `torch.Size(ints)`:
#   `torch.Size([2, 3])`; `_get_layout('torch.strided')` (torch's layouts): `torch.strided`;
#   `complex(re, im)`: repr of the complex;
# - tuple/list/dict: Python's repr of their rendered items; a `frozenset`/`set` (a node
#   `frozenset(list)` too) lists its members in CPython's own order when every member hashes
#   the same in every process (ints, bools, non-NaN floats, tuples of them: then equal to
#   torch's repr), else sorted by their text (repr's order would follow PYTHONHASHSEED);
# - any other call (fallback, deterministic but not repr): `module.name(arg, ..., kw=value)`
#   from its callable and its rendered arguments; BUILD state, SETITEM and APPEND on it are
#   left out; a storage reference is `persistent_load(<pid>)`; an EXT code `<extension N>`; an
#   out-of-band buffer `<out-of-band buffer>`;
# - an int whose decimal form passes CPython's str() limit (4300 digits) is `<int of N bits>`;
#   nesting deeper than _KEY_DEPTH is `...`; a text past _KEY_CHARS is cut and ends in `...`.
# No rule ever uses an offset or an id(), so a file's names are the same in every run.

_INT_BITS = 14_000        # 2**14000 has 4215 decimal digits, under CPython's 4300 str() limit
_KEY_CHARS = 1_000
_KEY_DEPTH = 32
_SEED_FREE_NODES = 10_000
_DEVICE = re.compile(r"([a-z]+)(?::(0|[1-9][0-9]{0,2}))?")
_MAX_DEVICE_INDEX = 127   # c10::DeviceIndex is int8; larger indexes wrap or fail
_ENCODINGS = frozenset({"latin1", "latin-1"})   # what pickle writes; torch_rebuild models these
_BYTES = Global("builtins", "bytes")
_ENCODE = Global("_codecs", "encode")
_DEVICE_G = Global("torch", "device")
_SIZE = Global("torch", "Size")
_LAYOUT = Global("torch.serialization", "_get_layout")
_COMPLEX = Global("builtins", "complex")
_SETS = {Global("builtins", "frozenset"): True, Global("builtins", "set"): False}


def segment(key: Any) -> str | int:
    """The name segment of a dict key (see the rules above)."""
    t = type(key)
    if t is str:
        return key  # type: ignore[no-any-return]
    if t is int:
        return key if key.bit_length() <= _INT_BITS else f"<int of {key.bit_length()} bits>"  # type: ignore[no-any-return]
    if t is bytes:
        return key.decode("latin-1")  # type: ignore[no-any-return]
    if t is Call:
        raw = _bytes_of(key)
        if raw is not None:
            return raw.decode("latin-1")
    return key_text(key)


def key_text(value: Any) -> str:
    """repr() of the object the unpickler would build from `value`, rendered from the graph."""
    text = _KeyText()
    text.add(value, 0)
    out = "".join(text.parts)
    return out if text.left >= 0 else out[:_KEY_CHARS] + "..."


def _bytes_of(call: Call) -> bytes | None:
    """The bytes of `_codecs.encode(s, 'latin1')` or `bytes()`; None for any other call."""
    func, args = call.func, call.args
    if type(func) is not Global or type(args) is not tuple:
        return None
    if func == _ENCODE and len(args) == 2 and type(args[0]) is str and args[1] in _ENCODINGS:
        try:
            return args[0].encode("latin-1")  # type: ignore[no-any-return]
        except UnicodeEncodeError:          # torch fails too; the fallback names the call
            return None
    if func == _BYTES and not args and not call.kwargs:
        return b""
    return None


def _global_of(value: Any) -> Global | None:
    if type(value) is Global:
        return value
    if type(value) is StubMeta:      # core.pickle.fast.stubs's stand-in for a global used as a value
        return value.node
    return None


def _seed_free(value: Any) -> bool:
    """Hashes the same in every process: ints, bools, non-NaN floats, tuples of them (no str or
    bytes, whose hash is salted, no node hashed by id, no NaN). Bounded: a tuple DAG of
    depth d has 2**d paths, so past _SEED_FREE_NODES visits the answer is no."""
    todo = [value]
    budget = _SEED_FREE_NODES
    while todo:
        v = todo.pop()
        budget -= 1
        if budget < 0:
            return False
        t = type(v)
        if t is int:
            if v.bit_length() > _INT_BITS:
                return False
        elif t is float:
            if v != v:
                return False
        elif t is tuple:
            todo.extend(v)
        elif t is not bool:
            return False
    return True


_ORDERED_DICT = Global("collections", "OrderedDict")
_MAX_SET_MEMBERS = 256   # a key text is cut at 1,000 characters: more members never show


class _KeyText:
    """Appends the text of a value to `parts` until `left` characters are spent (then < 0)."""

    __slots__ = ("left", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.left = _KEY_CHARS

    def put(self, s: str) -> None:
        if len(s) > self.left + 1:
            s = s[:self.left + 1]
        self.parts.append(s)
        self.left -= len(s)

    def items(self, values: Any, depth: int, sep: str = ", ") -> None:
        for i, v in enumerate(values):
            if self.left < 0:
                return
            if i:
                self.put(sep)
            self.add(v, depth)

    def add(self, value: Any, depth: int) -> None:
        if self.left < 0:
            return
        if depth > _KEY_DEPTH:
            self.put("...")
            return
        depth += 1
        t = type(value)
        if t is str or t is bytes or t is float or t is bool or value is None:
            self.put(repr(value[:self.left + 1] if (t is str or t is bytes) else value))
        elif t is int:
            self.put(repr(value) if value.bit_length() <= _INT_BITS
                     else f"<int of {value.bit_length()} bits>")
        elif t is tuple:
            self.put("(")
            self.items(value, depth)
            self.put(",)" if len(value) == 1 else ")")
        elif t is list:
            self.put("[")
            self.items(value, depth)
            self.put("]")
        elif t is dict or t is CheckedDict:
            self.put("{")
            for i, (k, v) in enumerate(value.items()):
                if self.left < 0:
                    break
                self.put(", " if i else "")
                self.add(k, depth)
                self.put(": ")
                self.add(v, depth)
            self.put("}")
        elif t is frozenset or t is set:
            self.set(value, t is frozenset, depth)
        elif t is bytearray:
            self.put("bytearray(")
            self.add(bytes(value[:self.left + 1]), depth)
            self.put(")")
        elif t is Unhashable:
            self.add(value.value, depth - 1)
        elif t is Call:
            self.call(value, depth)
        elif t is PersId:
            self.put("persistent_load(")
            self.add(value.pid, depth)
            self.put(")")
        elif t is ExtRef:
            self.put(f"<extension {value.code}>")
        elif t is Buffer:
            self.put("<out-of-band buffer>")
        elif isinstance(value, OrderedDict):   # core.pickle.fast.stubs's stand-in: as the exact path
            node = Call(_ORDERED_DICT, ())      # names the call it records
            node.setitems.extend(value.items())
            if value.__dict__:
                node.state.append(dict(value.__dict__))
            self.call(node, depth)
        else:
            g = _global_of(value)
            self.put(g.full if g is not None else f"<{t.__name__}>")

    def text(self, value: Any, depth: int) -> str:
        """The text of `value` alone, spending this budget."""
        parts, self.parts = self.parts, []
        self.add(value, depth)
        out, self.parts = "".join(self.parts), parts
        return out

    def set(self, members: Any, frozen: bool, depth: int) -> None:
        # the same object twice is one member (a set of one memoized tuple listed 50k times
        # cost 26 s); past _MAX_SET_MEMBERS the text is cut anyway: count them instead
        members = list({id(m): m for m in members}.values())
        if len(members) > _MAX_SET_MEMBERS:
            self.put(f"{'frozenset' if frozen else 'set'}(<{len(members)} members>)")
            return
        left = self.left
        if all(map(_seed_free, members)):
            texts = [self.text(m, depth) for m in frozenset(members)]
        else:
            texts = sorted({self.text(m, depth) for m in members})
        self.left = left            # spent again below, as the texts are put
        if not texts:
            self.put("frozenset()" if frozen else "set()")
            return
        self.put("frozenset({" if frozen else "{")
        for i, s in enumerate(texts):
            if self.left < 0:
                return
            self.put(", " + s if i else s)
        self.put("})" if frozen else "}")

    def call(self, call: Call, depth: int) -> None:
        func, args, kwargs = call.func, call.args, call.kwargs
        raw = _bytes_of(call)
        if raw is not None:
            self.add(raw, depth)
            return
        g = _global_of(func)
        if g is not None and type(args) is tuple and not kwargs:
            if g == _DEVICE_G and self.device(args):
                return
            if g == _SIZE and len(args) == 1 and type(args[0]) in (tuple, list) \
                    and all(type(v) is int and v.bit_length() <= _INT_BITS for v in args[0]):
                self.put(f"torch.Size([{', '.join(map(repr, args[0]))}])")
                return
            if g == _LAYOUT and len(args) == 1 and args[0] in LAYOUTS:
                self.put(args[0])      # a layout's repr is the name _get_layout looks up
                return
            if g == _COMPLEX and 1 <= len(args) <= 2 and all(
                    type(v) is float or (type(v) is int and v.bit_length() < 1000) for v in args):
                self.put(repr(complex(*args)))
                return
            if g in _SETS and len(args) <= 1 and (not args or type(args[0]) in (list, tuple)):
                self.set(args[0] if args else (), _SETS[g], depth)
                return
        # fallback: callable(arg, ..., key=value)
        if g is not None:
            self.put(g.full)
        else:
            self.add(func, depth)
        self.put("(")
        if type(args) is tuple:
            self.items(args, depth)
        else:
            self.put("*")
            self.add(args, depth)
        if kwargs:
            if type(args) is not tuple or args:
                self.put(", ")
            if type(kwargs) is dict and all(type(k) is str for k in kwargs):
                for i, (k, v) in enumerate(kwargs.items()):
                    self.put(f"{', ' if i else ''}{k}=")
                    self.add(v, depth)
            else:
                self.put("**")
                self.add(kwargs, depth)
        self.put(")")

    def device(self, args: tuple[Any, ...]) -> bool:
        """`device(type='cuda', index=1)` as torch.device(*args).__repr__; False: not a device."""
        if not 1 <= len(args) <= 2 or type(args[0]) is not str:
            return False
        m = _DEVICE.fullmatch(args[0])
        if m is None or m.group(1) not in DEVICE_TYPES:
            return False
        index: int | None = None if m.group(2) is None else int(m.group(2))
        if len(args) == 2 and args[1] is not None:
            if index is not None or type(args[1]) is not int:
                return False
            index = args[1]
        if index is not None and not 0 <= index <= _MAX_DEVICE_INDEX:
            return False
        self.put(f"device(type='{m.group(1)}'" + ("" if index is None else f", index={index}") + ")")
        return True


