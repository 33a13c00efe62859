"""Fixtures for the VM tests: real torch data.pkl bytes (torch is the oracle, tests only)."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from tests.builders.torchsave import torch_data_pkl


def torch_legacy_stream(obj: object) -> bytes:
    """A legacy (_use_new_zipfile_serialization=False) torch stream."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


@pytest.fixture(scope="session")
def make_torch_pkl() -> Callable[[object], bytes]:
    return torch_data_pkl


@pytest.fixture(scope="session")
def state_dict_pkl() -> bytes:
    """data.pkl of a small, varied state_dict: typed storages, shared storage, Parameter, ints."""
    import torch

    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    sd = {
        "w": w,
        "view": w[1],
        "half": torch.ones(3, dtype=torch.float16),
        "p": torch.nn.Parameter(torch.zeros(2)),
        "step": 7,
        "nested": {"lr": 0.5, "names": ["a", "b"]},
    }
    return torch_data_pkl(sd)
