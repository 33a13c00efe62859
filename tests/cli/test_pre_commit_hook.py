"""The pre-commit hook: content-based selection, so every checkpoint extension and
extension-less files reach it, and what is no checkpoint is skipped, not judged."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import pytest

from tests.cli.conftest import EVIL, run

ROOT = Path(__file__).resolve().parents[2]


def _hook() -> dict[str, object]:
    yaml = pytest.importorskip("yaml")
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = [h for h in hooks if h["id"] == "ckptguard"]
    return dict(hook)


def test_the_hook_selects_by_content() -> None:
    hook = _hook()
    assert hook["types"] == ["file"] and "files" not in hook and "types_or" not in hook
    assert str(hook["entry"]).startswith("ckptguard scan ")


def test_the_hook_judges_every_checkpoint_kind_and_skips_the_rest(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    for name in ("a.bin", "b.pt", "c.pth", "d.ckpt", "model"):
        torch.save({"w": torch.ones(2)}, tmp_path / name)
    np.save(tmp_path / "f.npy", np.arange(3))
    np.savez(tmp_path / "g.npz", x=np.arange(3))
    save_file({"w": np.ones(2, dtype=np.float32)}, str(tmp_path / "h.safetensors"))
    buf = io.BytesIO()
    torch.save({"step": 1}, buf, _use_new_zipfile_serialization=False)   # a legacy pickle stream
    (tmp_path / "e.pkl").write_bytes(buf.getvalue())
    (tmp_path / "README.md").write_text("# model card\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    files = sorted(str(p) for p in tmp_path.iterdir())
    entry = shlex.split(str(_hook()["entry"]))
    out = run(*entry[1:], *files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "9 scanned (9 safe); 2 skipped (not checkpoints)" in out.stdout
    (tmp_path / "evil.ckpt").write_bytes(EVIL)
    assert run(*entry[1:], *files, str(tmp_path / "evil.ckpt")).returncode == 2


def test_the_scanned_kinds_agree_with_the_hub_webhook() -> None:
    from ckptguard.app.hub.client import MIN_SCAN_BYTES, SCANNED
    from ckptguard.app.itemscan import MIN_SCAN_BYTES as CLI_MIN
    from ckptguard.app.itemscan import SCANNED as CLI_SCANNED

    assert (CLI_SCANNED, CLI_MIN) == (SCANNED, MIN_SCAN_BYTES)
