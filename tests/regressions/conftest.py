"""Regression fixtures: assess a hand-made pickle and give the verdict it earns."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def judge() -> Callable[..., object]:
    from core.analysis import Analysis, ScanOptions
    from core.report import decide_verdict
    from core.threats import assess
    from core.vm import run_vm

    def run(data: bytes, *, allow: frozenset[str] = frozenset()) -> tuple[Analysis, str]:
        an = Analysis(ScanOptions(allow=allow))
        assess(run_vm(data), an, allow=allow, record="data.pkl")
        return an, decide_verdict(an.findings, False)

    return run
