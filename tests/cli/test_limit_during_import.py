"""The wall-clock stop of an in-process scan never lands inside an import: a module whose
import is interrupted stays half made for the rest of the process (numpy then fails every
later scan with "Importing the numpy C-extensions failed"), so the stop waits for it."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from ckptguard.app.runner import _ScanLimit, limit_handler
from ckptguard.core.errors import Code


def test_the_stop_waits_for_an_import_to_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(0.3)\nREADY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    old = signal.signal(signal.SIGALRM, limit_handler(Code.TIMEOUT, "stop"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)   # fires while the module sleeps
        with pytest.raises(_ScanLimit) as stopped:
            import slow_to_import  # noqa: F401
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:   # the deferred stop comes right after
                time.sleep(0.001)
        assert stopped.value.code is Code.TIMEOUT
        assert sys.modules["slow_to_import"].READY   # imported whole, not half
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.modules.pop("slow_to_import", None)


def test_outside_an_import_the_stop_is_immediate() -> None:
    old = signal.signal(signal.SIGALRM, limit_handler(Code.TIMEOUT, "stop"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        started = time.monotonic()
        with pytest.raises(_ScanLimit):
            while time.monotonic() - started < 5:
                time.sleep(0.001)
        assert time.monotonic() - started < 4   # raised by the first alarm, not a later one
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
