"""The exception torch.load would raise, in torch's words (FORMATS.md §3.6).

Every reader of torch's (the weights-only emulator, the container checks of a zip or legacy
file) answers with a `TorchError`; it lives apart from the emulator so that a clean file's
fast lane, which raises none, does not load the emulator to name the type.
"""

from __future__ import annotations

import functools
import re

from ckptguard.core.records import record

UNSAFE_MESSAGE = (
    "In PyTorch 2.6, we changed the default value of the `weights_only` argument in `torch.load` "
    "from `False` to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely "
    "succeed, but it can result in arbitrary code execution. Do it only if you got the file from a "
    "trusted source.")
DOCS_MESSAGE = ("\n\nCheck the documentation of torch.load to learn more about types accepted by "
                "default with weights_only https://pytorch.org/docs/stable/generated/torch.load.html.")


def wo_message(message: str) -> str:
    """torch.load's `_get_wo_message` (FORMATS.md §3.6)."""
    if re.search(r"GLOBAL (\S+) was not an allowed global by default.", message):
        return ("Weights only load failed. This file can still be loaded, to do so you have two "
                "options, \033[1mdo those steps only if you trust the source of the checkpoint\033[0m. "
                f"\n\t(1) {UNSAFE_MESSAGE}\n\t(2) Alternatively, to load with `weights_only=True` "
                "please check the recommended steps in the following error message.\n\t"
                "WeightsUnpickler error: " + message + DOCS_MESSAGE)
    if re.search(r"(\S+) must be (\S+) to load", message):
        return f"Weights only load failed. {message}\n {UNSAFE_MESSAGE}\n"
    text = f"Weights only load failed. {UNSAFE_MESSAGE}\n"
    if not re.search(r"whose module (\S+) is blocked", message):
        text += ("Please file an issue with the following so that we can make `weights_only=True` "
                 "compatible with your use case: WeightsUnpickler error: ")
    return text + "\n\n" + message + DOCS_MESSAGE


@record(frozen=True, slots=True)
class TorchError:
    """The exception torch.load would raise: class name, inner message, opcode offset."""

    type: str
    message: str
    offset: int | None = None

    def wrapped(self) -> str:
        """`str(exc)` as torch.load shows it (only UnpicklingError gets the wrapper)."""
        return wo_message(self.message) if self.type == "UnpicklingError" else self.message


def cpp_error(raw: bytes) -> TorchError:
    """A RuntimeError raised in torch's C++ with raw bytes (a record's text, an entry's name)
    in its message: Python gets it as a C string (cut at the first NUL), decoded as UTF-8
    by `PyErr_SetString`. A message that does not decode is the interpreter's to answer:
    CPython 3.11.7 and later raise that UnicodeDecodeError, 3.11.2 (Debian 12's) an empty
    RuntimeError (measured on both); the answer is the one this interpreter gives, the one a
    torch.load beside the scanner would give."""
    raw = raw.split(b"\x00", 1)[0]
    try:
        return TorchError("RuntimeError", raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        if _undecodable_message_raises_decode_error():
            return TorchError("UnicodeDecodeError", str(exc))
        return TorchError("RuntimeError", "")


@functools.cache
def _undecodable_message_raises_decode_error() -> bool:
    """What this interpreter's `PyErr_SetString` does with bytes that are not UTF-8 (asked
    once; pythonapi raises whatever the call left set). No input reaches it."""
    import ctypes  # only for a file whose C++ message does not decode

    set_string = ctypes.pythonapi.PyErr_SetString
    set_string.argtypes = [ctypes.py_object, ctypes.c_char_p]
    set_string.restype = None
    try:
        set_string(RuntimeError, b"\xff")
    except UnicodeDecodeError:
        return True
    except RuntimeError:
        return False
    return True
