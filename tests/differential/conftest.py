"""Differential tests need torch as the oracle (the corpus fixture is in tests/conftest.py)."""

import pytest

torch = pytest.importorskip("torch")
