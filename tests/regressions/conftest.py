"""Regression fixtures: assess a hand-made pickle and give the verdict it earns."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def judge() -> Callable[..., object]:
    from ckptguard.core.pickle.vm import run_vm
    from ckptguard.core.report import decide_verdict
    from ckptguard.core.state import Analysis, ScanOptions
    from ckptguard.core.threats.assess import assess

    def run(data: bytes, *, allow: frozenset[str] = frozenset()) -> tuple[Analysis, str]:
        an = Analysis(ScanOptions(allow=allow))
        assess(run_vm(data), an, allow=allow, record="data.pkl")
        return an, decide_verdict(an.findings, False)

    return run
