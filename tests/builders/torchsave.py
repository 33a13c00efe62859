"""The data.pkl record of a real `torch.save` (torch is the oracle: tests only)."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pytest


def torch_data_pkl(obj: object) -> bytes:
    """The data.pkl record of `torch.save(obj)` (zip format); the test skips without torch."""
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(buf) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))


def loaded_tensors(obj: Any) -> list[Any]:
    """Every tensor in an object torch.load returned, in no particular order: dict keys and
    values, a dict subclass's attributes (an OrderedDict BUILD's), list, tuple and set items."""
    torch = pytest.importorskip("torch")
    out, stack, seen = [], [obj], set()
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif id(x) in seen:
            continue
        elif isinstance(x, dict):
            seen.add(id(x))
            stack += [*x.keys(), *x.values(), *getattr(x, "__dict__", {}).values()]
        elif isinstance(x, (list, tuple, set, frozenset)):
            seen.add(id(x))
            stack += list(x)
    return out
