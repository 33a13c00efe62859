"""core/formats/safetensors.py: rules, findings, manifest offsets, read budget."""

from __future__ import annotations

import numpy as np
import pytest

from ckptguard.core.errors import Code, Effect
from ckptguard.core.formats import safetensors as st
from ckptguard.core.io.source import BytesSource
from ckptguard.core.scan import scan_source
from ckptguard.core.state import Analysis
from tests.core.formats.fmt_cases import st_file, st_hand_cases, st_library_files


def _analyze(data: bytes) -> Analysis:
    an = Analysis()
    st.analyze(BytesSource(data), an)
    return an


def _codes(an: Analysis) -> set[Code]:
    return {f.code for f in an.findings}


def test_library_file_manifest_points_at_the_exact_bytes() -> None:
    from safetensors.numpy import save

    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int64),
              "h": np.full((2, 2), 1.5, np.float16), "e": np.zeros((0, 7), np.float64)}
    data = save(arrays, metadata={"k": "v"})
    an = _analyze(data)
    assert an.findings == []
    assert an.weights_only is not None and an.weights_only.loadable
    by_name = {t.name: t for t in an.tensors}
    assert set(by_name) == set(arrays)
    for name, arr in arrays.items():
        t = by_name[name]
        assert t.shape == list(arr.shape)
        assert t.nbytes == arr.nbytes
        assert t.data_offset is not None
        assert data[t.data_offset : t.data_offset + t.nbytes] == arr.tobytes()
    assert by_name["w"].dtype == "float32" and by_name["w"].stride == [4, 1]
    assert by_name["h"].dtype == "float16" and by_name["b"].dtype == "int64"
    assert an.extra["safetensors"]["metadata"] == {"k": "v"}


def test_scan_source_reports_safe_for_a_library_file() -> None:
    report = scan_source(BytesSource(st_library_files()["np_mixed"], name="m.safetensors"))
    assert report.format == "safetensors"
    assert report.verdict == "safe"
    assert len(report.tensors) == 5


@pytest.mark.parametrize("pad", [0, 100, 70_000])
def test_header_is_read_in_at_most_two_reads(pad: int) -> None:
    header = {"__metadata__": {"pad": "x" * pad}, "a": {"dtype": "U8", "shape": [4],
                                                        "data_offsets": [0, 4]}}
    src = BytesSource(st_file(header, b"abcd" + b""))
    an = Analysis()
    st.analyze(src, an)
    assert an.findings == []
    assert src.stats.requests <= 2
    assert src.stats.requests == (1 if pad < 60_000 else 2)
    # only the header is read, never the tensor data (beyond the speculative window)
    assert src.stats.bytes_read <= max(src.size, st.SPECULATIVE_READ)


def test_big_data_is_not_read() -> None:
    data = st_file({"a": {"dtype": "U8", "shape": [1_000_000], "data_offsets": [0, 1_000_000]}},
                   bytes(1_000_000))
    src = BytesSource(data)
    st.analyze(src, Analysis())
    assert src.stats.requests == 1
    assert src.stats.bytes_read == st.SPECULATIVE_READ


# one case per finding code: hand-made files that produce it
CODE_CASES = {
    Code.ST_BAD_HEADER: "bad_utf8",
    Code.ST_BAD_OFFSETS: "bad_hole",
    Code.ST_BAD_DTYPE: "bad_dtype_unknown",
    Code.ST_BAD_SHAPE: "bad_float_shape",
    Code.ST_SIZE_MISMATCH: "bad_size_mismatch",
    Code.ST_NOT_COVERED: "bad_trailing_data",
    Code.ST_BAD_METADATA: "bad_meta_int",
}


@pytest.mark.parametrize("code", list(CODE_CASES))
def test_each_rule_has_its_code(code: Code) -> None:
    an = _analyze(st_hand_cases()[CODE_CASES[code]])
    assert code in _codes(an)
    assert an.weights_only is not None and not an.weights_only.loadable


def test_every_violation_is_a_finding_not_only_the_first() -> None:
    data = st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                    "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]},
                    "c": {"dtype": "F32", "shape": [2], "data_offsets": [3, 7]}}, b"x" * 9)
    an = _analyze(data)
    codes = [f.code for f in an.findings]
    assert codes.count(Code.ST_BAD_OFFSETS) == 1
    assert Code.ST_SIZE_MISMATCH in codes
    assert Code.ST_NOT_COVERED in codes


def test_duplicate_names_accepted_but_flagged() -> None:
    an = _analyze(st_hand_cases()["ok_dup_name_same"])
    assert _codes(an) == {Code.ST_DUPLICATE_NAME}
    assert all(f.code.effect is not Effect.INVALID for f in an.findings)


def test_offsets_are_absolute_and_sorted_by_begin() -> None:
    an = _analyze(st_hand_cases()["ok_unordered"])
    assert [t.name for t in an.tensors] == ["a", "b"]
    data = st_hand_cases()["ok_unordered"]
    assert [data[t.data_offset] for t in an.tensors if t.data_offset is not None] == [ord("a"), ord("b")]


def test_sub_byte_dtype_sizes() -> None:
    an = _analyze(st_hand_cases()["ok_f4_even"])
    assert an.findings == [] and an.tensors[0].nbytes == 2 and an.tensors[0].dtype == "float4_e2m1fn"


def test_huge_header_length_is_refused_without_reading_it() -> None:
    src = BytesSource(st_hand_cases()["bad_too_large"])
    an = Analysis()
    st.analyze(src, an)
    assert _codes(an) == {Code.ST_BAD_HEADER}
    assert "too large" in an.findings[0].message


def test_json_depth_counts_brackets_outside_strings() -> None:
    assert st.json_depth(b'{"a":"[[[[{{{{","b":[[1]]}') == 3
    assert st.json_depth(b'{"a\\"[[":[1]}') == 2


def test_json_error_offset_points_into_the_header() -> None:
    data = st_file('{"__metadata__": {"a": "b"} x}')
    an = _analyze(data)
    (f,) = an.findings
    assert f.code is Code.ST_BAD_HEADER and f.offset is not None
    assert data[f.offset : f.offset + 1] == b"x"


def test_a_lowered_header_limit_reaches_the_safetensors_parser() -> None:
    """Limits.max_header_bytes is ours: below the library's own 100 MB it fails closed."""
    import json
    import struct

    from ckptguard.core import records
    from ckptguard.core.io.source import BytesSource
    from ckptguard.core.limits import Limits
    from ckptguard.core.scan import scan_source
    from ckptguard.core.state import ScanOptions

    header = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    data = struct.pack("<Q", len(header)) + header + b"\0" * 4
    assert scan_source(BytesSource(data)).verdict == "safe"
    low = ScanOptions(limits=records.replace(Limits(), max_header_bytes=len(header) - 1))
    report = scan_source(BytesSource(data), options=low)
    assert report.verdict == "invalid"
    assert [f.code for f in report.findings] == ["LIMIT_HEADER"]
