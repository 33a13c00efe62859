"""Constant folding of computed values: what a graph of pure calls over constants evaluates to.

Strategy: a STACK_GLOBAL whose module or name is not a literal string but the result of
calls (`base64.b64decode(b'b3M=').decode()`, `''.join(reversed('metsys'))`,
`getattr('x', 'join')`, `operator.add('o', 's')`, ...) is evaluated here, symbolically:
only a fixed table of pure functions (string and bytes methods, base64/binascii/codecs
decoders, a few builtins, operator/functools combinators) is ever applied, each to
arguments whose exact types were checked first, under the size caps of `Limits`
(`max_fold_bytes` per input and output, `max_fold_calls` per value, `max_fold_steps`
per pickle). Anything else — a call of a function outside the table, a persistent id,
an EXT code, a set iterated (its order depends on PYTHONHASHSEED), an argument another
call may have mutated before the import — is `Unfoldable`: the caller reports the import
as computed and unresolvable, which no benign pickle produces.

    fold(Call(Global("base64", "b64decode"), (b"b3M=",)), ...)      -> b"os"
    fold(Call(Call(Global("builtins", "getattr"), (b"os", "decode")), ()), ...)  -> "os"
"""

from __future__ import annotations

import base64
import binascii
import codecs
import encodings
import encodings.aliases
import html
import re
import string
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ckptguard.core.limits import Limits
from ckptguard.core.records import record
from ckptguard.core.values import Buffer, Call, ExtRef, Global, PersId

__all__ = ["FoldBudget", "Unfoldable", "fold", "is_computed", "render"]


class Unfoldable(Exception):
    """The value cannot be evaluated statically; the message says why."""


@record(slots=True)
class FoldBudget:
    """Steps left for every fold of one pickle (evaluation and the mutation walk)."""

    steps: int


def is_computed(value: Any) -> bool:
    """A value whose runtime type only the load would know (a call result, an import, ...)."""
    t = type(value)
    return t is Call or t is Global or t is PersId or t is ExtRef


# -- fold-internal callables --------------------------------------------------------------

@record(frozen=True, slots=True)
class _Func:
    """A function of the pure table (`base64.b64decode`, `builtins.str.join`)."""

    name: str


@record(frozen=True, slots=True)
class _Bound:
    """`getattr(receiver, method)` on a str/bytes constant."""

    receiver: Any
    method: str


@record(frozen=True, slots=True)
class _Partial:
    func: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]


@record(frozen=True, slots=True)
class _MethodCaller:
    method: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]


@record(frozen=True, slots=True)
class _ItemGetter:
    items: tuple[Any, ...]


@record(frozen=True, slots=True)
class _AttrGetter:
    name: str


@record(frozen=True, slots=True)
class _Iterator:
    """What reversed()/map() return: only something that iterates it may consume it."""

    items: tuple[Any, ...]




_TEXT = (str, bytes, bytearray)
_MUTABLE = (list, dict, bytearray)

# Codecs the table applies (canonical names after encodings' own normalization and alias
# table): text encodings and the bytes-to-bytes codecs obfuscators use. zlib is inflated
# here with an output cap; bz2/lzma/uu/quopri are not evaluated.
_CODECS = frozenset("""
    utf_8 latin_1 ascii utf_16 utf_16_le utf_16_be utf_32 utf_32_le utf_32_be utf_7
    unicode_escape raw_unicode_escape rot_13 hex_codec base64_codec zlib_codec cp1252
    """.split())
_ERRORS = frozenset({"strict", "ignore", "replace", "surrogateescape", "surrogatepass",
                     "backslashreplace"})
# format() / str.format specs: no nested fields, a width of at most two digits, no 'n'
# (its output follows the process locale)
_FORMAT_SPEC = re.compile(r"(.?[<>=^])?[+\- ]?z?#?0?\d{0,2}[,_]?(\.\d{1,2})?[bcdeEfFgGosxX%]?")
_FIELD_NAME = re.compile(r"\d{0,3}|[A-Za-z_][A-Za-z0-9_]{0,30}")
# printf-style: flags, a width/precision of at most two digits, no '*'
_PERCENT = re.compile(r"%(?:%|(?:\([^()]{0,30}\))?[#0\- +]*\d{0,2}(?:\.\d{0,2})?[diouxXeEfFgGcrsa])")

# Module-level string constants of the standard library (the same on every platform).
_CONSTANTS: dict[str, str] = {f"string.{n}": getattr(string, n) for n in (
    "ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits", "hexdigits", "octdigits",
    "punctuation", "whitespace", "printable")}


def _codec(name: Any) -> str:
    if type(name) is not str or len(name) > 64:
        raise Unfoldable("codec name is not a short str")
    norm = encodings.normalize_encoding(name.lower())
    canonical = encodings.aliases.aliases.get(norm, norm)
    if canonical not in _CODECS:
        raise Unfoldable(f"codec {name!r} is not evaluated")
    return canonical


def _errors(value: Any) -> str:
    if type(value) is not str or value not in _ERRORS:
        raise Unfoldable("codec error handler is not a standard one")
    return value


class _Folder:
    def __init__(self, limits: Limits, budget: FoldBudget) -> None:
        self.limits = limits
        self.budget = budget
        self.calls = 0
        self.done: dict[int, Any] = {}
        # ids of the mutable values (and the calls that produced them) the result depends on
        self.mutable: set[int] = set()
        self.folded: set[int] = set()     # ids of the Call nodes evaluated here

    # -- the walk ------------------------------------------------------------------------
    def value(self, v: Any, depth: int) -> Any:
        if depth > self.limits.max_fold_depth:
            raise Unfoldable("expression nested too deep")
        self.budget.steps -= 1      # a tuple DAG through the memo has 2**depth paths
        if self.budget.steps < 0:
            raise Unfoldable("too many values to evaluate")
        t = type(v)
        if t is str or t is bytes or t is int or t is bool or t is float or v is None:
            self.check_size(v)
            return v
        if t is bytearray or t is list or t is dict:
            self.mutable.add(id(v))
        if t is tuple or t is list:
            self.check_size(v)
            return t(self.value(x, depth + 1) for x in v)
        if t is bytearray:
            self.check_size(v)
            return v
        if t is dict:
            self.check_size(v)
            out = {}
            for k, x in v.items():
                if type(k) is not str:
                    raise Unfoldable("dict with a non-str key")
                out[k] = self.value(x, depth + 1)
            return out
        if t is Global:
            full = v.full
            if full in _CONSTANTS:
                return _CONSTANTS[full]
            if full in _FUNCTIONS or full in _FUNCTION_ALIASES:
                return _Func(_FUNCTION_ALIASES.get(full, full))
            raise Unfoldable(f"{full} is not a known pure function or constant")
        if t is Call:
            key = id(v)
            if key in self.done:
                return self.done[key]
            result = self.call(v, depth)
            self.done[key] = result
            self.folded.add(key)
            if type(result) in _MUTABLE:
                self.mutable.add(key)
            return result
        if t is PersId:
            raise Unfoldable("a persistent id (whatever persistent_load returns)")
        if t is ExtRef:
            raise Unfoldable(f"extension code {v.code} (whatever copyreg's registry holds)")
        if t is Buffer:
            raise Unfoldable("an out-of-band buffer")
        raise Unfoldable(f"a {t.__name__} value")

    def call(self, node: Call, depth: int) -> Any:
        if node.state or node.setitems or node.appends:
            raise Unfoldable("the call's result is changed by BUILD/SETITEM/APPEND")
        if node.opcode not in ("REDUCE", "NEWOBJ", "OBJ", "INST"):
            raise Unfoldable(f"{node.opcode} with keyword arguments")
        self.calls += 1
        self.budget.steps -= 1
        if self.calls > self.limits.max_fold_calls or self.budget.steps < 0:
            raise Unfoldable("too many calls to evaluate")
        if type(node.args) is not tuple:
            raise Unfoldable("call arguments are not a tuple")
        func = self.value(node.func, depth + 1)
        args = tuple(self.value(a, depth + 1) for a in node.args)
        if node.opcode == "NEWOBJ":
            # cls.__new__(cls, *args): only str/bytes/tuple constructors are modelled
            if not (type(func) is _Func and func.name in _NEWOBJ_OK):
                raise Unfoldable("NEWOBJ of a class the table does not model")
        return self.apply(func, args, {})

    def apply(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # every application counts, map()/reduce() steps too: reduce(add, 64k items) would
        # otherwise copy a growing 64 KiB accumulator 64k times
        self.calls += 1
        self.budget.steps -= 1
        if self.calls > self.limits.max_fold_calls or self.budget.steps < 0:
            raise Unfoldable("too many calls to evaluate")
        t = type(func)
        try:
            if t is _Func:
                result = _FUNCTIONS[func.name](self, args, kwargs)
            elif t is _Bound:
                result = _method(self, func.receiver, func.method, args, kwargs)
            elif t is _Partial:
                result = self.apply(func.func, func.args + args, {**dict(func.kwargs), **kwargs})
            elif t is _MethodCaller:
                if len(args) != 1 or kwargs:
                    raise Unfoldable("methodcaller takes one object")
                result = _method(self, args[0], func.method, func.args, dict(func.kwargs))
            elif t is _ItemGetter:
                if len(args) != 1 or kwargs:
                    raise Unfoldable("itemgetter takes one object")
                items = tuple(_getitem(args[0], i) for i in func.items)
                result = items[0] if len(items) == 1 else items
            elif t is _AttrGetter:
                if len(args) != 1 or kwargs:
                    raise Unfoldable("attrgetter takes one object")
                result = _getattr(self, (args[0], func.name), {})
            else:
                raise Unfoldable(f"calling a {type(func).__name__} value")
        except Unfoldable:
            raise
        except (ValueError, TypeError, LookupError, UnicodeError, binascii.Error,
                zlib.error, OverflowError) as exc:
            # the real call raises too, so the load stops before the import; but a model
            # that raises where CPython would not is a bypass: fail closed, never resolved
            raise Unfoldable(f"the call raises {type(exc).__name__}") from exc
        self.check_size(result)
        return result

    def check_size(self, v: Any) -> None:
        t = type(v)
        cap = self.limits.max_fold_bytes
        if (t in _TEXT or t is tuple or t is list or t is dict) and len(v) > cap:
            raise Unfoldable(f"a value of {len(v)} items (the cap is {cap})")
        if t is int and v.bit_length() > 4096:
            raise Unfoldable("an integer too large to evaluate")

    def text(self, v: Any, what: str = "argument") -> Any:
        if type(v) not in _TEXT:
            raise Unfoldable(f"{what} is not str/bytes")
        return v

    # -- the mutation check --------------------------------------------------------------
    def check_unmutated(self, calls: Sequence[Call], live: Sequence[Iterable[Any]]) -> None:
        """A mutable input (a list the pickle built, or a call's list result) may differ from
        what the real call saw: another, earlier call received it and may have changed it
        (`list.__setitem__(l, ...)`), or it is still on the stack or in the memo, where a
        later APPEND/SETITEM changes it after the call was made (the real call ran then)."""
        if not self.mutable:
            return
        for values in live:
            for v in values:
                self.budget.steps -= 1
                if self.budget.steps < 0:
                    raise Unfoldable("too many values to check for mutation")
                if id(v) in self.mutable:
                    raise Unfoldable("a mutable input is still reachable from the stack or "
                                     "the memo (a later APPEND/SETITEM may have changed it)")
        seen: set[int] = set()
        for c in calls:
            if id(c) in self.folded:
                continue
            todo: list[Any] = [c.func, c.args, c.kwargs]
            while todo:
                v = todo.pop()
                self.budget.steps -= 1
                if self.budget.steps < 0:
                    raise Unfoldable("too many values to check for mutation")
                key = id(v)
                if key in self.mutable:
                    raise Unfoldable("an input is passed to another call that may change it")
                t = type(v)
                if key in seen or not (t is tuple or t is list or t is dict or t is Call):
                    continue
                seen.add(key)
                if t is dict:
                    todo.extend(v.values())
                elif t is Call:
                    todo.extend((v.func, v.args, v.kwargs))
                else:
                    todo.extend(v)


def fold(value: Any, *, limits: Limits, budget: FoldBudget, calls: Sequence[Call] = (),
         live: Sequence[Iterable[Any]] = ()) -> Any:
    """The constant `value` evaluates to, or `Unfoldable`.

    `calls` are the pickle's calls so far and `live` the VM's stack and memo values: a
    mutable input that one of them may have changed is not folded.

    >>> from ckptguard.core.limits import DEFAULT_LIMITS
    >>> fold(Call(Global("base64", "b64decode"), (b"b3M=",)), limits=DEFAULT_LIMITS,
    ...      budget=FoldBudget(1000))
    b'os'
    """
    folder = _Folder(limits, budget)
    result = folder.value(value, 0)     # a callable or an iterator is returned as well: the
    folder.check_unmutated(calls, live)  # caller sees it is not a str (pickle refuses it)
    return result


def render(value: Any, budget: int = 160) -> str:
    """A short rendering of an expression for messages: `base64.b64decode(b'b3M=')`."""
    out: list[str] = []
    _render(value, out, 0)
    text = "".join(out)
    return text if len(text) <= budget else text[: budget - 3] + "..."


def _render(v: Any, out: list[str], level: int) -> None:
    if sum(map(len, out)) > 200:
        return
    t = type(v)
    if t is Call:
        if level > 8:
            out.append("...")
            return
        _render(v.func, out, level + 1)
        out.append("(")
        args = v.args if type(v.args) is tuple else (v.args,)
        for i, a in enumerate(args[:4]):
            if i:
                out.append(", ")
            _render(a, out, level + 1)
        out.append(", ...)" if len(args) > 4 else ")")
    elif t is Global:
        out.append(v.full)
    elif t is tuple or t is list:
        out.append("(" if t is tuple else "[")
        for i, a in enumerate(v[:4]):
            if i:
                out.append(", ")
            _render(a, out, level + 1)
        out.append(", ...)" if len(v) > 4 else (")" if t is tuple else "]"))
    elif t in (str, bytes, bytearray):
        out.append(repr(v[:40]) + ("..." if len(v) > 40 else ""))
    elif t in (int, float, bool) or v is None:
        out.append(repr(v)[:40])
    else:
        out.append(f"<{t.__name__}>")


# -- the pure table -------------------------------------------------------------------------

Impl = Callable[[_Folder, tuple[Any, ...], dict[str, Any]], Any]


def _arity(args: tuple[Any, ...], kwargs: dict[str, Any], low: int, high: int) -> None:
    if kwargs or not low <= len(args) <= high:
        raise Unfoldable(f"takes {low}..{high} positional arguments")


def _ints(*values: Any) -> None:
    for v in values:
        if type(v) is not int and v is not None:
            raise Unfoldable("index is not an int")


def _is_plain(v: Any, depth: int = 0) -> bool:
    """Data whose str()/repr() CPython renders the same way here (no callables, no iterators:
    theirs would show a memory address)."""
    t = type(v)
    if t in _TEXT or t is int or t is bool or t is float or v is None:
        return True
    if depth > 8:
        return False
    if t is tuple or t is list:
        return all(_is_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(_is_plain(x, depth + 1) for x in v.values())
    return False


def _getitem(obj: Any, index: Any) -> Any:
    t = type(obj)
    if t not in _TEXT and t is not tuple and t is not list:
        raise Unfoldable("subscript of a value the table does not model")
    if type(index) is slice:
        _ints(index.start, index.stop, index.step)
    elif type(index) is not int:
        raise Unfoldable("subscript is not an int or a slice")
    return obj[index]


def _iterable(f: _Folder, v: Any) -> tuple[Any, ...]:
    """Items of an ordered iterable (never a set: its order depends on PYTHONHASHSEED)."""
    t = type(v)
    if t is _Iterator:
        return tuple(v.items)
    if t is tuple or t is list or t is str:
        return tuple(v)
    if t is bytes or t is bytearray:
        return tuple(v)
    raise Unfoldable(f"iterating a {t.__name__} (only ordered sequences are evaluated)")


def _width(f: _Folder, n: Any) -> int:
    if type(n) is not int or n > f.limits.max_fold_bytes:
        raise Unfoldable("width is not a small int")
    return int(n)


def _check_format(fmt: str) -> None:
    for _literal, field, spec, _conv in string.Formatter().parse(fmt):
        if field is not None and not _FIELD_NAME.fullmatch(field):
            raise Unfoldable("format field with attribute or index access")
        if spec and not _FORMAT_SPEC.fullmatch(spec):
            raise Unfoldable("format spec outside the evaluated subset")


def _check_percent(fmt: Any) -> None:
    text = fmt.decode("latin-1") if type(fmt) is not str else fmt
    rest = _PERCENT.sub("", text)
    if "%" in rest:
        raise Unfoldable("printf-style conversion outside the evaluated subset")


def _mul(f: _Folder, a: Any, n: Any) -> Any:
    if type(n) is not int or type(a) not in (*_TEXT, tuple, list):
        raise Unfoldable("repetition of a value the table does not model")
    if len(a) * max(n, 0) > f.limits.max_fold_bytes:
        raise Unfoldable("repetition past the size cap")
    return a * n


def _add(f: _Folder, a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return a + b
    if ta in (*_TEXT, tuple, list) and (ta is tb or {ta, tb} == {bytes, bytearray}):
        return a + b
    raise Unfoldable("+ of values the table does not model")


def _mod(f: _Folder, a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return a % b
    if type(a) not in _TEXT or not _is_plain(b):
        raise Unfoldable("% of a value the table does not model")
    _check_percent(a)
    text = a.decode("latin-1") if type(a) is not str else a
    # a dict fills %(name)s fields with its values, and %s with itself
    values = (b, *b.values()) if type(b) is dict else b if type(b) is tuple else (b,)
    _check_printed(f, len(a), len(_PERCENT.findall(text)), values)
    return a % b


def _check_printed(f: _Folder, fixed: int, fields: int, values: Iterable[Any]) -> None:
    """Refuse a `%` or `format` whose result may pass the size cap, before it is computed:
    every field may print the widest value (`"%s" * 32768 % (s,) * 32768` is 2 GiB from
    arguments each under the cap)."""
    widest = max((_printed(v) for v in values), default=0)
    if fixed + fields * widest > f.limits.max_fold_bytes:
        raise Unfoldable("formatting past the size cap")


def _printed(v: Any, depth: int = 0) -> int:
    """At most the characters `str`, `repr` or a format spec prints of plain data `v`, a
    field's width and precision (99 at most) included."""
    t = type(v)
    if t in _TEXT:
        return 10 * len(v) + 3 + 99   # repr escapes a character in up to 10 ("\U0010ffff")
    if t is int:   # binary with "_" every 4 digits: 5 characters per 4 bits
        return int(v.bit_length()) * 5 // 4 + 4 + 99
    if t in (tuple, list, set, frozenset) and depth < 8:
        return 2 + sum(_printed(x, depth + 1) + 2 for x in v)
    if t is dict and depth < 8:
        return 2 + sum(_printed(k, depth + 1) + _printed(x, depth + 1) + 4 for k, x in v.items())
    if t in (float, complex):
        return 2 * 420   # "%.99f" of 1e308: 309 digits, the point and 99 more
    return 16 + 99 if t in (bool, type(None)) else 1 << 40


# str / bytes methods: receiver type -> allowed method names (never a mutating one)
_STR_METHODS = frozenset("""
    join replace split rsplit strip lstrip rstrip lower upper swapcase title capitalize
    casefold encode format removeprefix removesuffix partition rpartition zfill center ljust
    rjust translate maketrans splitlines __getitem__ __add__ __mul__ __rmul__ __mod__
    """.split())
_BYTES_METHODS = frozenset("""
    decode join replace split rsplit strip lstrip rstrip lower upper swapcase title
    capitalize removeprefix removesuffix partition rpartition hex fromhex translate
    zfill center ljust rjust splitlines __getitem__ __add__ __mul__ __rmul__ __mod__
    """.split())


def _method(f: _Folder, recv: Any, name: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`recv.name(*args, **kwargs)` for the str/bytes methods of the table."""
    t = type(recv)
    allowed = _STR_METHODS if t is str else _BYTES_METHODS if t in (bytes, bytearray) else None
    if allowed is None or type(name) is not str or name not in allowed:
        raise Unfoldable(f"method {name!r} of a {t.__name__} is not evaluated")
    if name == "__getitem__":
        _arity(args, kwargs, 1, 1)
        return _getitem(recv, args[0])
    if name == "__add__":
        _arity(args, kwargs, 1, 1)
        return _add(f, recv, args[0])
    if name in ("__mul__", "__rmul__"):
        _arity(args, kwargs, 1, 1)
        return _mul(f, recv, args[0])
    if name == "__mod__":
        _arity(args, kwargs, 1, 1)
        return _mod(f, recv, args[0])
    for v in (*args, *kwargs.values()):
        if not (_is_plain(v) or (name == "join" and type(v) is _Iterator)):
            raise Unfoldable(f"argument of {name} is not plain data")
    if name in ("decode", "encode"):
        _arity(args, {}, 0, 2)
        params = dict(zip(("encoding", "errors"), args, strict=False))
        for k, v in kwargs.items():
            if k not in ("encoding", "errors") or k in params:
                raise Unfoldable(f"{name} keyword {k!r}")
            params[k] = v
        encoding = _codec(params.get("encoding", "utf-8"))
        if encoding in ("hex_codec", "base64_codec", "zlib_codec", "rot_13"):
            raise Unfoldable(f"{name} with the bytes-to-bytes codec {encoding}")   # LookupError
        errors = _errors(params.get("errors", "strict"))
        return recv.decode(encoding, errors) if name == "decode" else recv.encode(encoding, errors)
    if name == "join":
        _arity(args, kwargs, 1, 1)
        items = _iterable(f, args[0])
        if sum(len(x) for x in items if type(x) in _TEXT) + len(recv) * len(items) \
                > f.limits.max_fold_bytes:
            raise Unfoldable("join past the size cap")
        return recv.join(items)
    if name == "replace":
        _arity(args, kwargs, 2, 3)
        old, new = args[0], args[1]
        if type(old) not in _TEXT or type(new) not in _TEXT:
            raise Unfoldable("replace of non-text")
        if len(recv) + (len(recv) + 1) * len(new) > f.limits.max_fold_bytes:
            raise Unfoldable("replace past the size cap")
        return recv.replace(*args)
    if name in ("zfill", "center", "ljust", "rjust"):
        if not args:
            raise Unfoldable(f"{name} without a width")
        _width(f, args[0])
    if name == "format":
        _check_format(recv)
        fields = sum(field is not None for _, field, _, _ in string.Formatter().parse(recv))
        _check_printed(f, len(recv), fields, (*args, *kwargs.values()))
    if name in ("translate", "maketrans") and any(type(v) is dict for v in args):
        for d in args:
            if type(d) is dict and len(d) > 1024:
                raise Unfoldable("translation table too large")
    if name == "translate" and args and type(args[0]) is dict:
        longest = max((len(v) for v in args[0].values() if type(v) is str), default=1)
        if len(recv) * longest > f.limits.max_fold_bytes:
            raise Unfoldable("translate past the size cap")
    result = getattr(recv, name)(*args, **kwargs)
    if type(result) is not dict:
        return result
    # str.maketrans returns a dict of int -> int/str/None: keep it as plain data
    return {k: v for k, v in result.items()}


def _unbound(type_name: str, method: str) -> Impl:
    """`str.join(sep, items)`: the first argument is the receiver (and must be that type)."""
    receiver_type = {"str": str, "bytes": bytes, "bytearray": bytearray}[type_name]

    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method in ("maketrans", "fromhex"):      # static / class methods
            if method == "fromhex":
                _arity(args, kwargs, 1, 1)
                if type(args[0]) is not str:
                    raise Unfoldable("fromhex of non-str")
                return receiver_type.fromhex(args[0])       # type: ignore[attr-defined]
            _arity(args, kwargs, 1, 3)
            return _method(f, "", "maketrans", args, kwargs)
        if not args or type(args[0]) is not receiver_type:
            raise Unfoldable(f"{type_name}.{method} on another type")
        return _method(f, args[0], method, args[1:], kwargs)
    return impl


def _simple(fn: Callable[..., Any], low: int, high: int, types: tuple[type, ...]) -> Impl:
    """A stdlib function of text arguments only (base64, binascii, html, unicodedata)."""
    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _arity(args, kwargs, low, high)
        for a in args:
            if type(a) not in types:
                raise Unfoldable(f"{fn.__name__} of a {type(a).__name__}")
        return fn(*args)
    return impl


def _codecs_call(direction: str) -> Impl:
    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _arity(args, {}, 1, 3)
        params = dict(zip(("obj", "encoding", "errors"), args, strict=False))
        for k, v in kwargs.items():
            if k not in ("encoding", "errors") or k in params:
                raise Unfoldable(f"codecs.{direction} keyword {k!r}")
            params[k] = v
        obj = f.text(params["obj"])
        encoding = _codec(params.get("encoding", "utf-8"))
        errors = _errors(params.get("errors", "strict"))
        if encoding == "zlib_codec":
            if errors != "strict":
                raise Unfoldable("zlib codec with an error handler")
            return _inflate(f, obj, zlib.MAX_WBITS) if direction == "decode" else zlib.compress(obj)
        return codecs.decode(obj, encoding, errors) if direction == "decode" \
            else codecs.encode(obj, encoding, errors)
    return impl


def _inflate(f: _Folder, data: Any, wbits: int) -> bytes:
    if type(data) not in (bytes, bytearray):
        raise Unfoldable("inflate of non-bytes")
    d = zlib.decompressobj(wbits)
    out = d.decompress(bytes(data), f.limits.max_fold_bytes + 1)
    if len(out) > f.limits.max_fold_bytes:
        raise Unfoldable("inflates past the size cap")
    if not d.eof:
        raise Unfoldable("incomplete or truncated zlib stream")  # zlib.error in CPython
    return out


def _zlib_decompress(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 2)
    wbits = args[1] if len(args) > 1 else zlib.MAX_WBITS
    if type(wbits) is not int or not (9 <= abs(wbits) <= 15 or 25 <= wbits <= 31
                                      or 40 <= wbits <= 47):
        raise Unfoldable("zlib wbits outside the modelled range")
    return _inflate(f, args[0], wbits)


def _builtin_str(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args and not kwargs:
        return ""
    if len(args) == 1 and not kwargs:
        if type(args[0]) in (str, int, bool, float) or args[0] is None:
            return str(args[0])
        if type(args[0]) in (bytes, bytearray):
            return str(args[0])        # "b'...'" (repr), as CPython
        raise Unfoldable("str() of a value the table does not model")
    if type(args[0]) not in (bytes, bytearray):
        raise Unfoldable("str(obj, encoding) of non-bytes")
    return _method(f, args[0], "decode", args[1:], kwargs)


def _builtin_bytes(kind: type) -> Impl:
    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not args and not kwargs:
            return kind()
        src = args[0]
        if type(src) is str:
            return kind(_method(f, src, "encode", args[1:], kwargs))
        if kwargs or len(args) != 1:
            raise Unfoldable("bytes() with an encoding of non-str")
        if type(src) is int:
            _width(f, src)
            return kind(src)
        if type(src) in (bytes, bytearray, list, tuple):
            items = _iterable(f, src)
            if not all(type(x) is int for x in items):
                raise Unfoldable("bytes() of non-int items")
            return kind(items)
        raise Unfoldable("bytes() of a value the table does not model")
    return impl


def _getattr(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 2, 2)
    obj, name = args
    if type(name) is not str:
        raise Unfoldable("getattr with a non-str name")
    if type(obj) in _TEXT:
        allowed = _STR_METHODS if type(obj) is str else _BYTES_METHODS
        if name not in allowed:
            raise Unfoldable(f"getattr of {name!r} on a {type(obj).__name__}")
        return _Bound(obj, name)
    if type(obj) is _Func:
        full = f"{obj.name}.{name}"
        if full in _FUNCTIONS or full in _FUNCTION_ALIASES:
            return _Func(_FUNCTION_ALIASES.get(full, full))
    raise Unfoldable(f"getattr of {name!r} on a value the table does not model")


def _methodcaller(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args or type(args[0]) is not str:
        raise Unfoldable("methodcaller without a method name")
    return _MethodCaller(args[0], args[1:], tuple(sorted(kwargs.items())))


def _attrgetter(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 1)
    if type(args[0]) is not str or "." in args[0]:
        raise Unfoldable("attrgetter of a dotted or non-str name")
    return _AttrGetter(args[0])


def _partial(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args:
        raise Unfoldable("partial without a function")
    return _Partial(args[0], args[1:], tuple(sorted(kwargs.items())))


def _reduce(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 2, 3)
    items = list(_iterable(f, args[1]))
    if len(args) == 3:
        items.insert(0, args[2])
    if not items:
        raise Unfoldable("reduce of an empty sequence")    # TypeError in CPython
    acc = items[0]
    for x in items[1:]:
        acc = f.apply(args[0], (acc, x), {})
    return acc


def _map(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if kwargs or len(args) < 2:
        raise Unfoldable("map takes a function and iterables")
    columns = [_iterable(f, a) for a in args[1:]]
    return _Iterator(tuple(f.apply(args[0], tuple(row), {}) for row in zip(*columns, strict=False)))


def _seq(kind: type) -> Impl:
    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _arity(args, kwargs, 0, 1)
        return kind(_iterable(f, args[0])) if args else kind()
    return impl


def _reversed(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 1)
    return _Iterator(tuple(reversed(_iterable(f, args[0]))))


def _sorted(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 1)
    items = _iterable(f, args[0])
    if len({type(x) for x in items}) > 1 or not all(type(x) in (str, int, bytes) for x in items):
        raise Unfoldable("sorted of mixed or non-scalar items")
    return sorted(items)


def _chr(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 1)
    if type(args[0]) is not int:
        raise Unfoldable("chr of non-int")
    return chr(args[0])


def _ord(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 1)
    if type(args[0]) not in _TEXT:
        raise Unfoldable("ord of non-text")
    return ord(args[0])


def _int(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 0, 2)
    if not args:
        return 0
    if type(args[0]) not in (int, bool, str, bytes) or (len(args) == 2 and type(args[1]) is not int):
        raise Unfoldable("int() of a value the table does not model")
    return int(*args)


def _number_text(fn: Callable[[int], str]) -> Impl:
    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _arity(args, kwargs, 1, 1)
        if type(args[0]) is not int:
            raise Unfoldable(f"{fn.__name__} of non-int")
        return fn(args[0])
    return impl


def _format(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 2)
    spec = args[1] if len(args) == 2 else ""
    if type(spec) is not str or (spec and not _FORMAT_SPEC.fullmatch(spec)):
        raise Unfoldable("format spec outside the evaluated subset")
    if type(args[0]) not in (str, int, float, bool):
        raise Unfoldable("format of a value the table does not model")
    return format(args[0], spec)


def _slice(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 1, 3)
    _ints(*args)
    return slice(*args)


def _binary(op: Callable[[_Folder, Any, Any], Any]) -> Impl:
    def impl(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _arity(args, kwargs, 2, 2)
        return op(f, args[0], args[1])
    return impl


def _itemgetter(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if kwargs or not args:
        raise Unfoldable("itemgetter without items")
    return _ItemGetter(args)


def _normalize(f: _Folder, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _arity(args, kwargs, 2, 2)
    if args[0] not in ("NFC", "NFD", "NFKC", "NFKD") or type(args[1]) is not str:
        raise Unfoldable("unicodedata.normalize of non-str")
    return unicodedata.normalize(args[0], args[1])


_B = (bytes, bytearray)
_BS = (bytes, bytearray, str)       # base64's decoders accept ASCII str as well

_FUNCTIONS: dict[str, Impl] = {
    "builtins.str": _builtin_str,
    "builtins.bytes": _builtin_bytes(bytes),
    "builtins.bytearray": _builtin_bytes(bytearray),
    "builtins.getattr": _getattr,
    "builtins.chr": _chr,
    "builtins.ord": _ord,
    "builtins.int": _int,
    "builtins.hex": _number_text(hex),
    "builtins.oct": _number_text(oct),
    "builtins.bin": _number_text(bin),
    "builtins.format": _format,
    "builtins.slice": _slice,
    "builtins.reversed": _reversed,
    "builtins.list": _seq(list),
    "builtins.tuple": _seq(tuple),
    "builtins.sorted": _sorted,
    "builtins.map": _map,
    "operator.add": _binary(_add),
    "operator.concat": _binary(_add),
    "operator.mul": _binary(_mul),
    "operator.mod": _binary(_mod),
    "operator.getitem": _binary(lambda f, a, b: _getitem(a, b)),
    "operator.itemgetter": _itemgetter,
    "operator.methodcaller": _methodcaller,
    "operator.attrgetter": _attrgetter,
    "functools.partial": _partial,
    "functools.reduce": _reduce,
    "codecs.decode": _codecs_call("decode"),
    "codecs.encode": _codecs_call("encode"),
    "zlib.decompress": _zlib_decompress,
    "unicodedata.normalize": _normalize,
    "html.unescape": _simple(html.unescape, 1, 1, (str,)),
    **{f"base64.{n}": _simple(getattr(base64, n), 1, 1, _BS) for n in (
        "b64decode", "standard_b64decode", "urlsafe_b64decode", "b32decode", "b32hexdecode",
        "b16decode", "b85decode", "a85decode", "decodebytes")},
    **{f"base64.{n}": _simple(getattr(base64, n), 1, 1, _B) for n in (
        "b64encode", "standard_b64encode", "urlsafe_b64encode", "b32encode", "b32hexencode",
        "b16encode", "b85encode", "a85encode", "encodebytes")},
    **{f"binascii.{n}": _simple(getattr(binascii, n), 1, 1, _BS) for n in (
        "unhexlify", "a2b_hex", "a2b_base64")},
    **{f"binascii.{n}": _simple(getattr(binascii, n), 1, 1, _B) for n in (
        "hexlify", "b2a_hex", "b2a_base64")},
    **{f"builtins.str.{m}": _unbound("str", m) for m in _STR_METHODS},
    **{f"builtins.bytes.{m}": _unbound("bytes", m) for m in _BYTES_METHODS},
    **{f"builtins.bytearray.{m}": _unbound("bytearray", m) for m in _BYTES_METHODS},
}

# Other spellings of the same functions: C modules, re-exports.
_FUNCTION_ALIASES: dict[str, str] = {
    **{f"_operator.{n}": f"operator.{n}" for n in (
        "add", "concat", "mul", "mod", "getitem", "itemgetter", "methodcaller", "attrgetter")},
    **{f"operator.__{n}__": f"operator.{n}" for n in ("add", "concat", "mul", "mod", "getitem")},
    "_functools.partial": "functools.partial",
    "_functools.reduce": "functools.reduce",
    "_codecs.decode": "codecs.decode",
    "_codecs.encode": "codecs.encode",
}

# Constructors NEWOBJ may call (cls.__new__(cls, *args) is the constructor for these)
_NEWOBJ_OK = frozenset({"builtins.str", "builtins.bytes", "builtins.tuple"})
