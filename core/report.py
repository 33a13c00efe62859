"""The report: ckptguard's public JSON contract (schema_version 1).

Field names are the public contract (README, "The report"); fields may be added, never renamed.
`Report.to_json()` is what the service returns and `ckptguard scan --json` prints.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ckptguard.core import records
from ckptguard.core.errors import Code, Effect, Severity
from ckptguard.core.records import field, record
from ckptguard.core.typenames import NamedTuple

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, Literal, TypeAlias

SCHEMA_VERSION = 1
SCANNER_NAME = "ckptguard"
POLICY = "torch-2.13-weights-only"

Verdict: TypeAlias = 'Literal["safe", "suspicious", "unsafe", "invalid"]'
FormatName: TypeAlias = ('Literal["torch-zip", "torch-legacy", "torch-tar", "torchscript", "torch-export", '
                         '"pickle", "numpy", "numpy-zip", "safetensors", "unknown"]')
GlobalStatus: TypeAlias = 'Literal["allowed", "unknown", "dangerous", "benign"]'


@record(frozen=True, slots=True)
class Finding:
    code: Code
    message: str
    severity: Severity | None = None     # None: the code's default
    record: str | None = None            # archive record (e.g. "archive/data.pkl")
    offset: int | None = None            # absolute byte offset in the file
    length: int | None = None            # bytes the finding covers from `offset` (core.filemap)

    def to_json(self) -> dict[str, Any]:
        return {"code": str(self.code), "severity": str(self.severity or self.code.severity),
                "message": self.message, "record": self.record, "offset": self.offset,
                "length": self.length}


@record(slots=True)
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
    of a record's cost (core/records.py)."""

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
    # conjugate / negation of the stored bytes (torch's lazy conj and neg bits); "to:<dtype>":
    # a device-copy rebuild converts the stored values to that dtype; "to:meta": torch returns
    # a meta tensor (no values) of the stored shape

    def to_json(self) -> dict[str, Any]:
        # a dict display, not `_asdict()` + updates: half the cost, and a 100k-tensor report
        # makes 100k of these (tests/core/test_report.py checks the keys are the fields)
        (name, path, dtype, shape, stride, storage_offset, storage, kind, requires_grad,
         data_offset, nbytes, record, flags) = self
        return {"name": name, "path": list(path), "dtype": dtype, "shape": list(shape),
                "stride": list(stride), "storage_offset": storage_offset, "storage": storage,
                "kind": kind, "requires_grad": requires_grad, "data_offset": data_offset,
                "nbytes": nbytes, "record": record, "flags": list(flags)}


# A tensor name or path longer than Limits.max_name_chars keeps a prefix and ends with this
# marker and the SHA-256 of the whole name (64 hex digits): a report's size then follows the
# pickle, not the depth at which it repeats one memoized key (issue 14).
NAME_MARK = "...#sha256:"


def _digest(name: str) -> str:
    import hashlib  # rare (a name past the cap): hashlib's OpenSSL start-up is a cold-start cost

    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def json_len(text: str) -> int:
    """Characters `text` takes in the report's JSON (ASCII-escaped), without the quotes."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return len(text)
    return len(json.dumps(text)) - 2


def bounded_name(name: str, max_chars: int) -> str:
    """`name`, or its first characters + NAME_MARK + its digest, at most `max_chars` JSON
    characters in all."""
    if len(name) <= max_chars and json_len(name) <= max_chars:
        return name
    budget = max(0, max_chars - len(NAME_MARK) - 64)
    prefix = name[:budget]
    while (cost := json_len(prefix)) > budget:   # escapes: shrink until it fits
        prefix = prefix[:len(prefix) * budget // cost - 1] if cost else ""
    return prefix + NAME_MARK + _digest(name)


def name_chars(path: Sequence[str | int]) -> int:
    """Characters of the whole name `join_name` joins (and hashes, past `max_chars`)."""
    if len(path) == 1 and type(path[0]) is str:
        return len(path[0])
    return len(path) - 1 + sum(len(s) if type(s) is str else len(str(s)) for s in path)


def join_name(path: Sequence[str | int], max_chars: int) -> str:
    """A tensor's name: its path's segments joined by dots, bounded (`bounded_name`)."""
    return bounded_name(".".join(map(str, path)), max_chars)


def _is_bounded(name: str) -> bool:
    return len(name) >= 64 + len(NAME_MARK) and name[-64 - len(NAME_MARK):-64] == NAME_MARK


def bounded_path(path: Sequence[str | int], name: str, max_chars: int) -> list[str | int]:
    """The leading segments that fit in `max_chars` JSON characters (a segment that does not
    fit is dropped), then one segment NAME_MARK + the digest of the whole name (`name`'s)."""
    budget = max_chars - len(NAME_MARK) - 64
    out: list[str | int] = []
    used = 0
    for seg in path:
        cost = json_len(seg) + 3 if type(seg) is str else len(str(seg)) + 1
        if used + cost > budget:
            break
        out.append(seg)
        used += cost
    out.append(NAME_MARK + name[-64:])
    return out


def bound_names(tensors: list[TensorEntry], max_chars: int) -> int:
    """Shorten, in place, every name past `max_chars` JSON characters, and its path; how many
    were. (A path takes at most ~2x its name's characters: quotes and commas per segment.)"""
    shortened = 0
    quick = max_chars // 12   # no name this short can escape past max_chars
    for i, t in enumerate(tensors):
        name = t.name
        if len(name) <= quick:
            continue
        if not (_is_bounded(name) and json_len(name) <= max_chars):   # not shortened yet
            name = bounded_name(name, max_chars)
            if name is t.name:
                continue
        tensors[i] = t._replace(name=name, path=bounded_path(t.path, name, max_chars))
        shortened += 1
    return shortened


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
        key, dtype, numel, nbytes, location, record, data_offset, offset_verified = self
        return {"key": key, "dtype": dtype, "numel": numel, "nbytes": nbytes, "location": location,
                "record": record, "data_offset": data_offset, "offset_verified": offset_verified}


@record(slots=True)
class WeightsOnly:
    """What torch.load(weights_only=True) of torch 2.13 would do with the file.

    `loadable`/`error`/`error_type` are torch.load's literal answer on this very file, for
    every format (a plain pickle fails with "Invalid magic number; corrupt file?"). The
    policy question, would the restricted unpickler accept every pickle inside (true when
    there are none), is `policy_accepts`; for torch's own formats the two are one answer.
    """

    loadable: bool
    error: str | None = None             # first line of torch's message, in torch's words
    error_type: str | None = None        # exception class torch raises (UnpicklingError, ...)
    unsafe_globals: list[str] = field(default_factory=list)
    safe_globals_hint: str | None = None  # ready-to-paste torch.serialization.safe_globals([...])
    policy_accepts: bool | None = None   # None until the scan ends: then `loadable` unless set

    def to_json(self) -> dict[str, Any]:
        return records.asdict(self)


@record(slots=True)
class SourceInfo:
    kind: Literal["upload", "url", "file", "hub", "bytes"]
    name: str | None = None
    url: str | None = None
    size: int | None = None
    sha256: str | None = None


@record(slots=True)
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
    # the map of the file (core.filemap.Region rows) and how many regions were not listed
    regions: list[Any] = field(default_factory=list)
    regions_omitted: int = 0

    def to_json(self, *, rows: bool = True) -> dict[str, Any]:
        """The report (schema v1). rows=False leaves out the per-row lists (ROW_KEYS) for a
        caller that only summarises the report (the command line's text output): the rows of
        a 10,000-tensor report cost a fifth of its scan."""
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "scanner": {"name": SCANNER_NAME, "version": self.scanner_version, "policy": POLICY},
            "source": records.asdict(self.source),
            "format": self.format,
            "verdict": self.verdict,
            "weights_only": self.weights_only.to_json(),
            "globals": [g.to_json() for g in self.globals],
            "findings": [f.to_json() for f in self.findings],
            "tensors": [t.to_json() for t in self.tensors] if rows else None,
            "storages": [s.to_json() for s in self.storages] if rows else None,
            "io": dict(self.io),
            "timings_ms": dict(self.timings_ms),
            "regions": [r.to_json() for r in self.regions] if rows else None,
            "regions_omitted": self.regions_omitted,
        }
        if not rows:
            for key in ROW_KEYS:
                del out[key]
        if self.extra:
            out["extra"] = self.extra
        return out


# the report's per-row lists: what Report.to_json(rows=False) leaves out
ROW_KEYS = ("tensors", "storages", "regions")

_EFFECT_RANK = {Effect.NONE: 0, Effect.SUSPICIOUS: 1, Effect.INVALID: 2, Effect.UNSAFE: 3}
_VERDICT_OF: dict[Effect, Verdict] = {Effect.NONE: "safe", Effect.SUSPICIOUS: "suspicious",
                                      Effect.INVALID: "invalid", Effect.UNSAFE: "unsafe"}


def decide_verdict(findings: list[Finding], weights_only_loadable: bool) -> Verdict:
    """Worst effect wins: unsafe > invalid > suspicious > safe.

    `safe` needs both: the allowlist accepted everything (`weights_only.policy_accepts`) and
    no finding has an effect. A knowledge-base gap can therefore never make a file safe.
    """
    worst = Effect.NONE
    for f in findings:
        if _EFFECT_RANK[f.code.effect] > _EFFECT_RANK[worst]:
            worst = f.code.effect
    if worst is Effect.NONE and not weights_only_loadable:
        worst = Effect.SUSPICIOUS
    return _VERDICT_OF[worst]
