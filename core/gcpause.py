"""The cyclic garbage collector paused for a block, and restored as it was.

Why: a scan builds hundreds of thousands of small containers that live until it ends, and
none of them form a cycle the scan needs collected while it runs. Each allocation burst
sets off generational collections that traverse that growing heap again and again (half
a VM run's time, a third of a manifest walk's, measured where each block is used). Pausing
the collector is safe there because scans are bounded by Limits and the worker's
RLIMIT_AS, and anything cyclic left behind is collected once the collector is back on.

A class, not `contextlib.contextmanager`: the fast paths enter it once per pickle and a
clean file's scan imports only what it runs (tests/core/scan/test_cold_start.py).
"""

from __future__ import annotations

import gc
from types import TracebackType


class collector_paused:
    """`with collector_paused():` runs the block with the cyclic GC off; on exit it is on
    again if it was on before (nested blocks leave it to the outermost)."""

    __slots__ = ("_was_enabled",)

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._was_enabled:
            gc.enable()
