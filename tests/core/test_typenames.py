"""core/typenames.py: the run-time `NamedTuple` makes what typing's makes of the same class
body, so the report's tuples (TensorEntry, StorageEntry, the regions) are the same types
without `import typing` at start-up."""

from __future__ import annotations

import pickle
import typing
from typing import Any

from ckptguard.core import typenames
from ckptguard.core.filemap import Region as MapRegion
from ckptguard.core.regions.region import Region
from ckptguard.core.report import Report, SourceInfo, StorageEntry, TensorEntry

_NAMEDTUPLE_API = ("_fields", "_field_defaults", "__doc__", "__match_args__", "__module__",
                   "__name__", "__qualname__")


def _twins() -> tuple[type, type]:
    """One class body under both NamedTuples (the module's is the run-time one here: mypy
    sees typing's)."""
    made = []
    for base in (typenames.NamedTuple, typing.NamedTuple):
        class Point(base):  # type: ignore[misc, valid-type]
            """A point."""

            x: int
            y: int = 0
            label: str = "origin"

            def norm(self) -> int:
                return abs(self.x) + abs(self.y)

            @property
            def first(self) -> int:
                return self[0]

        made.append(Point)
    return made[0], made[1]


def test_the_run_time_named_tuple_is_typings() -> None:
    ours, theirs = _twins()
    assert typenames.NamedTuple is not typing.NamedTuple   # the run-time one was tested
    for name in _NAMEDTUPLE_API:
        assert getattr(ours, name) == getattr(theirs, name), name
    # (typing turns the annotations' strings into ForwardRefs: the same hints either way)
    assert typing.get_type_hints(ours) == typing.get_type_hints(theirs) == {"x": int, "y": int,
                                                                          "label": str}
    assert ours.__bases__ == theirs.__bases__ == (tuple,)
    a, b = ours(3, -4), theirs(3, -4)
    assert tuple(a) == tuple(b) == (3, -4, "origin")
    assert repr(a) == repr(b) and a.norm() == b.norm() == 7 and a.first == b.first == 3
    assert a._replace(y=1) == b._replace(y=1) and a._asdict() == b._asdict()
    assert ours._make([1, 2, "p"]) == theirs._make([1, 2, "p"])


def test_the_package_tuples_are_named_tuples() -> None:
    for cls in (TensorEntry, StorageEntry, Region, MapRegion):
        assert cls.__bases__ == (tuple,) and cls._fields == tuple(cls.__annotations__)
        values: list[Any] = [f"v{i}" for i in range(len(cls._fields) - len(cls._field_defaults))]
        made = cls(*values)
        assert pickle.loads(pickle.dumps(made)) == made and type(made) is cls
        assert cls.__module__.startswith("ckptguard.core.") and cls.__module__ != typenames.__name__


def test_type_hints_resolve_every_record_and_tuple_of_the_package() -> None:
    """typing.get_type_hints finds no `Any` or `Literal` in ckptguard's modules at run time;
    `type_hints` gives them, and resolves every annotation of every record and tuple (but
    those naming a class imported for the type checker only, to spare the import)."""
    from tests.core.test_records import RECORDS

    classes = [*RECORDS, TensorEntry, StorageEntry, Region, MapRegion]
    unresolved = {}
    for cls in classes:
        try:
            typenames.type_hints(cls)
        except NameError as exc:
            unresolved[cls.__qualname__] = str(exc)
    assert unresolved == {"Analysis": "name 'Region' is not defined"}
    hints = typenames.type_hints(Report)
    assert typing.get_args(hints["format"])[:2] == ("torch-zip", "torch-legacy")
    assert hints["source"] is SourceInfo and typenames.type_hints(TensorEntry)["name"] is str
