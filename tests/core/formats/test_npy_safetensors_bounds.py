"""Shapes numpy/torch cannot build, and the .npz header budget: bounded, invalid, JSON-safe.

Red-team cases: a .npy shape of (0, 10**4000, 10**4000) scanned `safe` and its strides broke
the JSON report; thousands of 3,290-dim .npz members cost gigabytes; a safetensors shape of
u64::MAX dims put 64*D-bit strides into the manifest. numpy is the oracle for .npy.
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any

import numpy as np
import pytest

from ckptguard.core.errors import Code
from ckptguard.core.io.source import BytesSource
from ckptguard.core.limits import Limits
from ckptguard.core.report import Report
from ckptguard.core.scan import scan_source
from ckptguard.core.state import ScanOptions
from tests.core.formats.fmt_cases import npy_raw, npz_from_members, st_file

INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1


def _scan(data: bytes, name: str, limits: Limits | None = None) -> Report:
    options = ScanOptions(limits=limits) if limits is not None else None
    return scan_source(BytesSource(data, name=name), options=options)


def _json_ints(report: Report) -> list[int]:
    """Every int of the JSON report; json.dumps itself must work (no 4300-digit ints)."""
    text = json.dumps(report.to_json())
    out: list[int] = []
    json.loads(text, parse_int=lambda s: out.append(int(s)) or 0)
    return out


def _codes(report: Report) -> set[Code]:
    return {f.code for f in report.findings}


def _npy(shape: str, descr: str = "'<f4'", fortran: bool = False, data: bytes = b"") -> bytes:
    return npy_raw(f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}", data)


def _np_load_error(data: bytes) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as exc:  # numpy's refusal: OverflowError or ValueError
            return str(exc)
    return None


# --- .npy: numpy's own refusals -----------------------------------------------------------------

BIG = 10**4000
NPY_CASES: dict[str, tuple[str, str, bool]] = {
    # name: (shape, descr, fortran_order)
    "redteam_huge_dims": (f"(0, {BIG}, {BIG})", "'<f4'", False),
    "beyond_u64": (f"(0, {2**64})", "'<f4'", False),
    "below_int64": (f"(0, {-2**63 - 1})", "'<f4'", False),
    "just_beyond_int64": (f"(0, {2**63})", "'<f4'", False),
    "dims_65": ("(0," + " 1," * 64 + ")", "'<f4'", False),
    "dims_65_fortran": ("(0," + " 1," * 64 + ")", "'<f4'", True),
    "dims_3290": ("(0," + " 9," * 3289 + ")", "'<f4'", False),
    "zero_dim_first_overflow": (f"(0, {2**62}, {2**62})", "'<f4'", False),
    "zero_dim_last_overflow": (f"({2**62}, {2**62}, 0)", "'<f4'", False),
    "zero_dim_fortran_overflow": (f"(0, {2**62}, {2**62})", "'<f4'", True),
    "bytes_overflow_itemsize": (f"(0, {2**61})", "'<f4'", False),
    "bytes_overflow_u1": (f"(0, {INT64_MAX}, 2)", "'|u1'", False),
}
NPY_OK: dict[str, tuple[str, str, bool]] = {
    "dims_64": ("(0," + " 1," * 63 + ")", "'<f4'", False),
    "int64_max_u1": (f"(0, {INT64_MAX})", "'|u1'", False),
    "just_fits_f4": (f"(0, {2**61 - 1})", "'<f4'", False),
    "zero_last_fits": (f"({INT64_MAX}, 0)", "'|u1'", False),
}


@pytest.mark.parametrize("name", sorted(NPY_CASES))
def test_npy_shapes_numpy_refuses_are_invalid(name: str) -> None:
    shape, descr, fortran = NPY_CASES[name]
    data = _npy(shape, descr, fortran)
    assert _np_load_error(data) is not None, "numpy must refuse the oracle case"
    report = _scan(data, "a.npy")
    assert report.verdict == "invalid"
    assert Code.NPY_BAD_HEADER in _codes(report)
    assert report.tensors == []
    assert report.weights_only.loadable is False
    assert all(-2**63 <= i <= INT64_MAX for i in _json_ints(report))
    assert all(len(f.message) < 2000 for f in report.findings)


@pytest.mark.parametrize("name", sorted(NPY_OK))
def test_npy_shapes_numpy_builds_stay_safe(name: str) -> None:
    shape, descr, fortran = NPY_OK[name]
    data = _npy(shape, descr, fortran)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    report = _scan(data, "a.npy")
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    (t,) = report.tensors
    assert t.shape == list(arr.shape)
    assert all(-2**63 <= i <= INT64_MAX for i in _json_ints(report))


def test_npy_messages_are_numpys_words() -> None:
    cases = {
        f"(0, {BIG}, {BIG})": "Python int too large to convert to C long",
        "(0," + " 1," * 64 + ")": "maximum supported dimension for an ndarray is currently 64, "
                                  "found 65",
        f"(0, {2**62}, {2**62})": "array is too big",
    }
    for shape, words in cases.items():
        data = _npy(shape)
        numpy_error = _np_load_error(data)
        assert numpy_error is not None and words in numpy_error
        report = _scan(data, "a.npy")
        assert any(words in f.message for f in report.findings), report.findings


def test_npy_object_array_with_65_dims_is_still_an_object_array() -> None:
    # numpy checks the object dtype before it builds the shape: its pickle is what matters
    data = _npy("(1," + " 1," * 64 + ")", "'|O'", data=b"\x80\x04N.")
    report = _scan(data, "o.npy")
    assert Code.NPY_OBJECT_ARRAY in _codes(report)
    json.dumps(report.to_json())


# --- .npz: total header budget --------------------------------------------------------------------

def _wide_member(ndim: int) -> bytes:
    return _npy("(0," + " 9," * (ndim - 1) + ")")


def test_npz_of_3290_dim_members_is_invalid_and_json_safe() -> None:
    data = npz_from_members({f"{i}.npy": _wide_member(3290) for i in range(3)}, compress=True)
    report = _scan(data, "w.npz")
    assert report.verdict == "invalid"
    codes = [f.code for f in report.findings]
    assert codes.count(Code.NPY_BAD_HEADER) == 3
    assert report.tensors == []
    assert all(-2**63 <= i <= INT64_MAX for i in _json_ints(report))


def test_npz_header_budget_stops_with_limit_header() -> None:
    member = _npy("(2,)", data=b"\0" * 8)
    hlen = len(member) - 8 - 10
    members = {f"{i}.npy": member for i in range(50)}
    data = npz_from_members(members, compress=True)
    # room for exactly 10 headers: the 11th member stops the scan, fail closed
    report = _scan(data, "b.npz", Limits(max_npy_headers_total=10 * hlen))
    assert report.verdict == "invalid"
    limit = [f for f in report.findings if f.code is Code.LIMIT_HEADER]
    assert len(limit) == 1 and limit[0].record == "10.npy"
    assert len(report.tensors) == 10
    assert report.weights_only.loadable is False
    json.dumps(report.to_json())
    # the same archive under the default budget is fine
    assert _scan(data, "b.npz").verdict == "safe"


def test_npz_header_budget_counts_refused_headers_too() -> None:
    # the wide headers are each refused, but parsing them still costs: the budget stops them
    member = _wide_member(3290)
    data = npz_from_members({f"{i}.npy": member for i in range(20)}, compress=True)
    report = _scan(data, "w.npz", Limits(max_npy_headers_total=5 * len(member)))
    codes = [f.code for f in report.findings]
    assert codes.count(Code.LIMIT_HEADER) == 1
    assert codes.count(Code.NPY_BAD_HEADER) == 5
    assert report.verdict == "invalid"


# --- safetensors: no int beyond int64 in the report -----------------------------------------------

def _st(shape: list[int], dtype: str = "U8", offsets: tuple[int, int] = (0, 0),
        data: bytes = b"") -> bytes:
    return st_file({"t": {"dtype": dtype, "shape": shape, "data_offsets": list(offsets)}}, data)


def _lib(data: bytes) -> Any:
    from safetensors import _safetensors_rust as rust

    try:
        return rust.deserialize(data)
    except Exception as exc:
        return exc


ST_OVERFLOW = {
    "redteam_300_dims": [U64_MAX] * 300,
    "two_dims": [U64_MAX, U64_MAX],
    "overflow_then_zero": [2**40, 2**40, 0],
}


@pytest.mark.parametrize("name", sorted(ST_OVERFLOW))
def test_safetensors_overflowing_shape_keeps_finding_and_no_huge_ints(name: str) -> None:
    data = _st(ST_OVERFLOW[name])
    assert isinstance(_lib(data), Exception)   # the library refuses: overflow
    report = _scan(data, "s.safetensors")
    assert report.verdict == "invalid"
    assert Code.ST_SIZE_MISMATCH in _codes(report)
    assert report.tensors == []                # no byte size, no manifest entry
    assert all(-2**63 <= i <= INT64_MAX for i in _json_ints(report))
    assert all(len(f.message) < 2000 for f in report.findings)


def test_safetensors_30000_dims_is_linear() -> None:
    data = _st([U64_MAX] * 30_000)
    report = _scan(data, "s.safetensors")
    assert report.verdict == "invalid" and report.tensors == []
    assert all(len(f.message) < 2000 for f in report.findings)
    json.dumps(report.to_json())


@pytest.mark.parametrize("shape", [[0, U64_MAX], [0, 2**63], [0, 2**62, 2**62],
                                   [0, 2**40, 2**40, 2**40], [0] + [U64_MAX] * 300])
def test_safetensors_zero_numel_huge_dims_match_the_library_with_small_strides(
        shape: list[int]) -> None:
    # the library accepts these (numel 0; tests/differential keeps acceptance equal): the
    # shape is listed as the library reports it, the strides stop growing at int64
    data = _st(shape)
    lib = _lib(data)
    assert not isinstance(lib, Exception)
    report = _scan(data, "z.safetensors")
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    (t,) = report.tensors
    assert t.shape == list(lib[0][1]["shape"])
    assert len(t.stride) == len(shape)
    assert all(0 <= s <= INT64_MAX for s in t.stride)
    assert all(-2**63 <= i <= U64_MAX for i in _json_ints(report))


def test_safetensors_zero_numel_strides_are_torchs(tmp_path: Any) -> None:
    pytest.importorskip("torch")
    from safetensors import safe_open

    data = _st([0, 2**40, 2**40, 2**40])
    (t,) = _scan(data, "z.safetensors").tensors
    path = tmp_path / "z.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="pt") as f:
        assert t.stride == list(f.get_tensor("t").stride()) == [0, 0, 2**40, 1]


def test_safetensors_offsets_beyond_int64_are_not_in_the_report() -> None:
    data = _st([1], offsets=(U64_MAX - 1, U64_MAX), data=b"x")
    report = _scan(data, "o.safetensors")
    assert report.verdict == "invalid"
    assert Code.ST_BAD_OFFSETS in _codes(report)
    assert report.tensors == []
    assert all(-2**63 <= i <= INT64_MAX for i in _json_ints(report))


def test_safetensors_large_but_int64_shape_stays_listed() -> None:
    data = _st([0, INT64_MAX])
    report = _scan(data, "ok.safetensors")
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    (t,) = report.tensors
    assert t.shape == [0, INT64_MAX] and t.stride == [INT64_MAX, 1]
