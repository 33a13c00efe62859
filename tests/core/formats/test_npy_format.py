"""core/formats/npy.py: .npy/.npz headers, manifests, object arrays, corrupt files."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from ckptguard.core.errors import Code
from ckptguard.core.formats import npy
from ckptguard.core.io.source import BytesSource
from ckptguard.core.scan import scan_source
from ckptguard.core.state import Analysis
from tests.core.formats.fmt_cases import (
    npy_bytes,
    npy_library_files,
    npy_raw,
    npz_bytes,
    npz_from_members,
)

GOOD = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"


def _an(data: bytes) -> Analysis:
    an = Analysis()
    npy.analyze(BytesSource(data), an)
    return an


def _codes(an: Analysis) -> set[Code]:
    return {f.code for f in an.findings}


@pytest.mark.parametrize("name", ["f32", "i64_scalar", "fortran", "bool", "empty", "big_endian",
                                  "structured", "unicode", "complex", "datetime", "v2",
                                  "v3_unicode_fields"])
def test_plain_arrays_manifest_equals_np_load(name: str) -> None:
    data = npy_library_files()[name]
    arr = np.load(io.BytesIO(data))
    an = _an(data)
    assert an.findings == []
    assert an.weights_only is not None and an.weights_only.loadable
    (t,) = an.tensors
    assert t.shape == list(arr.shape)
    assert t.nbytes == arr.nbytes
    assert t.data_offset is not None
    raw = data[t.data_offset : t.data_offset + t.nbytes]
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    assert raw == arr.tobytes(order=order)


def test_dtype_names_and_fortran_strides() -> None:
    an = _an(npy_library_files()["fortran"])
    (t,) = an.tensors
    assert t.dtype == "float64" and t.shape == [3, 4] and t.stride == [1, 3]
    assert _an(npy_library_files()["big_endian"]).tensors[0].dtype == ">u4"


def test_scan_source_verdict_safe_for_plain_npy() -> None:
    report = scan_source(BytesSource(npy_library_files()["f32"], name="a.npy"))
    assert report.format == "numpy" and report.verdict == "safe"


def test_object_array_pickle_is_scanned_not_loaded() -> None:
    data = npy_library_files()["object"]
    an = _an(data)
    assert Code.NPY_OBJECT_ARRAY in _codes(an)
    assert an.weights_only is not None and not an.weights_only.loadable
    assert an.weights_only.error == npy.OBJECT_ERROR
    assert ("numpy.core.multiarray", "_reconstruct") in an.globals or any(
        g.name == "_reconstruct" for g in an.globals.values())
    assert an.tensors == []


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("echo pwned",))


def test_object_array_with_a_dangerous_pickle_is_unsafe() -> None:
    header = npy_raw("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }")
    data = header + pickle.dumps(_Boom(), protocol=4)
    report = scan_source(BytesSource(data))
    assert report.verdict == "unsafe"
    assert any(g.module in ("os", "posix") and g.name == "system" for g in report.globals)
    assert any(f.code is Code.NPY_OBJECT_ARRAY for f in report.findings)


@pytest.mark.parametrize(("data", "code"), [
    (npy_raw(GOOD, b"\0" * 4), Code.NPY_TRUNCATED),
    (npy_raw(GOOD, b"\0" * 12), Code.NPY_TRAILING_DATA),
    (npy_raw("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"), Code.NPY_BAD_SHAPE),
    (npy_raw("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", b"\0" * 8), Code.NPY_BAD_HEADER),
    (npy_raw("{'descr': '<f4', 'shape': (2,), }", b"\0" * 8), Code.NPY_BAD_HEADER),
    (npy_raw("{'descr': 'xyz', 'fortran_order': False, 'shape': (2,), }"), Code.NPY_BAD_HEADER),
    (npy_raw("__import__('os').system('x')"), Code.NPY_BAD_HEADER),
    (npy_raw(GOOD, b"\0" * 8, version=(4, 0)), Code.NPY_BAD_HEADER),
    (npy_raw("{" + " " * 20000 + "}", version=(2, 0)), Code.LIMIT_HEADER),
    (npy_library_files()["huge_header"], Code.LIMIT_HEADER),
    (b"\x93NUMPY\x01\x00\xff\xff{}", Code.NPY_BAD_HEADER),
])
def test_corrupt_npy_findings(data: bytes, code: Code) -> None:
    an = _an(data)
    assert code in _codes(an)


def test_python2_long_suffix_is_accepted_like_numpy() -> None:
    data = npy_raw("{'descr': '<i2', 'fortran_order': False, 'shape': (2L,), }", b"\0" * 4)
    an = _an(data)
    assert an.findings == [] and an.tensors[0].shape == [2]
    with pytest.warns(UserWarning):
        assert np.load(io.BytesIO(data)).shape == (2,)


def test_npz_stored_members_have_absolute_offsets() -> None:
    arrays = {"a": np.arange(10, dtype=np.int16), "b": np.ones((2, 3), np.float32)}
    data = npz_bytes(arrays)
    report = scan_source(BytesSource(data, name="x.npz"))
    assert report.format == "numpy-zip" and report.verdict == "safe", report.findings
    by_name = {t.name: t for t in report.tensors}
    assert set(by_name) == {"a", "b"}
    for key, arr in arrays.items():
        t = by_name[key]
        assert t.record == f"{key}.npy" and t.data_offset is not None
        assert data[t.data_offset : t.data_offset + t.nbytes] == arr.tobytes()


def test_npz_compressed_members_are_inflated_without_offsets() -> None:
    data = npz_bytes({"z": np.arange(100, dtype=np.float64)}, compressed=True)
    report = scan_source(BytesSource(data))
    assert report.format == "numpy-zip"
    (t,) = report.tensors
    assert t.data_offset is None and t.nbytes == 800 and t.shape == [100]


def test_npz_object_member_and_non_array_member() -> None:
    obj = npy_bytes(np.array([{"k": 1}], dtype=object), allow_pickle=True)
    data = npz_from_members({"ok.npy": npy_bytes(np.zeros(2)), "obj.npy": obj,
                             "note.npy": b"not an array"})
    an = Analysis()
    report = scan_source(BytesSource(data))
    codes = {f.code for f in report.findings}
    assert Code.NPY_OBJECT_ARRAY in codes and Code.NPY_BAD_HEADER in codes
    assert Code.ZIP_NAME_OUTSIDE_PREFIX not in codes
    assert not report.weights_only.loadable
    assert [t.name for t in report.tensors] == ["ok"]
    assert an.findings == []


def test_two_reads_for_a_plain_npy() -> None:
    src = BytesSource(npy_bytes(np.zeros(100_000, np.float32)))
    npy.analyze(src, Analysis())
    assert src.stats.requests == 1 and src.stats.bytes_read == npy.HEAD_READ
