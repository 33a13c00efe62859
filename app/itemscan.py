"""Scan one command-line item (a local file or a URL), skipping non-checkpoints found by a walk.

Runs inside a CLI scan worker (app/worker.py) and in-process for the Python API's `scan()`.
A file found by walking a folder or listing a repository is sniffed first from its head and
tail (core.sniff, the same test the hub webhook applies); what cannot hold pickles or tensors
is `Skipped`, never judged, and so is text that only starts like a protocol-0 pickle.
The file is opened once: the sniff's reads are the scan's first.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckptguard.core.io.source import ByteSource
from ckptguard.core.records import record
from ckptguard.core.report import Report, SourceInfo
from ckptguard.core.sniff import HEAD_BYTES, Sniffed, sniff
from ckptguard.core.state import ScanOptions

# What the hub webhook scans (app/hub/client.py), restated here so a local folder scan
# does not import httpx; tests/cli/test_pre_commit_hook.py checks the two agree.
SCANNED = frozenset({"zip", "torch-legacy", "torch-tar", "pickle", "numpy", "safetensors"})
MIN_SCAN_BYTES = 8
_TAIL_BYTES = 65535 + 22   # the longest zip comment plus the end record


@record(frozen=True, slots=True)
class Skipped:
    """A listed file that is no checkpoint: its sniffed container kind."""

    container: str


def sniff_source(source: ByteSource) -> Sniffed:
    size = source.size
    if size < MIN_SCAN_BYTES:
        return Sniffed("empty" if size == 0 else "unknown")
    head = source.read_at(0, min(size, HEAD_BYTES))
    tail_len = min(size, _TAIL_BYTES)
    return sniff(head, source.read_at(size - tail_len, tail_len), size)


def _scan_listed(source: ByteSource, info: SourceInfo, options: ScanOptions, *,
                 sniff_first: bool) -> Report | Skipped:
    from ckptguard.core.scan import scan_source

    sniffed = sniff_source(source) if sniff_first else None
    if sniffed is not None and sniffed.container not in SCANNED:
        return Skipped(sniffed.container)
    info.size = source.size
    report = scan_source(source, options=options, info=info)
    if (sniffed is not None and sniffed.container == "pickle" and sniffed.detail.startswith("no PROTO")
            and report.verdict == "invalid"):
        # Text whose first byte is also a protocol-0 opcode (`p`rint, `c`lass, `(`): the scan
        # found no pickle there. A real protocol-0 pickle with a global is judged unsafe, and
        # a file named directly is always judged. The hub webhook applies the same rule.
        return Skipped("text")
    return report


def scan_local(path: str, info: SourceInfo, options: ScanOptions, *, sniff_first: bool) -> Report | Skipped:
    from ckptguard.core.io.source import FileSource

    with FileSource(path, name=info.name) as source:
        return _scan_listed(source, info, options, sniff_first=sniff_first)


def scan_remote(url: str, headers: Mapping[str, str] | None, info: SourceInfo, options: ScanOptions, *,
                sniff_first: bool) -> Report | Skipped:
    """Over HTTP Range requests; no URL guard: the command line reads what its user names."""
    from ckptguard.core.io.http import HttpSource

    with HttpSource(url, headers=headers, limits=options.limits, name=info.name) as source:
        return _scan_listed(source, info, options, sniff_first=sniff_first)
