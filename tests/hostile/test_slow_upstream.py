"""A remote server that answers 206 and then trickles its body: the transfer is cut by the
minimum-rate deadline (Limits.min_transfer_rate after Limits.transfer_grace_seconds), not
held until the worker's wall-clock limit. The per-read timeout alone never fires there."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ckptguard.core import records
from ckptguard.core.errors import Code, SourceError
from ckptguard.core.io.http import HttpSource
from ckptguard.core.limits import Limits
from tests.trickle import trickling_server as trickling

SIZE = 1 << 20


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """206 with honest headers, then one body byte every 0.2 s."""
    with trickling(SIZE, 0.2) as url:
        yield url


def test_a_trickling_body_is_cut_by_the_minimum_rate(trickling_server: str) -> None:
    limits = records.replace(Limits(), transfer_grace_seconds=1.0, min_transfer_rate=1024)
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        HttpSource(trickling_server, limits=limits, retries=0, timeout=30.0, speculate=False)
    elapsed = time.monotonic() - started
    assert caught.value.code is Code.SOURCE_HTTP and "minimum rate" in caught.value.message
    assert elapsed < 10, elapsed      # far below the 30 s per-read timeout it never hit
