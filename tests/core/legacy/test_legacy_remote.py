"""A legacy checkpoint over HTTP Range requests: judged from its pickles and block counts."""

from __future__ import annotations

import pytest

from ckptguard.core.io.http import HttpSource
from ckptguard.core.io.urlguard import UrlGuard
from ckptguard.core.scan import scan_source
from tests.core.legacy.conftest import legacy_bytes
from tests.rangeserver import RangeServer

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_legacy_over_http_reads_little() -> None:
    import torch

    data = legacy_bytes({f"w{i}": torch.full((1 << 16,), float(i)) for i in range(64)})  # 16 MiB
    with RangeServer({"/old.pt": data}) as srv:
        src = HttpSource(srv.url("/old.pt"), guard=UrlGuard(allowlist=("127.0.0.1",)))
        try:
            report = scan_source(src)
        finally:
            src.close()
    assert report.format == "torch-legacy" and report.verdict == "safe"
    assert len(report.tensors) == 64
    assert report.io["bytes_read"] < 1_000_000 < len(data) // 16
    for entry in report.tensors:
        i = int(entry.name[1:])
        assert data[entry.data_offset:entry.data_offset + 4] == torch.tensor([float(i)]).numpy().tobytes()
