"""core.torch.callables's numpy dtype table vs the installed numpy (the one next to torch 2.13)."""

from __future__ import annotations

import pytest

from ckptguard.core.torch.user_models import NUMPY_DTYPES, numpy_dtype_class

np = pytest.importorskip("numpy")

_SPECS = [*NUMPY_DTYPES, "S0", "S5", "U0", "U3", "V0", "V8", "S999999"]


@pytest.mark.parametrize("prefix", ["", "<", ">", "|", "="])
def test_dtype_class_table_matches_numpy(prefix: str) -> None:
    for spec in _SPECS:
        t = type(np.dtype(prefix + spec, False, True))
        assert numpy_dtype_class(prefix + spec) == f"{t.__module__}.{t.__name__}", prefix + spec


def test_scalar_types_and_itemsizes_match_numpy() -> None:
    for spec, (_cls, scalar, itemsize) in NUMPY_DTYPES.items():
        d = np.dtype(spec)
        assert d.itemsize == itemsize, spec
        if scalar:
            assert f"{d.type.__module__}.{d.type.__name__}" == scalar, spec


def test_specs_outside_the_table_are_not_guessed() -> None:
    for spec in ("!f4", "f3", "float32", "T", "M8[ns]", "", "S1234567", 3, None):
        assert numpy_dtype_class(spec) is None, spec
