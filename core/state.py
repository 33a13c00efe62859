"""The mutable accumulator a scan fills while it walks the layers of a file.

Format modules (core/formats/*) receive an `Analysis`, add findings, globals,
tensors and storages to it, and set `weights_only`. `core.scan` then turns it into
a `Report` and decides the verdict. Keeping the accumulator separate from the
frozen report lets every layer report what it saw even when a later layer fails.
"""

from __future__ import annotations

from ckptguard.core.errors import CkptError, Code, Severity
from ckptguard.core.filemap import Region as MapRegion
from ckptguard.core.filemap import ZipSpans
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.records import field, record
from ckptguard.core.report import (
    Finding,
    FormatName,
    GlobalEntry,
    GlobalStatus,
    StorageEntry,
    TensorEntry,
    WeightsOnly,
)

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, Literal, TypeAlias

    from ckptguard.core.regions.region import Region

# Which engines may decide. Every engine gives the same report (tests/agreement proves it on
# every generated corpus); they differ only in speed:
#   auto     the column-wise lane for plain torch.save zips, else the general path
#   general  no lane: each pickle tries the C-speed fast path, then the exact interpreters
#   exact    only the exact interpreters (the reference the other two must equal)
Engine: TypeAlias = 'Literal["auto", "general", "exact"]'


@record(frozen=True, slots=True)
class ScanOptions:
    """What the caller may choose: extra allowlisted globals (like add_safe_globals) and caps."""

    allow: frozenset[str] = frozenset()
    limits: Limits = DEFAULT_LIMITS
    verify_crc: bool = False        # read whole records to check CRC-32 (costs a full read)
    engine: Engine = "auto"


@record(slots=True)
class Analysis:
    options: ScanOptions = field(default_factory=ScanOptions)
    format: FormatName = "unknown"
    findings: list[Finding] = field(default_factory=list)
    globals: dict[tuple[str, str], GlobalEntry] = field(default_factory=dict)
    tensors: list[TensorEntry] = field(default_factory=list)
    storages: list[StorageEntry] = field(default_factory=list)
    weights_only: WeightsOnly | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    io: dict[str, int] = field(default_factory=dict)   # read-side counts beyond the source's
    # digests of the inline pickles (`pickle.loads(b'...')`) already interpreted: each once
    nested_pickles: set[bytes] = field(default_factory=set)
    # byte ranges torch skips but another reader would parse: judged by core.regions at the
    # end of the scan, under one budget
    regions: list[Region] = field(default_factory=list)
    # findings per (code, severity) so far; past Limits.max_findings_per_code they are only
    # counted, and `capped_findings` adds one summary per code (a report's size follows the
    # kinds of anomaly, not their count; the verdict keeps the first ones of each severity)
    per_code: dict[tuple[Code, Severity | None], int] = field(default_factory=dict)
    # the map of the file (core.filemap): sections the formats record, a zip's spans
    map_regions: list[MapRegion] = field(default_factory=list)
    zip_spans: ZipSpans | None = None

    def add(self, code: Code, message: str, *, record: str | None = None,
            offset: int | None = None, severity: Severity | None = None) -> Finding:
        finding = Finding(code, message, severity, record, offset)
        key = (code, severity)
        seen = self.per_code.get(key, 0) + 1
        self.per_code[key] = seen
        if seen <= self.options.limits.max_findings_per_code:
            self.findings.append(finding)
        return finding

    def capped_findings(self) -> None:
        """One summary finding per (code, severity) whose findings passed the cap."""
        cap = self.options.limits.max_findings_per_code
        for (code, severity), seen in list(self.per_code.items()):
            if seen > cap:
                self.findings.append(Finding(
                    code, f"{seen - cap} more {code} findings not listed "
                    f"(Limits.max_findings_per_code = {cap})", severity, None, None))

    def add_error(self, exc: CkptError) -> Finding:
        return self.add(exc.code, exc.message, record=exc.record, offset=exc.offset)

    def note_global(self, module: str, name: str, status: GlobalStatus, *,
                    record: str | None = None, offset: int | None = None,
                    reason: str | None = None, count: int = 1) -> GlobalEntry:
        """Count one more use of `module.name` (first occurrence keeps its offset)."""
        key = (module, name)
        entry = self.globals.get(key)
        if entry is None:
            entry = GlobalEntry(module, name, status, count, record, offset, reason)
            self.globals[key] = entry
        else:
            entry.count += count
        return entry

    def has(self, code: Code) -> bool:
        return any(f.code == code for f in self.findings)
