"""torch.load hands a path ending in .safetensors to the safetensors library, whatever the
bytes: a torch.save zip or legacy file so named is refused (a divergence hunt: the scan said
torch loads it). The verdict stays the allowlist's: nothing in it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from tests.core.torch_rules.oracle import run_oracle

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_torch_file_named_safetensors_is_not_loadable(tmp_path: Path, legacy: bool) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=not legacy)
    (want,) = run_oracle([{"path": str(path), "mode": "load"}], tmp_path)
    assert not want["ok"] and want["type"] == "SafetensorError", want
    for engine in ("auto", "general", "exact"):
        report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        wo = report.weights_only
        assert not wo.loadable and wo.policy_accepts and "safetensors library" in (wo.error or "")
        assert legacy or report.verdict == "safe"   # (a legacy file is suspicious anyway)
