"""Differential: our safetensors / NumPy / .pt2 readers against the real libraries.

* safetensors 0.8: acceptance (safe_open and deserialize) equals ours on every fixture and
  on generated headers; for accepted files, names/shapes/dtypes/bytes agree.
* numpy 2.4: `_read_array_header` (read_array_header_1_0/2_0) equals our literal parser's
  result (shape, fortran_order, dtype) or both refuse, on real files and generated headers.
* torch 2.13: the bytes at our .pt2 weight offsets are exactly torch.export.load's tensors.
"""

from __future__ import annotations

import io
import json
import string
import struct
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import CkptError, Effect
from ckptguard.core.formats import npy as npy_fmt
from ckptguard.core.formats import safetensors as st_fmt
from ckptguard.core.io.source import BytesSource
from ckptguard.core.scan import scan_source
from ckptguard.core.state import Analysis
from tests.core.formats.fmt_cases import (
    npy_library_files,
    npy_raw,
    pt2_bytes,
    st_file,
    st_hand_cases,
    st_library_files,
)

# --- safetensors -----------------------------------------------------------------------------

ST_CASES = {**st_library_files(), **st_hand_cases()}


def _lib_accepts(data: bytes, tmp_path: Any = None) -> tuple[bool, Any]:
    from safetensors import _safetensors_rust as rust

    try:
        return True, rust.deserialize(data)
    except Exception as exc:  # SafetensorError or a ValueError from the binding
        return False, str(exc)


def _ours(data: bytes) -> Analysis:
    an = Analysis()
    st_fmt.analyze(BytesSource(data), an)
    return an


def _accepted(an: Analysis) -> bool:
    return not any(f.code.effect is Effect.INVALID for f in an.findings)


def test_enough_safetensors_cases() -> None:
    assert len(ST_CASES) >= 40
    assert sum(k.startswith("bad_") for k in ST_CASES) >= 40


@pytest.mark.parametrize("name", sorted(ST_CASES))
def test_safetensors_acceptance_equals_library(name: str, tmp_path: Any) -> None:
    from safetensors import safe_open

    data = ST_CASES[name]
    ok, detail = _lib_accepts(data)
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
        opened = True
    except Exception:
        opened = False
    assert opened == ok, name
    an = _ours(data)
    assert _accepted(an) == ok, (name, detail, [f.message for f in an.findings])
    if name.startswith(("ok_", "bad_")):
        assert ok == name.startswith("ok_"), (name, detail)
    if ok:
        _same_tensors(data, an, detail)


def _same_tensors(data: bytes, an: Analysis, lib: list[tuple[str, dict[str, Any]]]) -> None:
    ours = {t.name: t for t in an.tensors}
    assert set(ours) == {n for n, _ in lib}
    for name, info in lib:
        t = ours[name]
        assert t.shape == list(info["shape"])
        assert t.data_offset is not None
        assert data[t.data_offset : t.data_offset + t.nbytes] == bytes(info["data"])


_DTYPES = sorted(st_fmt.SAFETENSORS_DTYPE)


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    """Mostly-valid headers with one or two targeted defects."""
    n = draw(st.integers(0, 4))
    tensors: dict[str, Any] = {}
    pos = 0
    for i in range(n):
        dtype = draw(st.sampled_from(_DTYPES))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        bits = st_fmt.SAFETENSORS_DTYPE[dtype][1]
        numel = int(np.prod(shape)) if shape else 1
        size = numel * bits // 8
        begin = pos + draw(st.sampled_from([0, 0, 0, 1, -1]))
        end = begin + size + draw(st.sampled_from([0, 0, 0, 1, -1]))
        tensors[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        pos = begin + size
    if draw(st.booleans()):
        tensors["__metadata__"] = draw(st.dictionaries(st.text(max_size=3), st.one_of(
            st.text(max_size=3), st.integers(0, 3)), max_size=2))
    text = json.dumps(tensors, separators=(",", draw(st.sampled_from([":", ": "]))))
    data_len = max(pos, 0) + draw(st.sampled_from([0, 0, 0, 1]))
    return st_file(text, b"\x5a" * data_len, pad=draw(st.booleans()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_headers())
def test_generated_headers_acceptance_equals_library(data: bytes) -> None:
    ok, detail = _lib_accepts(data)
    an = _ours(data)
    assert _accepted(an) == ok, (data[:300], detail, [f.message for f in an.findings])
    if ok:
        _same_tensors(data, an, detail)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_headers_acceptance_equals_library(data: st.DataObject) -> None:
    base = data.draw(st.sampled_from(sorted(ST_CASES)))
    buf = bytearray(ST_CASES[base])
    for _ in range(data.draw(st.integers(1, 3))):
        if len(buf) <= 8:
            break
        pos = data.draw(st.integers(8, min(len(buf) - 1, 300)))
        buf[pos] = data.draw(st.sampled_from(b'{}[]",:0123456789 -.eE\\tnulfs\x00\xff'))
    ok, detail = _lib_accepts(bytes(buf))
    an = _ours(bytes(buf))
    assert _accepted(an) == ok, (bytes(buf[:200]), detail, [f.message for f in an.findings])


# --- numpy ------------------------------------------------------------------------------------

def _numpy_header(data: bytes) -> tuple[str, Any]:
    from numpy.lib import _format_impl as fmt

    f = io.BytesIO(data)
    try:
        version = fmt.read_magic(f)
        fmt._check_version(version)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                shape, fortran, dtype = fmt._read_array_header(f, version)
    except Exception as exc:
        return "err", type(exc).__name__
    return "ok", (tuple(shape), fortran, dtype)


def _our_header(data: bytes) -> tuple[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h = npy_fmt.read_npy_header(BytesSource(data), 10_000)
    except CkptError as exc:
        return "err", exc.code
    return "ok", (h.shape, h.fortran_order, h.dtype)


def _assert_same_header(data: bytes) -> None:
    theirs, ours = _numpy_header(data), _our_header(data)
    assert theirs[0] == ours[0], (data[:200], theirs, ours)
    if theirs[0] == "ok":
        assert theirs[1] == ours[1], (data[:200], theirs, ours)


@pytest.mark.parametrize("name", sorted(npy_library_files()))
def test_numpy_header_of_library_files(name: str) -> None:
    _assert_same_header(npy_library_files()[name])


_DESCRS = ["'<f4'", "'>i8'", "'|b1'", "'<U3'", "'|S5'", "'|O'", "'<M8[ns]'", "'f8'", "'float32'",
           "'xyz'", "''", "[('a', '<i4'), ('b', '<f8', (2,))]", "[('', '|V4'), ('x', '<u2')]",
           "[(('t', 'n'), '<f2')]", "('<f4', (2, 3))", "[('a',)]", "3", "None", "[('a', 'zz')]",
           "'<c16'", "'V8'", "[('a', [('b', '<i2')])]", "b'<f4'", "u'<f4'", "'<f' '4'"]
_SHAPES = ["()", "(3,)", "(2, 3)", "(0,)", "(-1,)", "[3]", "(3)", "(True,)", "(1.0,)", "(2L,)",
           "(0x3,)", "(1_0,)", "(+2,)", "(-0,)", "None", "(3, )", "((3,),)"]
_FORTRAN = ["False", "True", "0", "None", "'False'"]


@st.composite
def _npy_headers(draw: st.DrawFn) -> bytes:
    keys = draw(st.permutations(["descr", "fortran_order", "shape"]))
    values = {"descr": draw(st.sampled_from(_DESCRS)), "shape": draw(st.sampled_from(_SHAPES)),
              "fortran_order": draw(st.sampled_from(_FORTRAN))}
    if draw(st.integers(0, 9)) == 0:
        keys = keys[:2]
    if draw(st.integers(0, 9)) == 0:
        keys = [*keys, "extra"]
        values["extra"] = "1"
    q = draw(st.sampled_from(["'", '"']))
    sep = draw(st.sampled_from([", ", ",", " ,\n "]))
    body = sep.join(f"{q}{k}{q}: {values[k]}" for k in keys)
    text = "{" + body + draw(st.sampled_from(["", ", ", ","])) + "}"
    text = draw(st.sampled_from(["", " ", "\n", "# c\n"])) + text
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0)]))
    return npy_raw(text, b"\0" * 64, version=version, align=draw(st.booleans()))


@settings(max_examples=400, deadline=None)
@given(_npy_headers())
def test_generated_npy_headers_equal_numpy(data: bytes) -> None:
    _assert_same_header(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_npy_headers_equal_numpy(data: st.DataObject) -> None:
    files = npy_library_files()
    base = bytearray(files[data.draw(st.sampled_from(sorted(k for k in files if k != "huge_header")))])
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, min(len(base) - 1, 200)))
        base[pos] = ord(data.draw(st.sampled_from(string.printable + "\x00\xff")))
    _assert_same_header(bytes(base))


# --- torch.export -----------------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(("name", "decompose"), [("full", False), ("tied", False), ("conv", True),
                                                 ("full", True)])
def test_pt2_weights_equal_torch_export_load(name: str, decompose: bool) -> None:
    import torch

    data = pt2_bytes(name, decompose=decompose)
    report = scan_source(BytesSource(data))
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    ep = torch.export.load(io.BytesIO(data))
    loaded = {**ep.state_dict, **ep.constants}
    ours = {t.name: t for t in report.tensors}
    assert set(ours) == set(loaded)
    for fqn, tensor in loaded.items():
        t = ours[fqn]
        assert t.dtype == str(tensor.dtype).removeprefix("torch.")
        assert t.shape == list(tensor.shape) and t.stride == list(tensor.stride())
        assert t.requires_grad == tensor.requires_grad
        assert (t.kind == "parameter") == isinstance(tensor, torch.nn.Parameter)
        assert t.data_offset is not None
        span = data[t.data_offset : t.data_offset + t.nbytes]
        flat = torch.frombuffer(bytearray(span), dtype=tensor.dtype) if span else \
            torch.empty(0, dtype=tensor.dtype)
        view = torch.as_strided(flat, t.shape, t.stride, 0)
        assert torch.equal(view, tensor.detach()), fqn


def test_st_file_helper_is_what_the_library_writes() -> None:
    from safetensors.numpy import save

    data = save({"a": np.zeros(2, np.float32)})
    (n,) = struct.unpack_from("<Q", data)
    assert st_file(data[8 : 8 + n], data[8 + n :]) == data


@pytest.mark.torch
@pytest.mark.slow
def test_pt2_verifier_edits_are_refused_by_torch_too() -> None:
    """Every program edit our verifier flags makes torch.export.load fail as well."""
    import logging

    import torch

    from tests.core.formats.test_torch_export_format import VERIFIER_EDITS, edit_json

    base = pt2_bytes("full")
    logging.disable(logging.CRITICAL)
    try:
        for rel, edit, rule in VERIFIER_EDITS:
            data = edit_json(base, rel, edit)
            report = scan_source(BytesSource(data))
            assert any(f.message.startswith(f"[{rule}]") for f in report.findings), edit.__name__
            with warnings.catch_warnings(), pytest.raises(Exception):  # noqa: B017
                warnings.simplefilter("ignore")
                torch.export.load(io.BytesIO(data))
    finally:
        logging.disable(logging.NOTSET)
