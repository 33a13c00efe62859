"""A torch checkpoint cut short (an interrupted download or copy), judged as torch judges it.

torch.load opens anything that starts with `PK\\x03\\x04` as a zip; without the end record
miniz refuses it ("not a ZIP archive" under 22 bytes, else "failed finding central
directory"). The scan must say not loadable, in torch's words, and never `safe`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.differential.torch_answer import torch_answer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


@pytest.mark.parametrize("legacy", [False, True])
def test_truncated_checkpoints_match_torch(tmp_path: Path, legacy: bool) -> None:
    full = tmp_path / "full.pt"
    torch.save({"w": torch.arange(300.0), "b": torch.ones(3, dtype=torch.int8)}, full,
               _use_new_zipfile_serialization=not legacy)
    data = full.read_bytes()
    cuts = sorted({4, 21, 22, 23, 64, len(data) // 3, len(data) // 2, len(data) - 100,
                   len(data) - 23, len(data) - 22, len(data) - 10, len(data) - 1})
    cut_file = tmp_path / "cut.pt"
    for cut in cuts:
        cut_file.write_bytes(data[:cut])
        loads, error_type, error = torch_answer(cut_file)
        report = scan_path(cut_file)
        wo = report.weights_only
        assert not loads and report.verdict != "safe", cut
        assert (wo.loadable, wo.error_type, wo.error) == (loads, error_type, error), (cut, wo)
