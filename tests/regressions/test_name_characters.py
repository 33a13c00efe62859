"""A tensor's whole name is joined and hashed before it is shortened to max_name_chars: a red
team's 23.5 KB torch.save (one memoized 10,000-character key at 1,000 levels over 1,000
tensors; torch.load: 4 ms) joined and hashed 10 GB of names, 14 s. The characters of the
whole names count against Limits.max_manifest_name_chars over the manifest: past it the scan
fails closed (LIMIT_TENSORS), on every engine."""

from __future__ import annotations

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.limits import Limits
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from tests.builders.hostile_names import memoized_key_checkpoint

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("engine", ["auto", "general", "exact"])
def test_the_whole_names_characters_are_capped(engine: str) -> None:
    data, _ = memoized_key_checkpoint(100, 100, "k" * 1000)   # 100 names of ~100,000 characters
    small = ScanOptions(engine=engine, limits=Limits(max_manifest_name_chars=1_000_000))  # type: ignore[arg-type]
    report = scan_bytes(data, options=small)
    cut = [f for f in report.findings if f.code is Code.LIMIT_TENSORS]
    assert report.verdict == "invalid" and cut and "characters" in cut[0].message
    roomy = ScanOptions(engine=engine, limits=Limits(max_manifest_name_chars=20_000_000))  # type: ignore[arg-type]
    assert len(scan_bytes(data, options=roomy).tensors) == 100
