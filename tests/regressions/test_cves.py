"""Regressions named after published torch.load weights_only bypasses (FORMATS.md §4.2)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_path
from tests.builders.legacy_tar import legacy_tar
from tests.builders.pickle_asm import asm
from tests.core.legacy.conftest import assert_same_outcome
from tests.core.legacy.test_torch_tar import EVIL, base_members

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_cve_2025_32434_legacy_tar_runs_pickles(tmp_path: Path) -> None:
    """<= 2.5.1 ran a legacy .tar's pickles even with weights_only=True; 2.13 refuses."""
    path = tmp_path / "old.tar.pt"
    path.write_bytes(legacy_tar(base_members(pickle=EVIL)))
    report = scan_path(path)
    assert report.verdict == "unsafe" and Code.TORCH_LEGACY_TAR in {f.code for f in report.findings}
    assert_same_outcome(report, path)


def _zip_with(data_pkl: bytes) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, data_pkl if info.filename.endswith("/data.pkl")
                         else src.read(info))
    return out.getvalue()


def test_cve_2026_24747_setitem_on_non_dict(tmp_path: Path) -> None:
    """SETITEM on an allowlisted non-dict object (torch.Size here) is refused since 2.10."""
    pkl = asm(("PROTO", 2), ("GLOBAL", "torch", "Size"), "EMPTY_TUPLE", "TUPLE1", "REDUCE",
              ("BINUNICODE", "k"), ("BINUNICODE", "v"), "SETITEM", "STOP")
    path = tmp_path / "setitem.pt"
    path.write_bytes(_zip_with(pkl))
    report = scan_path(path)
    assert not report.weights_only.loadable and report.verdict != "safe"
    assert_same_outcome(report, path)
