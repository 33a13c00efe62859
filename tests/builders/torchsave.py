"""The data.pkl record of a real `torch.save` (torch is the oracle: tests only)."""

from __future__ import annotations

import io
import zipfile

import pytest


def torch_data_pkl(obj: object) -> bytes:
    """The data.pkl record of `torch.save(obj)` (zip format); the test skips without torch."""
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(buf) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))
