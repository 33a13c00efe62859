"""The report: ckptguard's public JSON contract (schema_version 1).

Field names are fixed by shared/docs/DESIGN.md; fields may be added, never renamed.
`Report.to_json()` is what the service returns and `ckptguard scan --json` prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from ckptguard.core.errors import Code, Effect, Severity

SCHEMA_VERSION = 1
SCANNER_NAME = "ckptguard"
POLICY = "torch-2.13-weights-only"

Verdict = Literal["safe", "suspicious", "unsafe", "invalid"]
FormatName = Literal["torch-zip", "torch-legacy", "torch-tar", "torchscript", "torch-export",
                     "pickle", "numpy", "numpy-zip", "safetensors", "unknown"]
GlobalStatus = Literal["allowed", "unknown", "dangerous", "benign"]


@dataclass(frozen=True, slots=True)
class Finding:
    code: Code
    message: str
    severity: Severity | None = None     # None: the code's default
    record: str | None = None            # archive record (e.g. "archive/data.pkl")
    offset: int | None = None            # absolute byte offset in the file

    def to_json(self) -> dict[str, Any]:
        return {"code": str(self.code), "severity": str(self.severity or self.code.severity),
                "message": self.message, "record": self.record, "offset": self.offset}


@dataclass(slots=True)
class GlobalEntry:
    module: str
    name: str
    status: GlobalStatus
    count: int = 1
    record: str | None = None
    offset: int | None = None            # first occurrence
    reason: str | None = None            # why dangerous/benign (knowledge base note)

    @property
    def full(self) -> str:
        return f"{self.module}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "name": self.name, "status": self.status,
                "count": self.count, "record": self.record, "offset": self.offset,
                "reason": self.reason}


class TensorEntry(NamedTuple):
    """One tensor of the manifest. A NamedTuple: a 100k-tensor report builds 100k of them,
    and core.lane.torch_zip builds them in C (`tuple.__new__` over zipped columns) at a fraction
    of a dataclass's cost."""

    name: str
    path: list[str | int]
    dtype: str
    shape: list[int]
    stride: list[int]
    storage_offset: int
    storage: str | None                  # storage key, None for meta/no-storage tensors
    kind: str                            # tensor | parameter | quantized | sparse | meta | ...
    requires_grad: bool
    data_offset: int | None              # absolute byte of the first element
    nbytes: int                          # bytes the view spans
    record: str | None = None
    flags: Sequence[str] = ()            # "conj" / "neg": the logical value is the
    # conjugate / negation of the stored bytes (torch's lazy conj and neg bits)

    def to_json(self) -> dict[str, Any]:
        out = self._asdict()
        out["path"], out["shape"], out["stride"] = list(self.path), list(self.shape), list(self.stride)
        out["flags"] = list(self.flags)
        return out


class StorageEntry(NamedTuple):
    key: str
    dtype: str
    numel: int
    nbytes: int
    location: str
    record: str | None
    data_offset: int | None
    offset_verified: bool

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


@dataclass(slots=True)
class WeightsOnly:
    """What torch.load(weights_only=True) of torch 2.13 would do with the file."""

    loadable: bool
    error: str | None = None             # first line of torch's message, in torch's words
    error_type: str | None = None        # exception class torch raises (UnpicklingError, ...)
    unsafe_globals: list[str] = field(default_factory=list)
    safe_globals_hint: str | None = None  # ready-to-paste torch.serialization.safe_globals([...])

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class SourceInfo:
    kind: Literal["upload", "url", "file", "hub", "bytes"]
    name: str | None = None
    url: str | None = None
    size: int | None = None
    sha256: str | None = None


@dataclass(slots=True)
class Report:
    source: SourceInfo
    format: FormatName = "unknown"
    verdict: Verdict = "invalid"
    weights_only: WeightsOnly = field(default_factory=lambda: WeightsOnly(loadable=False))
    globals: list[GlobalEntry] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    tensors: list[TensorEntry] = field(default_factory=list)
    storages: list[StorageEntry] = field(default_factory=list)
    io: dict[str, int] = field(default_factory=lambda: {"bytes_read": 0, "requests": 0})
    timings_ms: dict[str, float] = field(default_factory=dict)
    scanner_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # format-specific (e.g. pt2 program)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "scanner": {"name": SCANNER_NAME, "version": self.scanner_version, "policy": POLICY},
            "source": dataclasses.asdict(self.source),
            "format": self.format,
            "verdict": self.verdict,
            "weights_only": self.weights_only.to_json(),
            "globals": [g.to_json() for g in self.globals],
            "findings": [f.to_json() for f in self.findings],
            "tensors": [t.to_json() for t in self.tensors],
            "storages": [s.to_json() for s in self.storages],
            "io": dict(self.io),
            "timings_ms": dict(self.timings_ms),
        }
        if self.extra:
            out["extra"] = self.extra
        return out


_EFFECT_RANK = {Effect.NONE: 0, Effect.SUSPICIOUS: 1, Effect.INVALID: 2, Effect.UNSAFE: 3}
_VERDICT_OF: dict[Effect, Verdict] = {Effect.NONE: "safe", Effect.SUSPICIOUS: "suspicious",
                                      Effect.INVALID: "invalid", Effect.UNSAFE: "unsafe"}


def decide_verdict(findings: list[Finding], weights_only_loadable: bool) -> Verdict:
    """Worst effect wins: unsafe > invalid > suspicious > safe.

    `safe` needs both: the allowlist accepted everything (weights-only loadable) and
    no finding has an effect. A knowledge-base gap can therefore never make a file safe.
    """
    worst = Effect.NONE
    for f in findings:
        if _EFFECT_RANK[f.code.effect] > _EFFECT_RANK[worst]:
            worst = f.code.effect
    if worst is Effect.NONE and not weights_only_loadable:
        worst = Effect.SUSPICIOUS
    return _VERDICT_OF[worst]
