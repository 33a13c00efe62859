"""`ckptguard get` on tensors torch.save writes and torch.load loads, whose array numpy cannot
make here (a red team: each was an internal error, exit 70): an expanded view of 2**40
elements from one stored float, an empty tensor whose other dimensions multiply past numpy's
limit. They are refused with the reason (exit 1). A one-element view with a stride of 2**62
(which never steps) is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckptguard.app.cli import main

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(1).expand(2**20, 2**20),
    lambda: torch.empty_strided((0, 2**31, 2**31), (1, 1, 1), dtype=torch.float64),
], ids=["expanded 2**40", "empty, huge dims"])
def test_a_view_numpy_cannot_hold_is_refused_with_its_reason(
        make: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "view.pt"
    torch.save({"w": make()}, path)  # type: ignore[operator]
    torch.load(path, weights_only=True)   # torch loads it
    assert main(["get", str(path), "w", "-o", str(tmp_path / "w.npy")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ckptguard: w: shape [") and "internal error" not in err


def test_a_stride_that_never_steps_is_read(tmp_path: Path) -> None:
    path = tmp_path / "stride.pt"
    torch.save({"w": torch.arange(4.0).as_strided((1,), (2**62,), 2)}, path)
    want = torch.load(path, weights_only=True)["w"]
    assert main(["get", str(path), "w", "-o", str(tmp_path / "w.npy")]) == 0
    assert np.load(tmp_path / "w.npy").tolist() == want.tolist() == [2.0]
