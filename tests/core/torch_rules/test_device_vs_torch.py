"""core.torch.callables's torch.device model vs real `torch.device(...)` (torch 2.13, CPU host).

Every device type torch lists, with and without an index, string forms ("xla:1"), invalid
strings and index types: the model must give torch's exception type and message, or say
"Unmodelled" (only where the answer depends on the host: an int means "the accelerator").
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from ckptguard.core.torch.callables import _DEVICE_TYPES, Fail, call_allowed
from ckptguard.core.values import Global

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

_TYPES = _DEVICE_TYPES.split(", ")
_SUFFIXES = ("", ":0", ":1", ":-1", ":x", ":01", ":", ":99999", ":255", ":2147483647", ":2147483648",
             ":0:0", "0", " ")
_INDEXES: tuple[Any, ...] = (None, 0, 1, -1, -2, 255, 2**15, 2**63 - 1, 2**63, -2**63, -2**63 - 1, True,
                             1.5, "0", [], ())


def _cases() -> list[tuple[Any, ...]]:
    strs = [t + s for t in [*_TYPES, "foo", "a_b", "_", "XPU", "Cpu"] for s in _SUFFIXES]
    strs += ["", "é", "a-b", "cuda:٣", " cpu", "privateuse1", "PrivateUse1"]
    out: list[tuple[Any, ...]] = [(s,) for s in strs] + [(s, i) for s in strs for i in _INDEXES]
    out += [(None,), (1.5,), ([],), ((),), ({},), (True,), (1, "cpu"), (None, 1), (1.5, []), ("cpu", 1, 2),
            (), ("cpu", None, None), ([1],), (0,), (1, 2, 3, 4)]
    return out


def _torch(args: tuple[Any, ...]) -> tuple[str, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.device(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def _model(args: tuple[Any, ...]) -> tuple[str, str]:
    try:
        call_allowed(Global("torch", "device"), args, lambda v: None, "REDUCE", 0)
    except Fail as exc:
        return exc.type, exc.message
    return "ok", ""


def test_device_model_matches_torch() -> None:
    cases = _cases()
    mismatches, unmodelled = [], []
    for args in cases:
        got = _model(args)
        if got[0] == "Unmodelled":
            unmodelled.append(args)
            continue
        want = _torch(args)
        if got != want:
            mismatches.append((args, want, got))
    assert not mismatches, mismatches[:5]
    # only the host-dependent int form and non-plain argument types are left to "Unmodelled"
    assert unmodelled == [([1],), (0,)], unmodelled


def test_every_device_type_loads_with_and_without_index() -> None:
    for t in _TYPES:
        for args in ((t,), (t, 0), (t, 3), (f"{t}:1",), (t, None)):
            assert _model(args) == ("ok", "") == _torch(args), args


def test_device_type_list_matches_torch() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.device("nope")
    assert str(info.value) == (f"Expected one of {_DEVICE_TYPES} device type at start of device string: "
                               "nope")
