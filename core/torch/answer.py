"""torch.load(weights_only=True)'s answer on a file, recorded in the report.

Every format module ends with `set_weights_only`: loadable or not, torch's exception in its
words (a finding when it refuses), the globals `get_unsafe_globals_in_checkpoint` lists and
the `add_safe_globals` hint for the benign ones.
"""

from __future__ import annotations

import re

from ckptguard.core.errors import Code
from ckptguard.core.report import WeightsOnly
from ckptguard.core.state import Analysis
from ckptguard.core.torch.allowlist import safe_globals_hint
from ckptguard.core.torch.torch_error import TorchError
from ckptguard.core.values import Call, Global


def first_line(text: str) -> str:
    """The first line of a message ("" stays "": torch raises a bare EOFError)."""
    return text.split("\n", 1)[0]


def set_weights_only(an: Analysis, error: TorchError | None, pickle_data: bytes | None, *,
                     unsafe: list[str] | None = None, calls: list[Call] | None = None) -> None:
    """Record torch's weights-only outcome in the report (+ a finding when it refuses).

    `unsafe_globals` is `get_unsafe_globals_in_checkpoint`'s walk over `pickle_data` (the
    main pickle; None when there is none, or when the fast path already proved every
    global allowlisted), unless the caller passes the list itself (`unsafe`). `calls` are
    the pickles' calls (the VM's): the hint's numpy DType classes come from them.
    """
    if unsafe is None:
        listed: list[str] | TorchError = []
        if pickle_data:
            # the emulator's module only for a pickle whose globals no fast path proved
            # allowlisted: a clean file's fast lane never loads it (tests/core/scan/test_cold_start.py)
            from ckptguard.core.torch.weights_only import unsafe_globals

            listed = unsafe_globals(pickle_data, an.options.allow)
        unsafe = listed if isinstance(listed, list) else []
    benign = sorted(g.full for g in an.globals.values() if g.status == "benign")
    if calls and "numpy.dtype" in benign:
        benign = sorted(set(benign) | (numpy_dtype_classes(calls) - an.options.allow))
    an.weights_only = WeightsOnly(
        loadable=error is None,
        error=first_line(error.message) if error else None,
        error_type=error.type if error else None,
        unsafe_globals=unsafe,
        safe_globals_hint=safe_globals_hint(benign) if benign else None,
    )
    if error is not None:
        message = first_line(error.message) or error.type
        if _PRINTF_MARKER.search(message):   # torch's own text, quoted as torch prints it
            message += " (torch's words: it prints its format string unformatted)"
        an.add(Code.TORCH_WEIGHTS_ONLY_FAILED, f"{error.type}: {message}", offset=error.offset)


_PRINTF_MARKER = re.compile(r"%l?[dsu]")


def numpy_dtype_classes(calls: list[Call]) -> set[str]:
    """The numpy DType classes (`numpy.dtypes.UInt32DType`...) the `numpy.dtype(spec, ...)`
    calls make: torch BUILDs on them, so the hint must allowlist them too."""
    # numpy's models only for a pickle that calls numpy.dtype (never a clean torch.save)
    from ckptguard.core.torch.user_models import numpy_dtype_class

    out = set()
    for call in calls:
        if isinstance(call.func, Global) and call.func.full == "numpy.dtype" \
                and isinstance(call.args, tuple) and call.args:
            cls = numpy_dtype_class(call.args[0])
            if cls is not None:
                out.add(cls)
    return out
