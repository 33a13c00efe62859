"""source -> sniff -> container -> pickle interpreters -> policy -> manifest -> Report.

Strategy: every layer reports into one `Analysis`; an error that stops a layer is
turned into a finding here and the report is still produced (invariant: any
bytes -> a Report). Only a `SourceError` (the bytes could not be read at all)
propagates: there is nothing to judge then.

Example:
    >>> from ckptguard.core.io.source import BytesSource
    >>> scan_source(BytesSource(b"")).verdict
    'invalid'
"""

from __future__ import annotations

import errno
import os
import time

from ckptguard.core import __version__
from ckptguard.core.errors import CkptError, Code, LimitExceeded, SourceError
from ckptguard.core.filemap import finish as finish_regions
from ckptguard.core.gcpause import collector_paused
from ckptguard.core.io.source import ByteSource, BytesSource, FileSource, ReadOnce
from ckptguard.core.report import FormatName, Report, SourceInfo, WeightsOnly, bound_names, decide_verdict
from ckptguard.core.reportsize import cap_report, report_budget
from ckptguard.core.sniff import HEAD_BYTES, Sniffed, sniff
from ckptguard.core.state import Analysis, ScanOptions

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from ckptguard.core.zip.directory import ZipDirectory


TAIL_BYTES = 65536 + 22


def scan_path(path: str | os.PathLike[str], *, options: ScanOptions | None = None,
              info: SourceInfo | None = None) -> Report:
    """Scan a local file. Raises SourceError only if it cannot be opened/read."""
    with FileSource(path) as source:
        if info is None:
            info = SourceInfo(kind="file", name=source.name, size=source.size)
        return scan_source(source, options=options, info=info)


def scan_source(source: ByteSource, *, options: ScanOptions | None = None,
                info: SourceInfo | None = None) -> Report:
    """Scan any byte source (file, bytes, HTTP ranges) into a Report."""
    started = time.perf_counter()
    an = Analysis(options or ScanOptions())
    if info is None:
        info = SourceInfo(kind="bytes", name=source.name, size=source.size)
    if info.size is None:
        info.size = source.size
    # A scan builds millions of small objects that live until it ends; generational GC
    # passes over that growing heap cost more than the scan (bench/scan_bench.py: 5.2 s ->
    # see README). Scans are bounded by Limits and the worker's RLIMIT_AS.
    with collector_paused():
        _analyze_guarded(source, an, info)
        return _report(an, source, info, started)   # its size cap passes over every row


def _analyze_guarded(source: ByteSource, an: Analysis, info: SourceInfo) -> None:
    """`_analyze` and torch.load's answer, with every error but a SourceError turned into a
    finding."""
    try:
        # remote sources keep what they fetched; a local one keeps its first small spans
        read = ReadOnce(source) if source.random_access_cheap else source
        try:
            _analyze(read, an)
        finally:
            if source.size:
                _answer_as_torch_load(read, an, info.name or source.name)
    except SourceError:
        raise
    except CkptError as exc:
        an.add_error(exc)
    except RecursionError:
        an.add(Code.LIMIT_DEPTH, "nesting exhausted the interpreter's recursion limit")
    except MemoryError:
        an.add(Code.RESOURCE_LIMIT, "out of memory while scanning")
    except Exception as exc:  # a scanner bug must not crash the caller or hide the input
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            # the memory cap met in a system call (a lazy import listing a directory under
            # RLIMIT_AS) is no MemoryError, but it is the same limit
            an.add(Code.RESOURCE_LIMIT, f"out of memory while scanning ({exc.strerror})")
            return
        import logging  # here: logging (and traceback) is ~10 ms of a clean scan's start

        logging.getLogger("ckptguard.scan").exception("internal error while scanning %s", source.name)
        an.add(Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


def _scan_nested(source: ByteSource, options: ScanOptions) -> Report:
    """A checkpoint embedded in another one (a .pt2's torch zips): the same scan, nested."""
    return scan_source(source, options=options)


def scan_bytes(data: bytes, *, options: ScanOptions | None = None, name: str = "bytes") -> Report:
    """Scan bytes already in memory.

    >>> scan_bytes(b"cos\\nsystem\\n(S'echo pwned'\\ntR.").verdict   # never run
    'unsafe'
    """
    return scan_source(BytesSource(data, name=name), options=options)


def _report(an: Analysis, source: ByteSource, info: SourceInfo, started: float) -> Report:
    max_name = an.options.limits.max_name_chars
    shortened = bound_names(an.tensors, max_name)
    if shortened:
        an.add(Code.LIMIT_NAME, f"{shortened} tensor names and paths were longer than {max_name} "
               "characters: each keeps a prefix, then '...#sha256:' and the digest of the whole name")
    an.capped_findings()
    regions, omitted, findings = finish_regions(
        an.map_regions, an.zip_spans, an.findings, file_size=source.size,
        storage_records={s.record for s in an.storages if s.record is not None},
        max_regions=an.options.limits.max_map_regions)
    an.findings = findings
    wo = an.weights_only or WeightsOnly(loadable=False, error="not a torch checkpoint",
                                        error_type=None)
    if wo.policy_accepts is None:
        wo.policy_accepts = wo.loadable
    report = Report(
        source=info, format=an.format, weights_only=wo,
        globals=sorted(an.globals.values(), key=lambda g: (g.offset or 0, g.full)),
        findings=an.findings, tensors=an.tensors, storages=an.storages,
        io={"bytes_read": source.stats.bytes_read, "requests": source.stats.requests, **an.io},
        timings_ms={"total": round((time.perf_counter() - started) * 1000, 3)},
        scanner_version=__version__, extra=an.extra, regions=regions, regions_omitted=omitted,
    )
    limits = an.options.limits
    cut = cap_report(report, report_budget(limits, an.io.get("pickle_bytes", 0), len(an.tensors),
                                           an.io.get("zip_entries", 0)),
                     max_name)
    report.verdict = decide_verdict([*an.findings, *([cut] if cut else [])], wo.policy_accepts)
    return report


# torch's own formats, by the reader torch.load dispatches to (FORMATS.md §0: the first four
# bytes): the format module's answer is torch's when the file takes that reader.
TORCH_ZIP_FORMATS = frozenset(("torch-zip", "torchscript"))
TORCH_LEGACY_FORMATS = frozenset(("torch-legacy", "torch-tar"))


def _answer_as_torch_load(source: ByteSource, an: Analysis, name: str | None) -> None:
    """Put torch.load's literal answer on this file in `weights_only`, and the format's own
    policy answer in `policy_accepts` (FORMATS.md §0: a path ending in .safetensors -> the
    safetensors library; zip magic -> the zip reader; anything else -> the legacy reader).
    A file of another format (pickle, NumPy, safetensors, .pt2, any zip) gets torch's answer
    from the reader it really takes."""
    from ckptguard.core.torch.answer import first_line
    from ckptguard.core.torch.torch_error import TorchError

    policy = an.weights_only or WeightsOnly(loadable=False)
    if (name or "").endswith(".safetensors") and an.format != "safetensors":
        # torch.load hands such a path to the safetensors library, whatever the bytes are (a
        # divergence hunt: a torch zip so named was "loadable"); the format's policy stays
        if policy.policy_accepts is None:
            policy.policy_accepts = policy.loadable
        policy.loadable, policy.error_type = False, "Unmodelled"
        policy.error = ("not modelled: torch.load hands a path ending in .safetensors to the "
                        f"safetensors library, which does not read a {an.format} file")
        an.weights_only = policy
        return
    if policy.policy_accepts is not None:
        return   # the format module gave both answers
    if an.format == "safetensors" and (name or "").endswith(".safetensors"):
        policy.policy_accepts = policy.loadable   # torch.load hands it to safetensors
        an.weights_only = policy
        return
    zip_magic = source.read_at(0, min(4, source.size)) == b"PK\x03\x04"
    if an.format in (TORCH_ZIP_FORMATS if zip_magic else TORCH_LEGACY_FORMATS):
        return   # the format module replayed torch's own reader
    try:
        # each reader's module only when this file takes it (a small pickle's scan must not
        # import the zip reader: tests/core/scan/test_cold_start.py)
        if zip_magic:
            from ckptguard.core.formats.torch_zip import zip_answer

            error = zip_answer(source, an)
        else:
            from ckptguard.core.formats.torch_legacy import legacy_answer

            error = legacy_answer(source, an)
    except SourceError:
        raise
    except CkptError as exc:   # never a guessed "loadable"
        error = TorchError("Unmodelled", f"not modelled: torch.load on this file ({exc.message})")
    an.weights_only = WeightsOnly(
        loadable=error is None, error=first_line(error.message) if error else None,
        error_type=error.type if error else None, unsafe_globals=policy.unsafe_globals,
        safe_globals_hint=policy.safe_globals_hint,
        policy_accepts=policy.loadable if an.weights_only is not None else False)


def _analyze(source: ByteSource, an: Analysis) -> None:
    size = source.size
    if size == 0:
        an.add(Code.FORMAT_EMPTY, "the input is empty")
        return
    head_n = min(size, HEAD_BYTES)
    tail_n = min(size, TAIL_BYTES)
    if tail_n == size:
        head = tail = source.read_at(0, size)
        head = head[:head_n]
    else:
        head, tail = source.read_many([(0, head_n), (size - tail_n, tail_n)])
    kind = sniff(head, tail, size)
    if kind.detail == "undecided":   # read on, as far as the tar probe's cap, to decide
        from ckptguard.core.formats.torch_tar import tarfile_accepts

        if tarfile_accepts(source, an.options.limits)[0] is False:
            kind = sniff(head, tail, size, tar=False)
    try:
        _dispatch(source, kind, an)
    except SourceError:
        raise
    except CkptError as exc:   # the layer stopped; the regions it declared are still judged
        an.add_error(exc)
    if an.regions:   # the region judge runs the VM and the threat analysis: none declared, none loaded
        from ckptguard.core.regions.judge import judge_regions

        judge_regions(source, an)


def _dispatch(source: ByteSource, kind: Sniffed, an: Analysis) -> None:
    # Imports are local: each format module pulls in its own parsers only when needed.
    if kind.container == "zip":
        _analyze_zip(source, an, kind)
    elif kind.container == "pickle":
        from ckptguard.core.formats import pickle_file

        an.format = "pickle"
        pickle_file.analyze(source, an)
    elif kind.container in ("torch-legacy", "torch-tar"):
        from ckptguard.core.formats import torch_legacy

        an.format = kind.container
        torch_legacy.analyze(source, an)
    elif kind.container == "numpy":
        from ckptguard.core.formats import npy

        an.format = "numpy"
        npy.analyze(source, an)
    elif kind.container == "safetensors":
        from ckptguard.core.formats import safetensors

        an.format = "safetensors"
        safetensors.analyze(source, an)
    else:
        an.format = "unknown"
        an.add(Code.FORMAT_UNKNOWN, "the content matches no known checkpoint format")
    if kind.container in ("safetensors", "numpy", "torch-tar"):
        _analyze_head_pickle(source, an)
    if kind.zip_at_tail and kind.container != "zip":
        _analyze_polyglot_zip(source, an)


_HEAD_WINDOW = 65536


def _analyze_head_pickle(source: ByteSource, an: Analysis) -> None:
    """torch.load(weights_only=False) and pickle.load read any non-zip file as a pickle from
    byte 0: a file that parses as another format and also as a pickle importing something
    is a polyglot. The window grows only while the pickle runs past its end, so a real
    safetensors/NumPy file (whose first bytes stop any pickle at once) costs one small read."""
    from ckptguard.core.pickle.vm import DOTTED_NAME, run_vm
    from ckptguard.core.threats.assess import assess

    limits = an.options.limits
    window = min(source.size, _HEAD_WINDOW)
    while True:
        vm = run_vm(source.read_at(0, window), limits=limits)
        truncated = vm.error is not None and vm.error.code is Code.PICKLE_TRUNCATED
        if not truncated or window >= min(source.size, limits.max_pickle_bytes):
            break
        window = min(window * 4, source.size, limits.max_pickle_bytes)
    # only a name pickle.load could import: junk bytes between two newlines never run anything
    imports = [g for g in vm.globals
               if DOTTED_NAME.fullmatch(g.raw_module) and DOTTED_NAME.fullmatch(g.raw_name)]
    if imports:
        an.add(Code.PICKLE_POLYGLOT, f"the first bytes of this {an.format} file are also a "
               f"pickle that imports {len(imports)} global(s), first "
               f"{imports[0].module}.{imports[0].name}", offset=0)
        assess(vm, an, allow=an.options.allow, record=None)
    elif vm.error is not None and vm.error.code.name.startswith("LIMIT_"):
        # the real format's first bytes stop any pickle at once; a pickle that runs into our
        # limits (10,000 nested MARKs: CPython has no such limit) may hide a global behind them
        an.add(Code.PICKLE_POLYGLOT, f"the first bytes of this {an.format} file are also a "
               f"pickle that runs past the scanner's limits ({vm.error.message})", offset=0)


def _analyze_polyglot_zip(source: ByteSource, an: Analysis) -> None:
    """A zip end record behind another format: torch reads the front, zip tools the back."""
    from ckptguard.core.formats import torch_zip
    from ckptguard.core.zip.directory import read_directory

    try:
        directory = read_directory(source, an.options.limits)
    except CkptError:
        return  # EOCD-like bytes that are not a real archive: nothing more to show
    an.add(Code.ZIP_PREPENDED_DATA, f"a {len(directory.entries)}-entry zip archive is "
           f"appended to this {an.format} file (polyglot)", offset=directory.cd_offset)
    torch_zip.check_generic_zip(source, directory, an)
    # the bytes before the archive are this file itself, judged as its format from byte 0
    an.regions = [r for r in an.regions if r.kind != "prefix"]


def _analyze_zip(source: ByteSource, an: Analysis, kind: Sniffed) -> None:
    from ckptguard.core.lane.torch_zip import try_torch_zip

    # a clean torch.save archive, proven in columns
    if an.options.engine == "auto" and try_torch_zip(source, an):
        return
    # the general path: its parser
    from ckptguard.core.zip.directory import read_directory

    try:
        directory = read_directory(source, an.options.limits)
    except CkptError as exc:
        from ckptguard.core.formats.torch_zip import zip_open_error
        from ckptguard.core.torch.answer import set_weights_only

        error = zip_open_error(exc, source.size)   # torch.load opens it as a zip too, and fails
        if error is not None and source.read_at(0, 4) == b"PK\x03\x04":
            set_weights_only(an, error, None)
        raise
    if len(directory.entries) > an.options.limits.max_zip_entries:
        raise LimitExceeded(Code.LIMIT_ENTRIES, f"{len(directory.entries)} zip entries")
    zip_kind = classify_zip(directory)
    if an.format == "unknown":
        an.format = zip_kind
    if zip_kind in ("torch-zip", "torchscript"):
        from ckptguard.core.formats import torch_zip

        torch_zip.analyze_zip(source, directory, an)
    elif zip_kind == "torch-export":
        from ckptguard.core.formats.export import archive as torch_export

        torch_export.analyze_zip(source, directory, an, scan_nested=_scan_nested)
    elif zip_kind == "numpy-zip":
        from ckptguard.core.formats import npy

        npy.analyze_zip(source, directory, an)
    else:
        from ckptguard.core.formats import torch_zip

        an.add(Code.FORMAT_UNKNOWN, "a zip archive that is not a known checkpoint layout")
        torch_zip.check_generic_zip(source, directory, an)


def classify_zip(directory: ZipDirectory) -> FormatName:
    """Decide the zip layout from its record names (FORMATS.md §0, §5, §7)."""
    names = directory.by_name
    prefix = directory.prefix()
    if f"{prefix}/constants.pkl" in names:   # torch: exact name in get_all_records()
        return "torchscript"
    if directory.find(f"{prefix}/data.pkl") is not None:   # miniz lookup, case-folded
        return "torch-zip"
    if any(n.endswith("archive_format") for n in names) or any(
            n.startswith(f"{prefix}/models/") and n.endswith(".json") for n in names):
        return "torch-export"
    if names and all(n.endswith(".npy") for n in names):
        return "numpy-zip"
    return "unknown"
