"""Value records: `@record` makes of a class what `@dataclass` makes of it, for less at import.

Every data type of ckptguard is a record: the fields are the class's annotations, in order,
with their defaults or `field(default_factory=...)`, and `@record(frozen=..., slots=...,
eq=...)` gives the class what `@dataclass` with the same options gives it: `__init__`
(positional or keyword arguments, defaults, factories, `__post_init__`), `__repr__`,
`__eq__`, `__hash__` (frozen records; `None` for the other records that compare),
`__match_args__`, `__slots__`, refusal of assignment when frozen, and pickling. `replace`,
`fields` and `asdict` are this module's, as `dataclasses` has them; `copy.replace` works too.

Why not dataclasses: a CLI process imports ~40 data types to scan one file, and
`@dataclass` generates and compiles five or six methods for each: ~1 ms a class on 3.13,
plus 15 ms to import `dataclasses` itself (it imports `inspect`, `ast` and `dis`), a
quarter of a small file's whole-process scan. Here only `__init__` is generated, because
building records is hot in the interpreters, and only once a class has built a few
records (`_DeferredInit`); the other methods are closures over the
field names, made without compiling anything. tests/core/test_records.py holds every record of the
package to what `@dataclass` makes of the same class.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from reprlib import recursive_repr

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform, overload

    _T = TypeVar("_T")
    _C = TypeVar("_C", bound=type)
else:
    from ckptguard.core.typenames import dataclass_transform, overload


class _Missing:
    """No default: a field without one is a required argument."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_FIELDS = "__record_fields__"


class FrozenRecordError(AttributeError):
    """Assignment to a field of a frozen record (dataclasses' FrozenInstanceError)."""


class Field:
    """One field of a record: its name, default or factory, and what it takes part in."""

    __slots__ = ("compare", "default", "default_factory", "init", "name", "repr")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING, init: bool = True,
                 repr: bool = True, compare: bool = True) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return (f"Field(name={self.name!r}, default={self.default!r}, "
                f"default_factory={self.default_factory!r}, init={self.init}, repr={self.repr}, "
                f"compare={self.compare})")


def field(*, default: Any = MISSING, default_factory: Callable[[], Any] = MISSING, init: bool = True,
          repr: bool = True, compare: bool = True) -> Any:
    """A field with a default factory or with options, as `dataclasses.field`."""
    return Field(default, default_factory, init, repr, compare)


# (noqa F811: ruff knows typing's `overload`, not the run-time one of core.typenames, so it
# takes the overloads below for redefinitions)
@overload
def record(cls: _C, /) -> _C: ...
@overload
def record(*, frozen: bool = False, eq: bool = True, slots: bool = False) -> Callable[[_C], _C]: ...  # noqa: F811


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Any = None, /, *, frozen: bool = False, eq: bool = True,  # noqa: F811
           slots: bool = False) -> Any:
    """Make `cls` a record (see the module's docstring); the options are dataclass's."""
    def wrap(cls: type) -> type:
        return _make(cls, frozen=frozen, eq=eq, slots=slots)
    return wrap if cls is None else wrap(cls)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record or record class, in order."""
    try:
        return getattr(obj, _FIELDS)  # type: ignore[no-any-return]
    except AttributeError:
        raise TypeError("must be called with a record type or instance") from None


def is_record(obj: Any) -> bool:
    return hasattr(type(obj) if not isinstance(obj, type) else obj, _FIELDS)


def replace(obj: _T, /, **changes: Any) -> _T:
    """A new record like `obj` with `changes` (`dataclasses.replace`)."""
    for f in fields(obj):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False, it cannot be "
                                 "specified with replace()")
        elif f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


def asdict(obj: Any) -> dict[str, Any]:
    """The record as a dict, nested records, lists, tuples and dicts converted and copied
    (`dataclasses.asdict`)."""
    if not hasattr(type(obj), _FIELDS):   # (a record class's type is `type`: not one)
        raise TypeError("asdict() should be called on record instances")
    return _converted(obj)  # type: ignore[no-any-return]


_ATOMS = (str, int, float, bool, bytes, type(None), complex)


def _converted(value: Any) -> Any:
    if type(value) in _ATOMS:
        return value
    if hasattr(type(value), _FIELDS):
        return {f.name: _converted(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):   # a namedtuple keeps its type
        return type(value)(*[_converted(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_converted(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_converted(k), _converted(v)) for k, v in value.items())
    import copy  # only for a leaf that is none of the above
    return copy.deepcopy(value)


# -- building the class ----------------------------------------------------------------


def _make(cls: type, *, frozen: bool, eq: bool, slots: bool) -> type:
    own = _own_fields(cls)
    inherited = [f for base in reversed(cls.__mro__[1:]) if base.__dict__.get(_FIELDS) is not None
                 for f in base.__dict__[_FIELDS]]
    by_name = {f.name: f for f in inherited}
    by_name.update({f.name: f for f in own})
    all_fields = tuple(by_name.values())
    _check_order(cls, all_fields)
    # what the class itself defines is kept, as @dataclass keeps it
    defined = {name for name in ("__init__", "__repr__", "__eq__", "__match_args__")
               if name in cls.__dict__}
    class_hash = cls.__dict__.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in cls.__dict__))
    if slots:
        cls = _slotted(cls, [f.name for f in own], frozen)
    else:
        for f in own:   # the class keeps a plain default as its attribute, as with dataclasses
            if isinstance(cls.__dict__.get(f.name), Field):
                if f.default is MISSING:
                    delattr(cls, f.name)
                else:
                    setattr(cls, f.name, f.default)

    methods: dict[str, Any] = {_FIELDS: all_fields, "__replace__": replace,
                               # as dataclasses' __dataclass_params__: what was asked for
                               "__record_params__": {"frozen": frozen, "eq": eq, "slots": slots,
                                                     "defined": frozenset(defined)}}
    if "__init__" not in defined:
        methods["__init__"] = _DeferredInit(cls, all_fields, frozen)
    if "__repr__" not in defined:
        methods["__repr__"] = _repr(cls, [f.name for f in all_fields if f.repr])
    compared = [f.name for f in all_fields if f.compare]
    if eq and "__eq__" not in defined:
        methods["__eq__"] = _eq(compared)
    if frozen:
        methods["__setattr__"], methods["__delattr__"] = _frozen(cls, frozenset(by_name))
    if eq and not explicit_hash:
        methods["__hash__"] = _hash(compared) if frozen else None
    if "__match_args__" not in defined:
        methods["__match_args__"] = tuple(f.name for f in all_fields if f.init)
    for name, value in methods.items():
        setattr(cls, name, value)
    return cls


def _own_fields(cls: type) -> list[Field]:
    out = []
    for name, annotation in cls.__annotations__.items():   # its own (3.10+), not a base's
        if _is_classvar(annotation):
            continue
        default = cls.__dict__.get(name, MISSING)
        f = default if isinstance(default, Field) else Field(default)
        f.name = name
        if f.default is not MISSING and type(f.default).__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: "
                             "use default_factory")
        out.append(f)
    return out


def _is_classvar(annotation: Any) -> bool:
    if isinstance(annotation, str):   # `from __future__ import annotations`
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    from typing import ClassVar  # (only for a module without `from __future__ import annotations`)

    return annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar


def _check_order(cls: type, all_fields: tuple[Field, ...]) -> None:
    seen_default = False
    for f in all_fields:
        if not f.init:
            continue
        if f.default is MISSING and f.default_factory is MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument "
                                f"in {cls.__qualname__}")
        else:
            seen_default = True


_FACTORY = object()   # the argument was not given: call the field's factory


class _DeferredInit:
    """The constructor until it is compiled. A scan builds some records once (`Limits`, 58
    fields, the options, the report) and others by the hundred thousand: compiling every
    constructor at import was ~3 ms of a small file's whole-process scan. So the first
    `_COMPILE_AFTER` records of a class are built by `_bind`, a loop over the fields; then the
    constructor is compiled and put on the class in this object's place. Anything else that
    looks it up (`inspect.signature`, a call `_bind` cannot bind: its error must be the
    compiled one's) compiles it at once."""

    __slots__ = ("calls", "cls", "fields", "frozen")

    def __init__(self, cls: type, all_fields: tuple[Field, ...], frozen: bool) -> None:
        self.cls, self.fields, self.frozen, self.calls = cls, all_fields, frozen, 0

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is not None and self.calls < _COMPILE_AFTER:
            self.calls += 1
            return lambda *args, **kwargs: self._bind(obj, args, kwargs)
        init = self._compiled()
        return init if obj is None else init.__get__(obj, owner)

    def _compiled(self) -> Callable[..., None]:
        init: Any = self.cls.__dict__["__init__"]
        if init is self:   # (else another thread compiled it since the lookup)
            init = _init(self.cls, self.fields, self.frozen)
            type.__setattr__(self.cls, "__init__", init)
        return init  # type: ignore[no-any-return]

    def _bind(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """What the compiled constructor does, for a call it accepts; any other goes to it."""
        taken = [f.name for f in self.fields if f.init]
        values = dict(zip(taken, args, strict=False))
        if len(args) > len(taken) or any(name in values or name not in taken for name in kwargs):
            return self._compiled()(obj, *args, **kwargs)
        values.update(kwargs)
        if any(f.init and f.name not in values and f.default is MISSING
               and f.default_factory is MISSING for f in self.fields):
            return self._compiled()(obj, *args, **kwargs)   # (before any factory runs)
        set_field = object.__setattr__ if self.frozen else setattr
        for f in self.fields:
            if f.init and f.name in values:
                value = values[f.name]
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            elif f.default is not MISSING:
                value = f.default
            else:
                continue
            set_field(obj, f.name, value)
        if hasattr(self.cls, "__post_init__"):
            obj.__post_init__()
        return None


_COMPILE_AFTER = 16


def _init(cls: type, all_fields: tuple[Field, ...], frozen: bool) -> Callable[..., None]:
    """Compile the one generated method, the constructor: records are built by the
    hundred thousand in the interpreters, where a generic loop costs 5x."""
    names: dict[str, Any] = {"__record_factory__": _FACTORY, "__record_setattr__": object.__setattr__}
    params, body = [], []
    for f in all_fields:
        value = f.name
        if f.init:
            if f.default_factory is not MISSING:
                names[f"__record_factory_{f.name}__"] = f.default_factory
                params.append(f"{f.name}=__record_factory__")
                value = (f"__record_factory_{f.name}__() if {f.name} is __record_factory__ "
                         f"else {f.name}")
            elif f.default is not MISSING:
                names[f"__record_default_{f.name}__"] = f.default
                params.append(f"{f.name}=__record_default_{f.name}__")
            else:
                params.append(f.name)
        elif f.default_factory is not MISSING:
            names[f"__record_factory_{f.name}__"] = f.default_factory
            value = f"__record_factory_{f.name}__()"
        elif f.default is not MISSING:
            names[f"__record_default_{f.name}__"] = f.default
            value = f"__record_default_{f.name}__"
        else:
            continue
        body.append(f"__record_setattr__(__record_self__, {f.name!r}, {value})" if frozen
                    else f"__record_self__.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("__record_self__.__post_init__()")
    # (not `self`: a field may be named so, as with dataclasses)
    source = (f"def __init__(__record_self__, {', '.join(params)}):\n "
              + "\n ".join(body or ["pass"]))
    exec(source, names)   # noqa: S102 - our own field names, checked identifiers
    init: Callable[..., None] = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _values(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda obj: ()
    get = attrgetter(*names)
    return (lambda obj: (get(obj),)) if len(names) == 1 else get


def _repr(cls: type, names: list[str]) -> Callable[[Any], str]:
    @recursive_repr()
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({inner})"
    __repr__.__qualname__ = f"{cls.__qualname__}.__repr__"
    return __repr__


def _eq(names: list[str]) -> Callable[[Any, Any], Any]:
    values = _values(names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented
    return __eq__


def _hash(names: list[str]) -> Callable[[Any], int]:
    values = _values(names)
    return lambda self: hash(values(self))


def _frozen(cls: Any, names: frozenset[str]) -> tuple[Callable[..., None], Callable[..., None]]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenRecordError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenRecordError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)
    return __setattr__, __delattr__


def _slotted(cls: type, own: list[str], frozen: bool) -> type:
    """The class again, with `__slots__` for its own fields (a class's slots are fixed when
    it is created, so `dataclass(slots=True)` recreates it too)."""
    body = dict(cls.__dict__)
    body["__slots__"] = tuple(own)
    for name in own:
        body.pop(name, None)   # defaults live in __init__; a class attribute would hide the slot
    body.pop("__dict__", None)
    body.pop("__weakref__", None)
    if frozen:   # unpickling sets slots with setattr, which a frozen record refuses
        body["__getstate__"] = _getstate
        body["__setstate__"] = _setstate
    new: type = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    return new


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(fields(self), state, strict=True):
        object.__setattr__(self, f.name, value)
