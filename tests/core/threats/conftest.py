"""Fixtures for the threat tests: an Analysis and a helper that assesses one pickle."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def assess_pickle() -> Callable[..., object]:
    from ckptguard.core.pickle.vm import run_vm
    from ckptguard.core.state import Analysis, ScanOptions
    from ckptguard.core.threats.assess import assess

    def run(data: bytes, *, allow: frozenset[str] = frozenset()) -> Analysis:
        an = Analysis(ScanOptions(allow=allow))
        assess(run_vm(data), an, allow=allow, record="r")
        return an

    return run
