"""ckptguard: judge model checkpoints without executing them, and list every tensor.

The public Python API. The repository keeps the engine in `core/` and the service in
`app/`; installed, they are `ckptguard.core` and `ckptguard.app` (this folder links them
in, so the repository, an editable install, the wheel and the image all see one name).

Example (`scan(target)` takes a file, a folder, a URL or an hf:// repository):
    >>> from ckptguard import scan_bytes
    >>> scan_bytes(b"cos\\nsystem\\n(S'echo pwned'\\ntR.").verdict   # never run
    'unsafe'

Names resolve on first use (PEP 562), so `import ckptguard` stays cheap: numpy, httpx
and the engine load only when a function that needs them is called.
"""

from __future__ import annotations

import importlib

from ckptguard.core import __version__

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

    from ckptguard.app.api import scan
    from ckptguard.core.errors import CkptError, Code, Severity, SourceError
    from ckptguard.core.limits import Limits
    from ckptguard.core.loader import open_checkpoint
    from ckptguard.core.report import Finding, GlobalEntry, Report, StorageEntry, TensorEntry, Verdict
    from ckptguard.core.scan import scan_bytes, scan_path, scan_source
    from ckptguard.core.state import ScanOptions

_EXPORTS: dict[str, str] = {
    "scan": "ckptguard.app.api",
    "scan_path": "ckptguard.core.scan",
    "scan_source": "ckptguard.core.scan",
    "scan_bytes": "ckptguard.core.scan",
    "open_checkpoint": "ckptguard.core.loader",
    "ScanOptions": "ckptguard.core.state",
    "Limits": "ckptguard.core.limits",
    "Report": "ckptguard.core.report",
    "Finding": "ckptguard.core.report",
    "GlobalEntry": "ckptguard.core.report",
    "TensorEntry": "ckptguard.core.report",
    "StorageEntry": "ckptguard.core.report",
    "Verdict": "ckptguard.core.report",
    "Code": "ckptguard.core.errors",
    "Severity": "ckptguard.core.errors",
    "CkptError": "ckptguard.core.errors",
    "SourceError": "ckptguard.core.errors",
}

__all__ = [
    "CkptError", "Code", "Finding", "GlobalEntry", "Limits", "Report", "ScanOptions", "Severity",
    "SourceError", "StorageEntry", "TensorEntry", "Verdict", "__version__", "open_checkpoint",
    "scan", "scan_bytes", "scan_path", "scan_source",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if name == "Verdict":   # a string in core (core/typenames.py); the public name is the type
        from typing import Literal

        value = eval(value, {"Literal": Literal})  # noqa: S307 - our own constant text
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
