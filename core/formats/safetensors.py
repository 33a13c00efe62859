"""safetensors: header validation exactly as the safetensors library 0.8 enforces it.

Strategy: read the 8-byte length and the header in at most two reads (one
speculative read covers small headers), then replay the Rust reader's checks in its
order (FORMATS.md §6; safetensors/src/tensor.rs `read_metadata` + `validate`):
length bounds, UTF-8, serde_json's grammar (recursion limit, lone surrogates,
integers only as u64, duplicate struct fields), the struct shapes serde accepts
(tensor info as a map *or* a 3-sequence, dtype as a string or `{"F32": null}`),
offsets sorted by (begin, end) that tile the buffer, sizes from shape x bits.
Unlike the library we do not stop at the first violation: each one is a finding.
Acceptance (no finding with effect `invalid`) equals the library's.
Manifest ints stay small whatever the header says: a tensor whose byte size overflows or
whose offsets pass int64 (both already findings) gets no entry, and strides stop growing
at int64 (a zero-element shape such as [0, 2**64-1, 2**64-1] is valid to the library; its
row-major strides would otherwise reach 64*D bits). Shape values are the library's u64s.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from ckptguard.core.errors import Code, FormatError, LimitExceeded
from ckptguard.core.filemap import add_region
from ckptguard.core.io.source import ByteSource
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.records import field, record
from ckptguard.core.report import TensorEntry, WeightsOnly
from ckptguard.core.state import Analysis
from ckptguard.core.torch.dtypes import SAFETENSORS_DTYPE

MAX_HEADER_SIZE = 100_000_000          # safetensors: MAX_HEADER_SIZE
SPECULATIVE_READ = 64 * 1024           # one read covers most headers
SERDE_MAX_DEPTH = 127                  # serde_json recursion limit: 128 nested levels fail
U64_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1                  # every int of the manifest fits torch's int64
METADATA_KEY = "__metadata__"
_FIELDS = ("dtype", "shape", "data_offsets")


class _Bad:
    """A JSON number serde_json would not deserialize as usize (negative, float, > u64)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in document order (duplicates kept)."""


@record(slots=True)
class StTensor:
    name: str
    dtype: str                 # safetensors tag, e.g. "F32"
    shape: list[int]
    begin: int
    end: int


@record(slots=True)
class StHeader:
    header_len: int
    tensors: list[StTensor] = field(default_factory=list)   # sorted by (begin, end)
    metadata: dict[str, str] | None = None
    duplicates: list[str] = field(default_factory=list)


def analyze(source: ByteSource, an: Analysis) -> None:
    """Validate a whole .safetensors file; fill the manifest with absolute offsets."""
    an.format = "safetensors"
    size = source.size
    try:
        header = read_header(source, an.options.limits.max_header_bytes)
        problems = validate(header, size)
    except FormatError as exc:
        an.add_error(exc)
        an.weights_only = WeightsOnly(loadable=False, error=exc.message, error_type="SafetensorError")
        return
    cap = an.options.limits.max_format_findings
    for problem in problems[:cap]:
        an.add_error(problem)
    if len(problems) > cap:
        an.add(problems[0].code, f"{len(problems) - cap} more violations not listed")
    for name in header.duplicates:
        an.add(Code.ST_DUPLICATE_NAME, f"tensor name {name!r} appears more than once; "
               "the library keeps the last one, other readers may keep the first", offset=8)
    base = 8 + header.header_len
    add_region(an.map_regions, "header", "safetensors header", 0, min(base, size))
    add_region(an.map_regions, "tensor_data", "data buffer", base, size - base)
    for t in header.tensors:
        # no entry without a byte size or with offsets past int64: validate() said why
        if _numel(t.shape) is None or base + max(t.begin, t.end) > INT64_MAX:
            continue
        an.tensors.append(TensorEntry(
            name=t.name, path=[t.name], dtype=SAFETENSORS_DTYPE[t.dtype][0], shape=list(t.shape),
            stride=contiguous_strides(t.shape), storage_offset=0, storage=None, kind="tensor",
            requires_grad=False, data_offset=base + t.begin, nbytes=max(0, t.end - t.begin)))
    an.extra["safetensors"] = {
        "header_bytes": header.header_len,
        "metadata": header.metadata if header.metadata is not None and
        len(json.dumps(header.metadata)) <= 4096 else None,
        "metadata_keys": len(header.metadata or {}),
    }
    if problems:
        an.weights_only = WeightsOnly(loadable=False, error=problems[0].message,
                                      error_type="SafetensorError")
    else:
        # FORMATS.md §0: torch.load routes .safetensors to the safetensors library: no pickle.
        an.weights_only = WeightsOnly(loadable=True)


def contiguous_strides(shape: list[int]) -> list[int]:
    """Row-major element strides of `shape`; a stride past int64 is listed as 0.

    Only a zero-element tensor gets there (a valid tensor with elements has numel within
    the file size): its strides address no byte. torch's reshape computes them in wrapping
    int64 ([0, 2**40, 2**40, 2**40] -> (0, 0, 2**40, 1), as here). Saturating keeps every
    product below 2**128, so a 30,000-dim shape costs linear time, not 64*D-bit ints.
    """
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(shape[i], 1)
        if acc > INT64_MAX:
            acc = 0
    return strides


def _numel(shape: list[int]) -> int | None:
    """The element count as the library computes it (checked u64 products, in order)."""
    numel = 1
    for dim in shape:
        numel *= dim
        if numel > U64_MAX:
            return None
    return numel


def _shape_text(shape: list[int]) -> str:
    """A shape for a message: a 30,000-dim shape would make a 600 kB finding."""
    if len(shape) <= 8:
        return str(shape)
    return f"[{', '.join(map(str, shape[:8]))}, ...] ({len(shape)} dims)"


def read_header(source: ByteSource, max_header_bytes: int = DEFAULT_LIMITS.max_header_bytes) -> StHeader:
    """Read and parse the JSON header (at most two source reads). Raises FormatError, or
    LimitExceeded past our own cap (Limits.max_header_bytes, which may be lower than the
    library's MAX_HEADER_SIZE)."""
    size = source.size
    if size < 8:
        raise FormatError(Code.ST_BAD_HEADER, "header too small", offset=0)
    first = source.read_at(0, min(size, SPECULATIVE_READ))
    (n,) = struct.unpack_from("<Q", first)
    if n > MAX_HEADER_SIZE:
        raise FormatError(Code.ST_BAD_HEADER, f"header too large ({n} bytes)", offset=0)
    if n > max_header_bytes:
        raise LimitExceeded(Code.LIMIT_HEADER, f"a {n}-byte safetensors header", offset=0)
    if 8 + n > size:
        raise FormatError(Code.ST_BAD_HEADER,
                          f"invalid header length {n} for a {size}-byte file", offset=0)
    raw = first[8 : 8 + n] if 8 + n <= len(first) else first[8:] + source.read_at(
        len(first), 8 + n - len(first))
    return parse_header(raw)


def parse_header(raw: bytes) -> StHeader:
    """The header bytes -> StHeader, with serde_json's and serde's acceptance rules.

    >>> parse_header(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}').tensors[0].end
    8
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(Code.ST_BAD_HEADER, "header is not valid UTF-8",
                          offset=8 + exc.start) from exc
    depth = json_depth(raw)
    if depth > SERDE_MAX_DEPTH:
        raise FormatError(Code.ST_BAD_HEADER, f"JSON nested {depth} deep: recursion limit exceeded",
                          offset=8)
    try:
        doc = json.loads(text, object_pairs_hook=_Pairs, parse_int=_parse_int,
                         parse_float=_Bad, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        where = 8 + len(text[: exc.pos].encode("utf-8", "surrogatepass"))
        raise FormatError(Code.ST_BAD_HEADER, f"invalid JSON in header: {exc.msg} "
                          f"(line {exc.lineno} column {exc.colno})", offset=where) from exc
    except (ValueError, RecursionError) as exc:
        raise FormatError(Code.ST_BAD_HEADER, f"invalid JSON in header: {exc}", offset=8) from exc
    _check_strings(doc)
    if not isinstance(doc, _Pairs):
        raise FormatError(Code.ST_BAD_HEADER, "header is not a JSON object", offset=8)
    header = StHeader(header_len=len(raw))
    tensors: dict[str, StTensor] = {}
    seen_meta = False
    for key, value in doc:
        if key == METADATA_KEY:
            if seen_meta:
                raise FormatError(Code.ST_BAD_HEADER, "duplicate field `__metadata__`", offset=8)
            seen_meta = True
            header.metadata = _metadata(value)
            continue
        if key in tensors:
            header.duplicates.append(key)
        tensors[key] = _tensor_info(key, value)   # serde's HashMap: the last one wins
    # safetensors sorts by data_offsets (begin, end); Python's sort is stable like Rust's
    header.tensors = sorted(tensors.values(), key=lambda t: (t.begin, t.end))
    return header


def validate(header: StHeader, file_size: int) -> list[FormatError]:
    """`Metadata::validate` + the buffer-coverage check, every violation collected."""
    problems: list[FormatError] = []
    base = 8 + header.header_len
    start = 0
    for t in header.tensors:
        at = min(base + t.begin, file_size)   # a finding's offset is a byte of the file
        if t.begin != start or t.end < t.begin:
            problems.append(FormatError(
                Code.ST_BAD_OFFSETS, f"invalid offset for tensor `{t.name}`: "
                f"[{t.begin}, {t.end}) where {start} was expected", offset=at))
        start = t.end
        numel = _numel(t.shape)
        if numel is None or numel * SAFETENSORS_DTYPE[t.dtype][1] > U64_MAX:
            problems.append(FormatError(
                Code.ST_SIZE_MISMATCH, f"overflow computing buffer size of `{t.name}` "
                f"from shape {_shape_text(t.shape)} and {t.dtype}", offset=at))
            continue
        bits = numel * SAFETENSORS_DTYPE[t.dtype][1]
        if bits % 8:
            problems.append(FormatError(
                Code.ST_SIZE_MISMATCH, f"`{t.name}`: {numel} x {t.dtype} does not end on a byte "
                "boundary", offset=at))
            continue
        if t.end >= t.begin and t.end - t.begin != bits // 8:
            problems.append(FormatError(
                Code.ST_SIZE_MISMATCH, f"invalid shape, data type, or offset for tensor `{t.name}`: "
                f"{_shape_text(t.shape)} x {t.dtype} is {bits // 8} bytes, offsets span "
                f"{t.end - t.begin}", offset=at))
    if base + start != file_size:
        problems.append(FormatError(
            Code.ST_NOT_COVERED, f"incomplete metadata, file not fully covered: tensors end at "
            f"{base + start}, the file at {file_size}", offset=min(base + start, file_size)))
    return problems


def json_depth(raw: bytes) -> int:
    """Deepest `[`/`{` nesting outside strings (serde_json counts the same brackets)."""
    stripped = _STRING_RE.sub(b"", raw)
    depth = deepest = 0
    for m in _BRACKET_RE.finditer(stripped):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET_RE = re.compile(rb"[\[\]{}]")


def _parse_int(text: str) -> int | _Bad:
    # serde_json: "-0" is a float, negatives are i64, > u64::MAX falls back to f64
    if text.startswith("-") or len(text) > 20 or int(text) > U64_MAX:
        return _Bad(text)
    return int(text)


def _reject_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _check_strings(doc: Any) -> None:
    """serde_json refuses lone surrogates (Python's json decodes them); walk iteratively."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE_RE.search(node):
                raise FormatError(Code.ST_BAD_HEADER, "lone surrogate in hex escape", offset=8)
        elif isinstance(node, _Pairs):
            for k, v in node:
                stack.append(k)
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:  # Option<HashMap<..>>: null is None
        return None
    if not isinstance(value, _Pairs):
        raise FormatError(Code.ST_BAD_METADATA, f"__metadata__ must be a map, got {_kind(value)}",
                          offset=8)
    out: dict[str, str] = {}
    for k, v in value:
        if not isinstance(v, str):
            raise FormatError(Code.ST_BAD_METADATA,
                              f"__metadata__[{k!r}] must be a string, got {_kind(v)}", offset=8)
        out[k] = v
    return out


def _tensor_info(name: str, value: Any) -> StTensor:
    """serde's derived `TensorInfo`: a map (unknown keys ignored) or a 3-sequence."""
    if isinstance(value, _Pairs):
        found: dict[str, Any] = {}
        for k, v in value:
            if k in _FIELDS:
                if k in found:
                    raise FormatError(Code.ST_BAD_HEADER, f"tensor `{name}`: duplicate field `{k}`",
                                      offset=8)
                found[k] = v
        for f in _FIELDS:
            if f not in found:
                raise FormatError(Code.ST_BAD_HEADER, f"tensor `{name}`: missing field `{f}`",
                                  offset=8)
        dtype_v, shape_v, offsets_v = found["dtype"], found["shape"], found["data_offsets"]
    elif isinstance(value, list):
        if len(value) != 3:
            raise FormatError(Code.ST_BAD_HEADER, f"tensor `{name}`: invalid length {len(value)}, "
                              "expected 3 elements in sequence", offset=8)
        dtype_v, shape_v, offsets_v = value
    else:
        raise FormatError(Code.ST_BAD_HEADER,
                          f"tensor `{name}`: expected struct TensorInfo, got {_kind(value)}", offset=8)
    dtype = _dtype(name, dtype_v)
    if not isinstance(shape_v, list):
        raise FormatError(Code.ST_BAD_SHAPE, f"tensor `{name}`: shape must be a sequence", offset=8)
    shape = [_usize(name, "shape", d) for d in shape_v]
    if not isinstance(offsets_v, list) or len(offsets_v) != 2:
        raise FormatError(Code.ST_BAD_OFFSETS,
                          f"tensor `{name}`: data_offsets must be a tuple of size 2", offset=8)
    begin, end = (_usize(name, "data_offsets", o) for o in offsets_v)
    return StTensor(name, dtype, shape, begin, end)


def _dtype(name: str, value: Any) -> str:
    # serde enum: a unit variant as a string, or a one-entry map {"F32": null}
    if isinstance(value, _Pairs) and len(value) == 1 and value[0][1] is None:
        value = value[0][0]
    if not isinstance(value, str) or value not in SAFETENSORS_DTYPE:
        raise FormatError(Code.ST_BAD_DTYPE, f"tensor `{name}`: unknown dtype {value!r}", offset=8)
    return value


def _usize(name: str, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        code = Code.ST_BAD_OFFSETS if what == "data_offsets" else Code.ST_BAD_SHAPE
        raise FormatError(code, f"tensor `{name}`: {what} entry {value!r} is not a usize", offset=8)
    return value


def _kind(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "map"
    if isinstance(value, list):
        return "sequence"
    if value is None:
        return "null"
    return type(value).__name__
