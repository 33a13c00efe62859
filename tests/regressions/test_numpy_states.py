"""Hand-made numpy states (red team, round 3) that numpy itself refuses.

With the numpy globals allowlisted, torch.load(weights_only=True) runs numpy's own
`_reconstruct` and `ndarray.__setstate__`, which refuse: raw bytes as an object array's
items, a dtype code numpy does not know, 65 dimensions. The scan must never call such a
file loadable. `obj_list.pt` (items as a list, as numpy writes them) loads, and so must it
in the scan; `recon_big.pt` (`_reconstruct` of 2**24 objects, not what numpy writes) loads
in torch, and the scan may only call it unmodelled, never refused.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytestmark = pytest.mark.torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "numpy_states"
ALLOW = ["numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
         "numpy.dtypes.ObjectDType", "numpy.dtypes.Float32DType", "numpy.dtypes.Float64DType",
         "numpy.dtypes.Int64DType", "numpy.dtypes.UInt8DType"]


def _torch_loads(path: Path) -> bool:
    import numpy._core.multiarray as multiarray

    return _torch_loads_with(path, [
        multiarray._reconstruct, np.ndarray, np.dtype, np.dtypes.ObjectDType,
        np.dtypes.Float32DType, np.dtypes.Float64DType, np.dtypes.Int64DType, np.dtypes.UInt8DType])


@pytest.mark.parametrize("name", ["obj_bytes", "bad_dtype_bytes", "dims65", "recon_big", "obj_list"])
def test_numpy_states_numpy_refuses_are_never_loadable(name: str) -> None:
    path = FIXTURES / f"{name}.pt"
    report = scan_path(path, options=ScanOptions(allow=frozenset(ALLOW)))
    loads = _torch_loads(path)
    assert loads == (name in ("obj_list", "recon_big"))
    wo = report.weights_only
    if not loads:
        assert not wo.loadable and report.verdict != "safe", wo
    elif name == "obj_list":
        assert wo.loadable and report.verdict == "safe", wo
    else:
        assert wo.loadable or wo.error_type == "Unmodelled", wo


@pytest.mark.parametrize("legacy", [False, True])
def test_pasting_the_hint_loads_a_numpy_rng_checkpoint(tmp_path: Path, legacy: bool) -> None:
    """HF Trainer's rng_state.pth holds np.random.get_state(): the report's
    safe_globals_hint, pasted as is, must make torch load the file (zip and legacy)."""
    import importlib

    path = tmp_path / "rng_state.pth"
    torch.save({"python": 1, "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}, path,
               _use_new_zipfile_serialization=not legacy)
    hint = scan_path(path).weights_only.safe_globals_hint
    assert hint is not None
    names = hint.split("add_safe_globals([", 1)[1].rstrip("])").split(", ")
    objects = []
    for full in names:
        module, _, attr = full.rpartition(".")
        objects.append(getattr(importlib.import_module(module), attr))
    assert _torch_loads_with(path, []) is False
    assert _torch_loads_with(path, objects) is True
    report = scan_path(path, options=ScanOptions(allow=frozenset(names)))
    assert report.weights_only.loadable and report.verdict == "safe", report.weights_only


def _torch_loads_with(path: Path, allowed: list[object]) -> bool:
    with warnings.catch_warnings(), torch.serialization.safe_globals(allowed):
        warnings.simplefilter("ignore")
        try:
            torch.load(path, weights_only=True)
        except Exception:   # torch's refusal is the oracle's answer
            return False
    return True
