"""core.pickle.fold against CPython: random expressions over the pure table evaluate to what
the real functions return (the test calls them; the scanner never does), and any graph of
values folds or refuses without raising anything but Unfoldable."""

from __future__ import annotations

import base64
import binascii
import codecs
import operator
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.pickle.fold import FoldBudget, Unfoldable, fold
from ckptguard.core.values import Call, Global

Expr = tuple[Any, Any]          # (value node for the fold, what CPython computes)


def fn(module: str, name: str) -> Global:
    return Global(module, name)


def method(name: str, recv: Expr, *args: Any) -> Expr:
    """recv.name(*args) spelled getattr(recv, name)(*args)."""
    node = Call(Call(fn("builtins", "getattr"), (recv[0], name)), tuple(args))
    return node, getattr(recv[1], name)(*args)


def call(module: str, name: str, real: Callable[..., Any], *args: Expr) -> Expr:
    return Call(fn(module, name), tuple(a[0] for a in args)), real(*(a[1] for a in args))


TEXT = st.text(alphabet="abcXYZ019 ._-\u00e9", max_size=12)
BYTES = st.binary(max_size=12)


def step(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    def build(kind: int, a: Expr, b: Expr, i: int, j: int) -> Expr:
        if kind == 0 and isinstance(a[1], str):
            return method("upper", a)
        if kind == 1 and isinstance(a[1], str):
            return method("encode", a, "utf-8")
        if kind == 2 and isinstance(a[1], bytes):
            return method("decode", a, "latin-1")
        if kind == 3 and isinstance(a[1], bytes):
            return call("base64", "b64encode", base64.b64encode, a)
        if kind == 4 and isinstance(a[1], bytes):
            return call("binascii", "hexlify", binascii.hexlify, a)
        if kind == 5 and type(a[1]) is type(b[1]) and isinstance(a[1], (str, bytes)):
            return call("operator", "add", operator.add, a, b)
        if kind == 6 and isinstance(a[1], str):
            return call("codecs", "encode", codecs.encode, a, ("rot13", "rot13"))
        if kind == 7 and isinstance(a[1], (str, bytes)):
            sl = Call(fn("builtins", "slice"), (i, j, -1 if i > j else 1))
            return (Call(fn("operator", "getitem"), (a[0], sl)),
                    a[1][slice(i, j, -1 if i > j else 1)])
        if kind == 8 and isinstance(a[1], str) and isinstance(b[1], str):
            return method("replace", a, b[1][:2], "-")
        if kind == 9 and isinstance(a[1], str) and isinstance(b[1], str):
            joined = Call(Call(fn("builtins", "getattr"), (b[0], "join")),
                          (Call(fn("builtins", "reversed"), (a[0],)),))
            return joined, b[1].join(reversed(a[1]))
        return a
    return st.builds(build, st.integers(0, 9), children, children, st.integers(-6, 6),
                     st.integers(-6, 6))


LEAF = st.one_of(TEXT, BYTES).map(lambda v: (v, v))
EXPRS = st.recursive(LEAF, step, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(EXPRS)
def test_fold_equals_cpython(expr: Expr) -> None:
    node, expected = expr
    assert fold(node, limits=DEFAULT_LIMITS, budget=FoldBudget(10_000)) == expected


VALUES = st.recursive(
    st.one_of(st.none(), st.integers(-10**6, 10**6), TEXT, BYTES,
              st.sampled_from([fn("base64", "b64decode"), fn("os", "system"),
                               fn("builtins", "getattr"), fn("operator", "mul")])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner),
        st.builds(lambda f, args: Call(f, tuple(args)), inner, st.lists(inner, max_size=3))),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_fold_never_raises_anything_else(value: Any) -> None:
    try:
        fold(value, limits=DEFAULT_LIMITS, budget=FoldBudget(10_000))
    except Unfoldable:
        pass
