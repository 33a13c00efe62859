"""core.pickle.fold: the caps that keep a hostile expression from costing time or memory."""

from __future__ import annotations

from typing import Any

import pytest

from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.pickle.fold import FoldBudget, Unfoldable, fold
from ckptguard.core.values import Call, Global


def run(value: Any, steps: int = DEFAULT_LIMITS.max_fold_steps) -> Any:
    return fold(value, limits=DEFAULT_LIMITS, budget=FoldBudget(steps))


def getattr_call(recv: Any, name: str, *args: Any) -> Call:
    return Call(Call(Global("builtins", "getattr"), (recv, name)), args)


def test_tuple_dag_is_cut_by_the_budget() -> None:
    """t = (t, t) forty times through the memo: 2**40 paths, one budget."""
    t: Any = ("o",)
    for _ in range(40):
        t = (t, t)
    with pytest.raises(Unfoldable, match="too many values"):
        run(getattr_call("", "join", t))


def test_call_dag_is_evaluated_once_per_node() -> None:
    """c = add(c, c) fourteen times: the value doubles (past the cap), each node is evaluated once."""
    c: Any = "o"
    for _ in range(14):
        c = Call(Global("operator", "add"), (c, c))
    assert run(c) == "o" * 2**14
    for _ in range(3):              # 2**17 > the 64 KiB cap
        c = Call(Global("operator", "add"), (c, c))
    with pytest.raises(Unfoldable, match="cap"):
        run(c)


@pytest.mark.parametrize(("value", "reason"), [
    (Call(Global("functools", "reduce"), (Global("operator", "add"), ["a"] * 5000)),
     "too many calls"),
    (getattr_call("a" * 1000, "translate",
                  Call(Global("builtins", "str.maketrans"), ({"a": "b" * 1000},))), "size cap"),
    (getattr_call("a", "center", 10**9), "width"),
    (Call(Global("operator", "mul"), (b"ab", 10**9)), "size cap"),
    (getattr_call("{0.__class__}", "format", "x"), "attribute or index"),
    (Call(Global("operator", "mod"), ("%999999s", "x")), "printf-style"),
    (getattr_call("{:n}", "format", 10**6), "format spec"),
    (getattr_call("", "join", frozenset({"o", "s"})), "frozenset"),
    (Call(Global("codecs", "decode"), (b"x" * 10, "bz2")), "not evaluated"),
    (Call(Global("zlib", "decompress"), (__import__("zlib").compress(b"\0" * 10**6),)), "size cap"),
])
def test_hostile_expression_is_refused(value: Any, reason: str) -> None:
    with pytest.raises(Unfoldable, match=reason):
        run(value)
