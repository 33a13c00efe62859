"""torch's lazy conj/neg bits: the manifest carries them and the loader applies them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckptguard.core.loader import open_checkpoint
from ckptguard.core.scan import scan_path

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def test_conj_and_neg_views_read_as_torch_loads_them(tmp_path: Path) -> None:
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64)
    x = torch.tensor([1.5, -2.0, 3.25])
    sd = {"conj": z.conj(), "neg": x._neg_view(), "plain": z, "conj_row": z.view(1, 3).conj()}
    assert sd["conj"].is_conj() and sd["neg"].is_neg()
    path = tmp_path / "bits.pt"
    torch.save(sd, path)

    report = scan_path(path)
    flags = {t.name: list(t.flags) for t in report.tensors}
    assert flags == {"conj": ["conj"], "neg": ["neg"], "plain": [], "conj_row": ["conj"]}
    assert report.verdict == "safe"

    loaded = torch.load(path, weights_only=True)
    with open_checkpoint(str(path)) as ckpt:
        for name, tensor in loaded.items():
            np.testing.assert_array_equal(ckpt.read_tensor(name), tensor.resolve_conj().resolve_neg().numpy())
