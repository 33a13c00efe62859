"""torch.export `.pt2` archives: records, program JSON, weights manifest, unsafe parts.

Strategy: follow `torch.export.pt2_archive._package.load_pt2` record by record
(FORMATS.md §5) without running any of it:
* `archive_format` must read `pt2` (torch asserts it);
* per `models/<name>.json`: the program JSON, its weight and constant configs
  (`data/weights/<name>_weights_config.json`, `data/constants/<name>_constants_config.json`)
  and `data/sample_inputs/<name>.pt`;
* raw weight/constant records become manifest entries: absolute offset = record data
  offset (local header) + storage_offset x itemsize, bounds as `torch.as_strided` checks;
* every part torch would load without weights_only is a PT2_UNSAFE_PAYLOAD finding and
  its bytes are judged anyway: `use_pickle` payloads, legacy `<name>.pt` weights and the
  sample inputs (torch.load with a weights_only=False fallback) as nested torch zips via
  the scan driver's own `scan_source`, handed in as `scan_nested` (a callback: formats sit
  below the driver and never import it); `opaque_obj_*` (pickle.loads) through `core.judge`;
  `custom_obj_*` (TorchScript pickler) as nested archives;
* `as_expr` strings go to `sympy.sympify` (eval): anything beyond the grammar torch writes
  (srepr of Symbol/Integer shape arithmetic) is PT2_SYMPY_EXPR, and with evidence of code
  (dunders, attributes, strings, calls of other names, lambda/import) also a critical
  PT2_SYMPY_EVAL (unsafe); non-empty `guards_code` is exec'd by `ep.module()`:
  PT2_GUARDS_CODE;
* the verifier rules live in core.formats.export.verifier.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ckptguard.core.errors import CkptError, Code, FormatError, LimitExceeded, Severity, SourceError
from ckptguard.core.formats.export.expressions import code_evidence, iter_exprs, plain_problem
from ckptguard.core.formats.export.verifier import verify_program
from ckptguard.core.io.source import ByteSource, BytesSource
from ckptguard.core.records import field, record
from ckptguard.core.report import Report, StorageEntry, TensorEntry, WeightsOnly
from ckptguard.core.state import Analysis, ScanOptions
from ckptguard.core.torch.dtypes import EXPORT_SCALAR_TYPE, ITEMSIZE
from ckptguard.core.zip.checks import check_archive
from ckptguard.core.zip.directory import LocalHeader, ZipDirectory, ZipEntry, read_local_headers, read_record

STRIDED_LAYOUT = 7
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"


# the scan driver's scan_source, for the torch zips a .pt2 embeds
NestedScan = Callable[[ByteSource, ScanOptions], Report]


@record(slots=True)
class _Archive:
    source: ByteSource
    directory: ZipDirectory
    prefix: str                                  # "m/" (with the slash) or ""
    locals_: dict[int, LocalHeader]
    an: Analysis
    scan_nested: NestedScan

    counts: dict[Code, int] = field(default_factory=dict)
    scanned: dict[str, Any] = field(default_factory=dict)    # record -> nested report

    def add(self, code: Code, message: str, *, record: str | None = None,
            offset: int | None = None, severity: Severity | None = None) -> None:
        """A finding, capped per code (a config can list a million payloads)."""
        limits = self.an.options.limits
        n = self.counts[code] = self.counts.get(code, 0) + 1
        if n <= limits.max_pt2_findings_per_code:
            self.an.add(code, message[:limits.max_pt2_message_chars], record=record, offset=offset,
                        severity=severity)
        elif n == limits.max_pt2_findings_per_code + 1:
            self.an.add(code, f"more {code} findings not listed", record=record)

    def entry(self, rel: str) -> ZipEntry | None:
        return self.directory.by_name.get(self.prefix + rel)

    def read(self, rel: str, cap: int) -> bytes:
        return read_record(self.source, self.directory, self.prefix + rel, max_nbytes=cap)

    def data_offset(self, rel: str) -> int | None:
        """Absolute offset of a stored record's bytes (None if compressed or unreadable)."""
        e = self.entry(rel)
        if e is None or e.method != 0 or e.compressed_size != e.uncompressed_size:
            return None
        local = self.locals_.get(e.index)
        return local.data_offset if local is not None else None


def analyze_zip(source: ByteSource, directory: ZipDirectory, an: Analysis, *,
                scan_nested: NestedScan) -> None:
    """Judge a `.pt2` archive written by `torch.export.save`; `scan_nested` scans the torch
    zips embedded in it (the driver's `scan_source`)."""
    an.format = "torch-export"
    errors: list[CkptError] = []
    locals_ = read_local_headers(source, directory.entries, errors=errors)
    check_archive(directory, locals_, an, source=source)
    for exc in errors:
        an.add_error(exc)
    prefix = directory.prefix()
    ar = _Archive(source, directory, f"{prefix}/" if prefix else "", locals_, an, scan_nested)
    summary: dict[str, Any] = {"models": {}}
    an.extra["pt2"] = summary
    try:
        fmt = ar.read("archive_format", an.options.limits.max_pt2_small_record)
    except LimitExceeded:
        fmt = b"?"
    except FormatError:
        fmt = b""
    if fmt != b"pt2":
        ar.add(Code.PT2_BAD_ARCHIVE, f"archive_format is {fmt[:16]!r}, torch.export.load asserts "
               "'pt2' (Invalid archive format)", record=ar.prefix + "archive_format")
    models = sorted(n[len(ar.prefix):] for n in directory.by_name
                    if n.startswith(ar.prefix + "models/"))
    if not models:
        ar.add(Code.PT2_BAD_ARCHIVE, "no models/<name>.json in the archive")
    max_models = an.options.limits.max_pt2_models
    if len(models) > max_models:
        ar.add(Code.PT2_BAD_ARCHIVE, f"{len(models)} entries under models/: only the first "
               f"{max_models} are judged")
        models = models[:max_models]
    for rel in models:
        name = rel[len("models/"):-len(".json")] if rel.endswith(".json") else rel[len("models/"):]
        try:
            summary["models"][name] = _analyze_model(ar, rel, name)
        except SourceError:
            raise
        except CkptError as exc:
            ar.add(exc.code, exc.message, record=exc.record or ar.prefix + rel, offset=exc.offset)
    _set_weights_only(an)


def _set_weights_only(an: Analysis) -> None:
    reasons = [f for f in an.findings if f.code in (Code.PT2_UNSAFE_PAYLOAD, Code.PT2_SYMPY_EXPR,
                                                    Code.PT2_GUARDS_CODE, Code.PT2_UNSAFE_TARGET)]
    broken = [f for f in an.findings if f.code.effect == "invalid"]
    unsafe = sorted(g.full for g in an.globals.values() if g.status != "allowed")
    if reasons:
        # torch.export.load raises nothing here: it unpickles/evaluates; error says what
        an.weights_only = WeightsOnly(loadable=False, error=reasons[0].message,
                                      error_type=None, unsafe_globals=unsafe)
    elif broken:
        an.weights_only = WeightsOnly(loadable=False, error=broken[0].message, error_type=None,
                                      unsafe_globals=unsafe)
    else:
        # torch.export.load would only read raw weights and the JSON program
        an.weights_only = WeightsOnly(loadable=True, unsafe_globals=unsafe)


# Nesting a report value may keep: 500 nested lists are 1 KB of JSON, but pickling them to
# send the report from a worker process exhausts the interpreter's recursion limit.
_SUMMARY_DEPTH = 16


def _small(value: Any, max_json: int) -> Any:
    """`value` for the report if its JSON is small and shallow, else a note (the report stays
    bounded, and serialisable by json and pickle alike)."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        return "<unserializable>"
    if len(text) > max_json:
        return f"<{len(text)} bytes of JSON omitted>"
    if _depth(value) > _SUMMARY_DEPTH:
        return f"<JSON nested more than {_SUMMARY_DEPTH} levels omitted>"
    return value


def _depth(value: Any) -> int:
    """How deeply lists and dicts nest in a JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _read_json(ar: _Archive, rel: str) -> Any:
    data = ar.read(rel, ar.an.options.limits.max_pt2_json_bytes)
    # a program's JSON plays its pickle's part: the report's budget counts it so
    # (core.reportsize.report_budget)
    ar.an.io["pickle_bytes"] = ar.an.io.get("pickle_bytes", 0) + len(data)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(Code.PT2_BAD_ARCHIVE, f"{rel} is not valid JSON: {exc}"[:300],
                          record=ar.prefix + rel) from exc


def _analyze_model(ar: _Archive, rel: str, name: str) -> dict[str, Any]:
    program = _read_json(ar, rel)
    small = ar.an.options.limits.max_pt2_summary_json
    if not isinstance(program, dict):
        raise FormatError(Code.PT2_BAD_ARCHIVE, f"{rel} is not a JSON object", record=ar.prefix + rel)
    weights = _payloads(ar, f"{WEIGHTS_DIR}{name}_weights_config.json", f"{WEIGHTS_DIR}{name}.pt",
                        WEIGHTS_DIR, "weights")
    constants = _payloads(ar, f"{CONSTANTS_DIR}{name}_constants_config.json",
                          f"{CONSTANTS_DIR}{name}.pt", CONSTANTS_DIR, "constants")
    _sample_inputs(ar, name)
    _check_exprs(ar, program, rel)
    guards = program.get("guards_code")
    if guards:
        count = len(guards) if isinstance(guards, list) else 1
        ar.add(Code.PT2_GUARDS_CODE, f"{rel}: guards_code holds {count} Python expression(s) "
               "that ExportedProgram.module() compiles with exec", record=ar.prefix + rel)
    limits = ar.an.options.limits
    violations = verify_program(program, weights, constants, max_violations=limits.max_pt2_violations,
                                max_graph_depth=limits.max_pt2_graph_depth)
    # the verifier's messages quote names of any length: kept to max_name_chars, in the
    # findings and in the summary (which the report's cap does not cut)
    messages = [_shortened(v.message, limits.max_name_chars) for v in violations]
    for v, message in zip(violations, messages, strict=True):
        code = Code.PT2_UNSAFE_TARGET if v.unsafe else Code.PT2_VERIFIER
        ar.add(code, f"[{v.rule}] {message}", record=ar.prefix + rel)
    gm = _obj(program.get("graph_module"))
    graph = _obj(gm.get("graph"))
    nodes = graph.get("nodes")
    nodes = nodes if isinstance(nodes, list) else []
    targets: dict[str, int] = {}
    for node in nodes:
        if isinstance(node, dict) and isinstance(node.get("target"), str):
            targets[node["target"]] = targets.get(node["target"], 0) + 1
    return {
        "schema_version": _small(program.get("schema_version"), small),
        "opset_version": _small(program.get("opset_version"), small),
        "verifiers": _small(program.get("verifiers"), small),
        "torch_version": _small(program.get("torch_version"), small),
        "range_constraints": _small(program.get("range_constraints"), small),
        "nodes": len(nodes),
        "targets": {k[:200]: v for k, v in sorted(targets.items())[:200]},
        "weights": len(weights),
        "constants": len(constants),
        "verifier": [{"rule": v.rule, "message": message}
                     for v, message in zip(violations, messages, strict=True)],
    }


def _shortened(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else f"{text[:max_chars]}... ({len(text):,} characters)"


def _payloads(ar: _Archive, config_rel: str, legacy_rel: str, base_dir: str,
              kind: str) -> dict[str, dict[str, Any]]:
    """One payload config -> {fqn: PayloadMeta}; raw tensors into the manifest."""
    an = ar.an
    if ar.entry(legacy_rel) is not None:
        # _package.py: legacy <name>.pt bytes go through deserialize_torch_artifact
        ar.add(Code.PT2_UNSAFE_PAYLOAD, f"legacy {kind} file {legacy_rel}: torch.export.load "
               "retries torch.load with weights_only=False if the weights-only load fails",
               record=ar.prefix + legacy_rel)
        _scan_nested(ar, legacy_rel)
        return {}
    if ar.entry(config_rel) is None:
        ar.add(Code.PT2_MISSING_RECORD, f"{config_rel} not found in PT2 archive",
               record=ar.prefix + config_rel)
        return {}
    doc = _read_json(ar, config_rel)
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise FormatError(Code.PT2_BAD_ARCHIVE, f"{config_rel} has no 'config' object",
                          record=ar.prefix + config_rel)
    out: dict[str, dict[str, Any]] = {}
    storages: set[str] = set()
    for fqn, meta in config.items():
        if len(an.tensors) >= an.options.limits.max_tensors:
            raise LimitExceeded(Code.LIMIT_TENSORS, f"more than {an.options.limits.max_tensors} tensors")
        if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
            ar.add(Code.PT2_BAD_ARCHIVE, f"{config_rel}: payload {fqn!r} has no path_name",
                   record=ar.prefix + config_rel)
            continue
        out[fqn] = meta
        path = meta["path_name"]
        rel = base_dir + path
        record = ar.prefix + rel
        if ar.entry(rel) is None:
            ar.add(Code.PT2_MISSING_RECORD, f"{kind} {fqn!r}: record {rel} is missing", record=record)
            continue
        if kind == "constants" and path.startswith("opaque_obj_"):
            ar.add(Code.PT2_UNSAFE_PAYLOAD, f"constant {fqn!r} ({rel}) is loaded with pickle.loads",
                   record=record)
            _scan_raw_pickle(ar, rel)
        elif kind == "constants" and path.startswith("custom_obj_"):
            ar.add(Code.PT2_UNSAFE_PAYLOAD, f"constant {fqn!r} ({rel}) is a TorchScript object "
                   "loaded with torch._C._pickle_load_obj", record=record)
            _scan_nested(ar, rel)
        elif kind == "constants" and not path.startswith("tensor_"):
            ar.add(Code.PT2_BAD_ARCHIVE, f"Unsupported constant type: {path}", record=record)
        elif meta.get("use_pickle"):
            ar.add(Code.PT2_UNSAFE_PAYLOAD, f"{kind[:-1]} {fqn!r} ({rel}) is loaded with "
                   "torch.load(weights_only=False)", record=record)
            _scan_nested(ar, rel)
        else:
            _tensor(ar, fqn, meta, rel, kind, new_storage=path not in storages)
            storages.add(path)
    return out


def _as_ints(values: Any, what: str) -> list[int]:
    if not isinstance(values, list):
        raise ValueError(f"{what} is not a list")
    out = []
    for v in values:
        n = v.get("as_int") if isinstance(v, dict) else None
        if isinstance(n, bool) or not isinstance(n, int):
            # _package.py deserialize_size/stride: "Only as_int is supported"
            raise ValueError(f"{what}: only as_int is supported, got {str(v)[:80]}")
        out.append(n)
    return out


def _tensor(ar: _Archive, fqn: str, meta: Mapping[str, Any], rel: str, kind: str, *,
            new_storage: bool) -> None:
    an = ar.an
    record = ar.prefix + rel
    entry = ar.entry(rel)
    assert entry is not None
    tm = meta.get("tensor_meta")
    try:
        if not isinstance(tm, dict):
            raise ValueError("tensor_meta cannot be None for a non-pickled payload")
        code = tm.get("dtype")
        dtype = EXPORT_SCALAR_TYPE.get(code) if isinstance(code, int) else None
        if dtype is None:
            raise ValueError(f"unknown ScalarType {tm.get('dtype')!r}")
        shape = _as_ints(tm.get("sizes"), "sizes")
        stride = _as_ints(tm.get("strides"), "strides")
        (offset,) = _as_ints([tm.get("storage_offset")], "storage_offset")
        if len(shape) != len(stride):
            raise ValueError(f"{len(shape)} sizes but {len(stride)} strides")
        if any(d < 0 for d in shape) or any(s < 0 for s in stride) or offset < 0:
            raise ValueError(f"negative size/stride/offset {shape} {stride} {offset}")
        if tm.get("layout", STRIDED_LAYOUT) != STRIDED_LAYOUT:
            raise ValueError(f"layout {tm.get('layout')} is not strided")
    except ValueError as exc:
        ar.add(Code.PT2_BAD_ARCHIVE, f"{kind[:-1]} {fqn!r}: {exc}", record=record)
        return
    itemsize = ITEMSIZE[dtype]
    nbytes_record = entry.uncompressed_size
    if nbytes_record % itemsize:
        ar.add(Code.PT2_BAD_ARCHIVE, f"Record {rel}: size {nbytes_record} is not a multiple of "
               f"element size {itemsize} for dtype {dtype}", record=record)
        return
    numel_record = nbytes_record // itemsize
    numel = 1
    for d in shape:
        numel *= d
    extent = 0 if numel == 0 else offset + 1 + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
    base = ar.data_offset(rel)
    # a 0-byte record becomes torch.zeros(sizes): no storage bytes, nothing to bound
    if nbytes_record and extent > numel_record:
        ar.add(Code.TORCH_TENSOR_OUT_OF_BOUNDS, f"{kind[:-1]} {fqn!r}: view {shape}/{stride}+{offset} "
               f"needs {extent} elements, {rel} holds {numel_record}", record=record,
               offset=base)
    device = _obj(tm.get("device"))
    location = str(device.get("type", "cpu")) + (f":{device['index']}" if device.get("index") is not None
                                                 else "")
    tensor_kind = "parameter" if meta.get("is_param") else ("buffer" if kind == "weights" else "constant")
    an.tensors.append(TensorEntry(
        name=fqn, path=[fqn], dtype=dtype, shape=shape, stride=stride, storage_offset=offset,
        storage=meta["path_name"], kind=tensor_kind, requires_grad=bool(tm.get("requires_grad")),
        data_offset=None if base is None or not nbytes_record else base + offset * itemsize,
        nbytes=max(0, extent - offset) * itemsize, record=record))
    if new_storage:
        an.storages.append(StorageEntry(
            key=meta["path_name"], dtype=dtype, numel=numel_record, nbytes=nbytes_record,
            location=location, record=record, data_offset=base, offset_verified=base is not None))


def _sample_inputs(ar: _Archive, name: str) -> None:
    rel = f"data/sample_inputs/{name}.pt"
    entry = ar.entry(rel)
    if entry is None:
        # load_pt2 reads it unconditionally: the load fails
        ar.add(Code.PT2_MISSING_RECORD, f"{rel} not found in PT2 archive", record=ar.prefix + rel)
        return
    if entry.uncompressed_size == 0:
        return
    report = _scan_nested(ar, rel)
    if report is not None and not report.weights_only.loadable:
        ar.add(Code.PT2_UNSAFE_PAYLOAD, f"{rel}: sample inputs are not weights-only loadable "
                  f"({report.weights_only.error}); torch.export.load then retries with "
                  "weights_only=False", record=ar.prefix + rel)


def _scan_nested(ar: _Archive, rel: str) -> Any:
    """Scan an embedded torch.save/TorchScript zip; merge its findings and globals."""
    an = ar.an
    record = ar.prefix + rel
    if record in ar.scanned:      # payloads sharing one record: judge it once
        return ar.scanned[record]
    ar.scanned[record] = None
    try:
        data = ar.read(rel, an.options.limits.max_bytes_read)
    except SourceError:
        raise
    except CkptError as exc:
        ar.add(exc.code, exc.message, record=record, offset=exc.offset)
        return None
    if data[:4] == b"PK\x03\x04" and b"archive_format" in data[-65536:]:
        # a .pt2 inside a .pt2: torch.load cannot read it (no data.pkl); do not recurse
        ar.add(Code.PT2_BAD_ARCHIVE, f"{rel} holds a nested torch.export archive", record=record)
        return None
    report = ar.scan_nested(BytesSource(data, name=record), an.options)
    base = ar.data_offset(rel)
    for f in report.findings[:an.options.limits.max_nested_findings]:
        ar.add(f.code, f"{record}: {f.message}", record=f"{record}!{f.record}" if f.record else record,
               offset=(base + f.offset) if base is not None and f.offset is not None else None,
               severity=f.severity)
    for g in report.globals:
        an.note_global(g.module, g.name, g.status, record=record, count=g.count, reason=g.reason,
                       offset=(base + g.offset) if base is not None and g.offset is not None else None)
    ar.scanned[record] = report
    return report


def _scan_raw_pickle(ar: _Archive, rel: str) -> None:
    from ckptguard.core.judge import scan_pickle

    an = ar.an
    record = ar.prefix + rel
    if record in ar.scanned:
        return
    ar.scanned[record] = None
    try:
        data = ar.read(rel, an.options.limits.max_pickle_bytes)
    except SourceError:
        raise
    except CkptError as exc:
        ar.add(exc.code, exc.message, record=record, offset=exc.offset)
        return
    base = ar.data_offset(rel)
    scan_pickle(data, an, record=record, base_offset=base or 0)


def _check_exprs(ar: _Archive, program: Mapping[str, Any], rel: str) -> None:
    bad: list[tuple[str, str, str | None]] = []
    for expr in iter_exprs(program):
        problem = plain_problem(expr, ar.an.options.limits.max_pt2_expr_chars)
        if problem is not None:
            bad.append((expr, problem, code_evidence(expr)))
    record = ar.prefix + rel
    for expr, problem, _ in bad[:20]:
        ar.add(Code.PT2_SYMPY_EXPR, f"{rel}: expr_str {expr[:200]!r} would reach sympy.sympify "
               f"(eval) and is not plain Symbol/Integer arithmetic ({problem})", record=record)
    if len(bad) > 20:
        ar.add(Code.PT2_SYMPY_EXPR, f"{rel}: {len(bad) - 20} more unsafe expr_str values",
               record=record)
    evil = [(expr, why) for expr, _, why in bad if why is not None]
    for expr, why in evil[:20]:
        ar.add(Code.PT2_SYMPY_EVAL, f"{rel}: torch.export.load calls sympy.sympify (eval) "
               f"on expr_str {expr[:200]!r}, which runs code: {why}", record=record)
    if len(evil) > 20:
        ar.add(Code.PT2_SYMPY_EVAL, f"{rel}: {len(evil) - 20} more expr_str values that "
               "run code under sympy.sympify", record=record)
