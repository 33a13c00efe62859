"""What torch.load(path, weights_only=True) answers, as the report's weights_only states it.

The one normalisation: for an `UnpicklingError` the report keeps the restricted unpickler's
own line, which torch wraps in its "Weights only load failed..." text.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path


def torch_first_line(exc: BaseException) -> str:
    """torch's first line; the restricted unpickler's own for a wrapped UnpicklingError."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and text.startswith("Weights only load failed."):
        marker = "WeightsUnpickler error: "
        # torch's _get_wo_message: the unpickler's line follows its marker, or follows the
        # preamble on the same line ("X must be imported to load ...", DTensor's), or
        # follows a blank line
        if marker in text:
            text = text.split(marker, 1)[1]
        elif "\n\n" in text:
            text = text.split("\n\n", 1)[1]
        else:
            text = text.removeprefix("Weights only load failed. ")
        text = text.lstrip("\n")
    # a line ends at "\n" only, as in the report: str.splitlines would also cut at \x0b, \x0c,
    # \x1c-\x1e, \x85 and \u2028, which a GLOBAL name in a torch message may hold
    return text.split("\n", 1)[0]


def torch_answer(path: Path | str) -> tuple[bool, str | None, str | None]:
    """(loadable, exception type, first line) of torch.load(path, weights_only=True)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.load(path, weights_only=True)
        except Exception as exc:   # torch's refusal is the oracle's answer
            return False, type(exc).__name__, torch_first_line(exc)
    return True, None, None
