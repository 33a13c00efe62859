"""Fixtures for the format tests: real .pt2 archives (torch.export is slow: once per session)."""

from __future__ import annotations

import pytest

from tests.core.formats.fmt_cases import pt2_bytes


@pytest.fixture(scope="session")
def pt2_full() -> bytes:
    return pt2_bytes("full")


@pytest.fixture(scope="session")
def pt2_tied() -> bytes:
    return pt2_bytes("tied")


@pytest.fixture(scope="session")
def pt2_conv_aten() -> bytes:
    return pt2_bytes("conv", decompose=True)
