"""core/records.py: every record of the package behaves as `@dataclass` makes the same class.

The differential half builds, for each record class ckptguard defines, the dataclass with the
same fields and options (`dataclasses.make_dataclass`) and compares what users see: the
constructor's signature and its errors, defaults and factories (a fresh object per
instance), `__match_args__`, equality, hashing, `repr`, frozenness, slots, `replace`,
`asdict` and pickling. The other half pins the module's own rules.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import pkgutil
import sys
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptguard
from ckptguard.core import records
from ckptguard.core.records import FrozenRecordError, field, record


def _all_record_classes() -> list[type]:
    found: dict[type, None] = {}
    for info in pkgutil.walk_packages(ckptguard.__path__, "ckptguard."):
        if info.name.endswith("migrations.env"):   # alembic's script: runs only under alembic
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__ \
                    and records.is_record(value):
                found[value] = None
    return list(found)


RECORDS = _all_record_classes()


def test_the_package_has_no_dataclass_left() -> None:
    """One kind of record: a dataclass would bring back the import cost the module removes."""
    assert len(RECORDS) > 70
    left = []
    for info in pkgutil.walk_packages(ckptguard.__path__, "ckptguard."):
        if info.name.endswith("migrations.env"):
            continue
        module = importlib.import_module(info.name)
        left += [f"{info.name}.{name}" for name, value in vars(module).items()
                 if isinstance(value, type) and value.__module__ == module.__name__
                 and dataclasses.is_dataclass(value)]
    assert left == []


def _twin(cls: type) -> type:
    """The dataclass @dataclass makes of `cls`'s fields, options and own methods."""
    params = cls.__record_params__  # type: ignore[attr-defined]
    specs = []
    for f in records.fields(cls):
        kw: dict[str, Any] = {"init": f.init, "repr": f.repr, "compare": f.compare}
        if f.default is not records.MISSING:
            kw["default"] = f.default
        if f.default_factory is not records.MISSING:
            kw["default_factory"] = f.default_factory
        specs.append((f.name, Any, dataclasses.field(**kw)))
    generated = {"__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__",
                 "__match_args__", "__replace__", "__getstate__", "__setstate__", "__slots__",
                 "__dict__", "__weakref__", "__annotations__", "__module__", "__qualname__"}
    names = {f.name for f in records.fields(cls)}
    own = {name: value for name, value in cls.__dict__.items()
           if name in params["defined"] or not (name in generated or name in names
                                                 or name.startswith("__record"))}
    return dataclasses.make_dataclass(cls.__name__, specs, namespace=own, frozen=params["frozen"],
                                      eq=params["eq"], slots=params["slots"])


def _arguments(cls: type, seed: int) -> dict[str, Any] | None:
    """Values for every required argument (distinct per seed), or None when the class's own
    __init__ or __post_init__ wants real values."""
    out = {f.name: ("value", seed, i) for i, f in enumerate(records.fields(cls))
           if f.init and f.default is records.MISSING and f.default_factory is records.MISSING}
    try:
        cls(**out)
    except Exception:
        return None
    return out


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_a_record_is_what_dataclass_makes_of_it(cls: type) -> None:
    twin = _twin(cls)
    params = cls.__record_params__  # type: ignore[attr-defined]
    if "__init__" not in params["defined"]:
        ours, theirs = inspect.signature(cls), inspect.signature(twin)
        assert [(p.name, p.kind, p.default is p.empty) for p in ours.parameters.values()] == \
               [(p.name, p.kind, p.default is p.empty) for p in theirs.parameters.values()]
    assert cls.__match_args__ == twin.__match_args__  # type: ignore[attr-defined]
    assert (cls.__hash__ is None) == (twin.__hash__ is None)
    assert hasattr(cls, "__slots__") == hasattr(twin, "__slots__")
    if hasattr(cls, "__slots__"):
        assert cls.__slots__ == twin.__slots__  # type: ignore[attr-defined]

    args = _arguments(cls, 1)
    if args is None:
        return
    args2 = _arguments(cls, 2) or args
    a, b, other = cls(**args), twin(**args), cls(**args2)
    assert repr(a) == repr(b).replace(twin.__qualname__, cls.__qualname__, 1) or \
        "__repr__" in params["defined"]
    # (dataclasses.asdict takes a nested record for a leaf: it knows only dataclasses)
    assert records.asdict(a) == {k: records.asdict(v) if records.is_record(v) else v
                                 for k, v in dataclasses.asdict(b).items()}
    assert (a == cls(**args)) is params["eq"]   # eq=False: identity, as object's
    assert (a == other) == (b == twin(**args2))
    assert a != b and b != a   # another class: never equal, as two dataclasses
    if params["eq"] and cls.__hash__ is not None:
        assert (hash(a) == hash(cls(**args))) and hash(a) == hash(b)
    for f in records.fields(cls):   # a mutable factory product is never shared
        if f.default_factory is not records.MISSING and type(f.default_factory()).__hash__ is None:
            assert getattr(a, f.name) is not getattr(cls(**args), f.name)
    assert records.asdict(records.replace(a)) == records.asdict(a)
    assert (records.replace(a) == a) is (dataclasses.replace(b) == b)
    assert hasattr(a, "__dict__") == hasattr(b, "__dict__")
    name = next((f.name for f in records.fields(cls) if f.init), None)
    if name is not None:
        if params["frozen"]:
            with pytest.raises(AttributeError):
                setattr(a, name, 1)
            with pytest.raises(AttributeError):
                setattr(b, name, 1)
        assert getattr(records.replace(a, **{name: "changed"}), name) == "changed"


# -- the module's own rules --------------------------------------------------------------------


@record(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)
    origin: ClassVar[str] = "zero"


@record(slots=True)
class _Box:
    corner: _Point
    names: dict[str, tuple[int, ...]] = field(default_factory=dict)
    hidden: int = field(default=5, repr=False, compare=False)


def test_frozen_records_refuse_assignment_and_deletion() -> None:
    p = _Point(1)
    with pytest.raises(FrozenRecordError, match="cannot assign to field 'x'"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(FrozenRecordError):
        del p.y  # type: ignore[misc]
    assert isinstance(FrozenRecordError(), AttributeError)


def test_factories_defaults_and_class_variables() -> None:
    a = _Point(1)
    assert a.tags == () and _Box(a).names is not _Box(a).names
    assert _Point.origin == "zero" and [f.name for f in records.fields(_Point)] == ["x", "y", "tags"]
    assert _Box(a).hidden == 5 and _Box(a) == _Box(a, hidden=6)   # compare=False
    assert "hidden" not in repr(_Box(a))


@given(st.integers(), st.integers(), st.lists(st.text(max_size=3), max_size=3).map(tuple))
@settings(max_examples=50, deadline=None)
def test_equality_hash_replace_and_pickling(x: int, y: int, tags: tuple[str, ...]) -> None:
    p = _Point(x, y, tags)
    assert p == _Point(x=x, y=y, tags=tags) and p != _Point(x + 1, y, tags)
    assert records.replace(p, y=y + 1) == _Point(x, y + 1, tags)
    assert pickle.loads(pickle.dumps(p)) == p   # frozen and slotted: __setstate__
    assert copy.deepcopy(p) == p
    assert hash(p) == hash(_Point(x, y, tags))
    box = _Box(p, {"a": (x,)})
    assert records.asdict(box) == {"corner": {"x": x, "y": y, "tags": tags}, "names": {"a": (x,)},
                                   "hidden": 5}
    inner = [x]
    assert records.asdict(_Box(p, {"a": inner}))["names"]["a"] is not inner   # copied


@pytest.mark.skipif(sys.version_info < (3, 13), reason="copy.replace is new in 3.13")
def test_copy_replace_works_on_records() -> None:
    assert copy.replace(_Point(1), y=3) == _Point(1, 3)  # type: ignore[attr-defined]


def test_declaration_errors_match_dataclasses() -> None:
    with pytest.raises(ValueError, match="mutable default"):
        @record
        class _Mutable:
            items: list[int] = []

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @record
        class _Order:
            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(ValueError, match="both default and default_factory"):
        field(default=1, default_factory=list)
    with pytest.raises(TypeError, match="record"):
        records.fields(object())
    with pytest.raises(ValueError, match="init=False"):
        records.replace(_Nothing(), n=1)


@record
class _Nothing:
    n: int = field(default=0, init=False)


def test_post_init_runs_after_the_fields_are_set() -> None:
    seen = []

    @record
    class _Checked:
        value: int

        def __post_init__(self) -> None:
            seen.append(self.value)

    _Checked(7)
    assert seen == [7]


# -- the first records of a class are bound without compiling its constructor -----------------


def _shapes(frozen: bool, slots: bool) -> tuple[type, type]:
    """Two fresh record classes of one shape (required, default, factory and init=False
    fields, a base's fields, `__post_init__`): the constructor of neither is compiled yet."""
    def make() -> type:
        @record(frozen=frozen, slots=slots)
        class _Base:
            a: int
            b: int = 1

        @record(frozen=frozen, slots=slots)
        class _Shape(_Base):
            c: list[int] = field(default_factory=list)
            d: int = field(default=5, init=False)
            e: dict[str, int] = field(default_factory=dict, init=False)
            f: str = "f"

            def __post_init__(self) -> None:   # runs once every field is set
                object.__setattr__(self, "f", f"{self.f}:{self.a}:{self.d}:{len(self.e)}")
        return _Shape
    return make(), make()


_NAMES = st.sampled_from(["a", "b", "c", "d", "e", "f", "g"])
_VALUES = st.one_of(st.integers(-3, 3), st.lists(st.integers(0, 2), max_size=2), st.text(max_size=2))


def _outcome(cls: type, args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        made = cls(*args, **kwargs)
    except TypeError as exc:
        return ("TypeError", str(exc).replace(cls.__qualname__, "<cls>"))
    return [(f.name, getattr(made, f.name)) for f in records.fields(made)]


@given(st.booleans(), st.booleans(), st.lists(_VALUES, max_size=6),
       st.dictionaries(_NAMES, _VALUES, max_size=4))
@settings(max_examples=300, deadline=None)
def test_bound_records_equal_compiled_ones(frozen: bool, slots: bool, args: list[Any],
                                            kwargs: dict[str, Any]) -> None:
    bound, compiled = _shapes(frozen, slots)
    inspect.signature(compiled)   # looking the constructor up compiles it
    assert inspect.isfunction(compiled.__dict__["__init__"])
    assert not inspect.isfunction(bound.__dict__["__init__"])
    assert _outcome(bound, args, kwargs) == _outcome(compiled, args, kwargs)
    made = bound(1)   # a factory's product is never shared
    assert made.c is not bound(1).c and made.e is not bound(1).e


def test_a_class_compiles_its_constructor_after_a_few_records() -> None:
    cls, _ = _shapes(frozen=True, slots=True)
    made = [cls(i) for i in range(records._COMPILE_AFTER)]
    assert not inspect.isfunction(cls.__dict__["__init__"])
    made.append(cls(99))
    assert inspect.isfunction(cls.__dict__["__init__"])
    assert [m.a for m in made] == [*range(records._COMPILE_AFTER), 99]

    class _Plain(_shapes(frozen=False, slots=False)[0]):   # type: ignore[misc]
        """A subclass that is no record: its records are bound by the base's constructor."""
    assert _Plain(3, f="x").f == "x:3:5:0" and records.fields(_Plain(3))[0].name == "a"
    assert list(inspect.signature(_Plain).parameters) == ["a", "b", "c", "f"]


def test_a_call_that_cannot_bind_runs_no_factory_and_self_is_a_field_name() -> None:
    made: list[int] = []

    def factory() -> list[int]:
        made.append(1)
        return []

    @record
    class _Late:
        cache: list[int] = field(default_factory=factory, init=False)
        self: int = field(default=0)   # a field may be named `self`, as with dataclasses
        value: int = field(default=1)

    with pytest.raises(TypeError, match="unexpected keyword argument 'other'"):
        _Late(other=1)  # type: ignore[call-arg]
    assert made == []   # refused before the factory ran
    assert [(m.self, m.value) for m in (_Late(5), _Late(self=6, value=7))] == [(5, 1), (6, 7)]
    inspect.signature(_Late)   # compiled: the same
    assert (_Late(8).self, len(made)) == (8, 3)

    @record
    class _Required:
        cache: list[int] = field(default_factory=factory, init=False)
        value: int = field()

    made.clear()
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'value'"):
        _Required()  # type: ignore[call-arg]
    assert made == []
