"""The names from `typing` that ckptguard needs at run time, without importing `typing`.

`import typing` costs ~1.6 ms on Python 3.11 (it builds every alias it exports): 5% of a
small file's whole-process scan, which issue 14 holds within 5x of `python -c pass`. So
the modules a scan imports name typing for the type checker only:

    TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
    if TYPE_CHECKING:
        from typing import Any

(a type checker takes any name `TYPE_CHECKING` for true), write a module-level alias that
needs typing as a string (`Verdict: TypeAlias = "Literal['safe', ...]"`), and take what
they build classes with from here: `NamedTuple`, a real `collections.namedtuple` class at
run time and typing's own to the type checker; `Protocol`, a plain base class at run time
(nothing checks a protocol then); `overload` and `dataclass_transform`, which only tell the
type checker something. tests/core/scan/test_cold_start.py fails if a small scan imports
typing again; tests/core/test_typenames.py holds `NamedTuple` to typing's.

The price: `typing.get_type_hints` on a ckptguard class finds no `Any` or `Literal` in its
module. `type_hints` below is get_type_hints with those names given.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
    from typing import Protocol as Protocol
    from typing import dataclass_transform as dataclass_transform
    from typing import overload as overload
else:
    from collections import namedtuple

    class _NamedTupleMeta(type):
        """What `class Point(NamedTuple): x: int; y: int = 0` makes under typing: the
        namedtuple of the annotated fields (a field with a value is a default), with the
        class body's methods, docstring and annotations. typing's checks of the body (no
        default before a required field, no `_fields` or `__new__` of its own, no other
        base) are left to mypy, which makes the same ones."""

        def __new__(cls, typename: str, bases: tuple[type, ...], namespace: dict[str, object]):
            annotations = namespace.get("__annotations__", {})
            fields = list(annotations)
            made = namedtuple(typename, fields, defaults=[namespace[name] for name in fields
                                                          if name in namespace],
                              module=namespace["__module__"])
            made.__annotations__ = made.__new__.__annotations__ = dict(annotations)
            for key, value in namespace.items():
                if key not in fields and key not in ("__module__", "__annotations__"):
                    setattr(made, key, value)
            return made

    NamedTuple = type.__new__(_NamedTupleMeta, "NamedTuple", (), {})

    class Protocol:
        """A protocol's base at run time: a plain class (no one checks a protocol then)."""

        __slots__ = ()

    def overload(function):
        return function

    def dataclass_transform(**kwargs):
        return lambda decorator: decorator


def type_hints(obj: object) -> dict[str, object]:
    """`typing.get_type_hints(obj)` for a ckptguard class or function, whose module holds no
    typing names at run time: the ones its annotations use are given here."""
    import typing

    names = {name: getattr(typing, name) for name in ("Any", "IO", "Literal", "NoReturn")}
    return typing.get_type_hints(obj, localns=names)
