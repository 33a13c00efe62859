"""Shared inputs for the format tests: real-library files and hand-made corrupt ones.

Imported by tests/core/formats, tests/differential and tests/property (torch only inside
the functions that need it, so the property tests stay fast to import).
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from functools import lru_cache
from typing import Any

import numpy as np

# --- safetensors -------------------------------------------------------------------------

def st_file(header: str | bytes | dict[str, Any], data: bytes = b"", *, pad: bool = False) -> bytes:
    """u64 length + header + data; dict headers are JSON-encoded (optionally space-padded)."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    hb = header.encode() if isinstance(header, str) else header
    if pad:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def _t(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@lru_cache(maxsize=1)
def st_library_files() -> dict[str, bytes]:
    """Files written by safetensors.numpy.save (and safetensors.torch when available)."""
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    out: dict[str, bytes] = {
        "np_mixed": save({"w": rng.standard_normal((3, 4)).astype(np.float32),
                          "b": np.arange(5, dtype=np.int64), "m": np.array([True, False]),
                          "h": np.ones((2, 2), np.float16), "u": np.arange(3, dtype=np.uint16)}),
        "np_meta": save({"x": np.zeros((0, 3), np.float64)}, metadata={"format": "np", "k": "v"}),
        "np_empty": save({}),
        "np_scalar": save({"s": np.array(3.5, np.float32)}),
        "np_complex": save({"c": np.ones(3, np.complex64), "i8": np.arange(4, dtype=np.int8)}),
    }
    try:
        import torch
        from safetensors.torch import save as tsave
    except ImportError:  # pragma: no cover - torch is a test dependency
        return out
    out["torch_mixed"] = tsave({
        "bf": torch.ones(3, dtype=torch.bfloat16), "f8": torch.zeros(4, dtype=torch.float8_e4m3fn),
        "f8b": torch.zeros(2, dtype=torch.float8_e5m2), "f": torch.arange(6.0).view(2, 3),
        "l": torch.arange(3), "u8": torch.ones(1, dtype=torch.uint8)}, metadata={"format": "pt"})
    out["torch_big_names"] = tsave({f"layer.{i}.weight": torch.full((i + 1,), float(i))
                                    for i in range(12)})
    return out


@lru_cache(maxsize=1)
def st_hand_cases() -> dict[str, bytes]:
    """Hand-made headers probing every rule (FORMATS.md §6) and serde's quirks."""
    f4 = b"\0" * 4
    one = {"a": _t("F32", [1], 0, 4)}
    c: dict[str, bytes] = {
        "ok_min": st_file(one, f4),
        "ok_unpadded": st_file('{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', b"abc"),
        "ok_leading_ws": st_file(' \n\t{}'),
        "ok_trailing_ws": st_file('{}\t\r\n '),
        "ok_empty_obj": st_file("{}"),
        "ok_unknown_field": st_file({"a": {**_t("F32", [1], 0, 4), "x": [1, {"y": None}]}}, f4),
        "ok_empty_tensor": st_file({"a": _t("F32", [0, 5], 0, 0), "b": _t("U8", [2], 0, 2)}, b"xy"),
        "ok_seq_tensor": st_file('{"a":["F32",[1],[0,4]]}', f4),
        "ok_dtype_map": st_file('{"a":{"dtype":{"F32":null},"shape":[1],"data_offsets":[0,4]}}', f4),
        "ok_meta_null": st_file('{"__metadata__":null}'),
        "ok_meta": st_file({"__metadata__": {"a": "b", "": ""}, **one}, f4),
        "ok_dup_name_same": st_file('{"a":' + json.dumps(_t("F32", [1], 0, 4)) + ',"a":'
                                    + json.dumps(_t("F32", [1], 0, 4)) + "}", f4),
        "ok_dup_unknown_field": st_file('{"a":{"dtype":"F32","x":1,"x":2,"shape":[1],'
                                        '"data_offsets":[0,4]}}', f4),
        "ok_empty_name": st_file({"": _t("F32", [1], 0, 4)}, f4),
        "ok_escaped_dtype": st_file('{"a":{"dtype":"F\\u0033\\u0032","shape":[1],"data_offsets":[0,4]}}', f4),
        "ok_escaped_meta_key": st_file('{"__meta\\u0064ata__":{}}'),
        "ok_surrogate_pair": st_file('{"__metadata__":{"\\ud83d\\ude00":"x"}}'),
        "ok_f4_even": st_file({"a": _t("F4", [4], 0, 2)}, b"\0\0"),
        "ok_f6": st_file({"a": _t("F6_E2M3", [4], 0, 3)}, b"\0\0\0"),
        "ok_scalar": st_file({"a": _t("F64", [], 0, 8)}, b"\0" * 8),
        "ok_zero_then_huge": st_file({"a": _t("F64", [0, 2**64 - 1, 2], 0, 0)}),
        "ok_unordered": st_file({"b": _t("U8", [1], 1, 2), "a": _t("U8", [1], 0, 1)}, b"ab"),
        "ok_depth_127": st_file('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":'
                                + "[" * 125 + "]" * 125 + "}}"),
        "ok_del_char": st_file('{"__metadata__":{"a\x7f":"b"}}'),
        "ok_all_dtypes": _all_dtypes(),
        "bad_too_small": b"\x02\0\0",
        "bad_empty_file": b"",
        "bad_too_large": struct.pack("<Q", 100_000_001) + b"{}",
        "bad_len_past_end": struct.pack("<Q", 50) + b"{}",
        "bad_len_u64_max": struct.pack("<Q", 2**64 - 1) + b"{}",
        "bad_utf8": st_file(b'{"__metadata__":{"\xff":"x"}}'),
        "bad_bom": st_file("\ufeff{}"),
        "bad_trailing_junk": st_file("{} x"),
        "bad_nul": st_file("{}\0"),
        "bad_array_top": st_file("[]"),
        "bad_nan": st_file('{"__metadata__":{"a":NaN}}'),
        "bad_meta_int": st_file('{"__metadata__":{"a":1}}'),
        "bad_meta_null_value": st_file('{"__metadata__":{"a":null}}'),
        "bad_meta_seq": st_file('{"__metadata__":[]}'),
        "bad_meta_dup": st_file('{"__metadata__":{},"__metadata__":{}}'),
        "bad_dup_field": st_file('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', f4),
        "bad_dup_name_moves": st_file('{"a":' + json.dumps(_t("F32", [1], 0, 4)) + ',"a":'
                                      + json.dumps(_t("F32", [1], 4, 8)) + "}", b"\0" * 8),
        "bad_lone_surrogate": st_file('{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', f4),
        "bad_lone_trailing_surrogate": st_file('{"__metadata__":{"\\udc00":"x"}}'),
        "bad_neg_zero": st_file('{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}'),
        "bad_float_shape": st_file('{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', f4),
        "bad_exp_shape": st_file('{"a":{"dtype":"U8","shape":[1e2],"data_offsets":[0,100]}}', b"\0" * 100),
        "bad_bool_shape": st_file('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', f4),
        "bad_shape_str": st_file('{"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}}', f4),
        "bad_big_int": st_file('{"a":{"dtype":"F32","shape":[18446744073709551616],'
                               '"data_offsets":[0,4]}}', f4),
        "bad_neg_offset": st_file('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}', b"\0"),
        "bad_offsets_3": st_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}', f4),
        "bad_offsets_map": st_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":{"0":0,"1":4}}}', f4),
        "bad_seq_4": st_file('{"a":["F32",[1],[0,4],1]}', f4),
        "bad_tensor_null": st_file('{"a":null}'),
        "bad_tensor_empty": st_file('{"a":{}}'),
        "bad_missing_shape": st_file('{"a":{"dtype":"F32","data_offsets":[0,4]}}', f4),
        "bad_dtype_lower": st_file({"a": _t("f32", [1], 0, 4)}, f4),
        "bad_dtype_unknown": st_file({"a": _t("F128", [1], 0, 16)}, b"\0" * 16),
        "bad_dtype_map_value": st_file('{"a":{"dtype":{"F32":1},"shape":[1],"data_offsets":[0,4]}}', f4),
        "bad_dtype_int": st_file('{"a":{"dtype":17,"shape":[1],"data_offsets":[0,4]}}', f4),
        "bad_trailing_data": st_file("{}", b"x"),
        "bad_short_data": st_file(one, b"\0" * 3),
        "bad_hole": st_file({"a": _t("U8", [1], 0, 1), "b": _t("U8", [1], 2, 3)}, b"abc"),
        "bad_overlap": st_file({"a": _t("U8", [2], 0, 2), "b": _t("U8", [2], 1, 3)}, b"abc"),
        "bad_first_not_zero": st_file({"a": _t("U8", [1], 1, 2)}, b"ab"),
        "bad_end_before_begin": st_file({"a": _t("F32", [0], 0, 0), "b": _t("F32", [1], 4, 0)}, f4),
        "bad_size_mismatch": st_file({"a": _t("F32", [2], 0, 4)}, f4),
        "bad_overflow": st_file({"a": _t("F32", [2**32, 2**32], 0, 4)}, f4),
        "bad_overflow_bits": st_file({"a": _t("U8", [2**64 - 1], 0, 0)}),
        "bad_f4_odd": st_file({"a": _t("F4", [3], 0, 2)}, b"\0\0"),
        "bad_depth_128": st_file('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":'
                                 + "[" * 126 + "]" * 126 + "}}"),
        "bad_ctrl_char": st_file('{"__metadata__":{"a\x01":"b"}}'),
        "bad_empty_header": st_file(""),
        "bad_infinity": st_file('{"a":{"dtype":"F32","shape":[Infinity],"data_offsets":[0,4]}}', f4),
        "bad_leading_zero": st_file('{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', f4),
    }
    return c


def _all_dtypes() -> bytes:
    from ckptguard.core.torch.dtypes import SAFETENSORS_DTYPE

    header: dict[str, Any] = {}
    pos = 0
    for tag, (_, bits) in SAFETENSORS_DTYPE.items():
        n = 8 if bits < 8 else 3
        nbytes = n * bits // 8
        header[tag.lower()] = _t(tag, [n], pos, pos + nbytes)
        pos += nbytes
    return st_file(header, bytes(range(pos % 256)) * (pos // 256) + bytes(range(pos % 256)), pad=True)


# --- numpy ---------------------------------------------------------------------------------

def npy_bytes(arr: Any, **kw: Any) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


def npy_raw(header: str | bytes, data: bytes = b"", *, version: tuple[int, int] = (1, 0),
            align: bool = True) -> bytes:
    """A .npy with an arbitrary header string (padded like numpy's writer when `align`)."""
    hb = header.encode("latin1" if version < (3, 0) else "utf8") if isinstance(header, str) else header
    fmt = "<H" if version == (1, 0) else "<I"
    pre = b"\x93NUMPY" + bytes(version)
    if align:
        total = len(pre) + struct.calcsize(fmt) + len(hb) + 1
        hb = hb + b" " * (-total % 64) + b"\n"
    return pre + struct.pack(fmt, len(hb)) + hb + data


def npy_versioned(arr: Any, version: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


def npz_bytes(arrays: dict[str, Any], *, compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def npz_from_members(members: dict[str, bytes], *, compress: bool = False) -> bytes:
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@lru_cache(maxsize=1)
def npy_library_files() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    rec = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,)), ("c", "S3")])
    return {
        "f32": npy_bytes(rng.standard_normal((4, 5)).astype(np.float32)),
        "i64_scalar": npy_bytes(np.int64(7)),
        "fortran": npy_bytes(np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))),
        "bool": npy_bytes(np.array([True, False, True])),
        "empty": npy_bytes(np.zeros((0, 4), np.int16)),
        "big_endian": npy_bytes(np.arange(4, dtype=">u4")),
        "structured": npy_bytes(rec),
        "unicode": npy_bytes(np.array(["ab", "cde"])),
        "complex": npy_bytes(np.ones(2, np.complex128)),
        "datetime": npy_bytes(np.array(["2020-01-01"], dtype="M8[D]")),
        "huge_header": npy_bytes(np.zeros(3, dtype=[(f"f{i}" * 20, "<i2") for i in range(3000)])),
        "v2": npy_versioned(np.arange(6, dtype=np.int32).reshape(2, 3), (2, 0)),
        "v3_unicode_fields": npy_versioned(np.zeros(2, dtype=[("\u00e9t\u00e9", "<f4"), ("\u4e2d", "u1")]),
                                           (3, 0)),
        "object": npy_bytes(np.array([1, "a", None], dtype=object), allow_pickle=True),
        "object_struct": npy_bytes(np.zeros(2, dtype=[("o", "O"), ("x", "<i4")]), allow_pickle=True),
    }


# --- torch.export .pt2 ------------------------------------------------------------------------

def pt2_modules() -> dict[str, Any]:
    """Small nn.Modules exercising params, persistent/non-persistent buffers, constants,
    tied weights, views, in-place mutation and dynamic shapes. Returns name -> (module, args, dyn)."""
    import torch

    class Full(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)
            self.register_buffer("running", torch.zeros(3))
            self.register_buffer("np_buf", torch.ones(3), persistent=False)
            self.const = torch.tensor([1.0, 2.0, 3.0])

        def forward(self, x: Any) -> Any:
            self.running.add_(1)
            return self.lin(x) + self.np_buf + self.const + self.running

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("view", torch.arange(12, dtype=torch.float64).view(3, 4)[1:, 1:])
            self.register_buffer("h16", torch.ones(2, 2, dtype=torch.float16))
            self.register_buffer("bf", torch.full((3,), 2.5, dtype=torch.bfloat16))
            self.register_buffer("ints", torch.arange(5, dtype=torch.int32))

        def forward(self, idx: Any) -> Any:
            h = self.emb(idx)
            return self.head(h), self.view.sum() + self.h16.float().sum() + self.bf.float().sum() \
                + self.ints.sum()

    class Conv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3)
            self.bn = torch.nn.BatchNorm2d(3)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.bn(self.conv(x)))

    class Cond(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x: Any) -> Any:
            return torch.cond(x.sum() > 0, lambda x: x + self.w, lambda x: x - self.w, (x,))

    batch = torch.export.Dim("batch", min=1, max=64)
    return {
        "full": (Full(), (torch.randn(2, 4),), {"x": {0: batch}}),
        "tied": (Tied(), (torch.tensor([[1, 2, 3]]),), None),
        "conv": (Conv().eval(), (torch.randn(2, 2, 6, 6),), {"x": {0: batch}}),
        "cond": (Cond(), (torch.randn(3),), None),
    }


def pt2_bytes(name: str, *, decompose: bool = False) -> bytes:
    import torch

    module, args, dyn = pt2_modules()[name]
    ep = torch.export.export(module, args, dynamic_shapes=dyn)
    if decompose:
        ep = ep.run_decompositions()
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def zip_replace(data: bytes, replace: dict[str, bytes | None], *, add: dict[str, bytes] | None = None,
                compress: bool = False) -> bytes:
    """Copy a zip, replacing (None: dropping) members by their name after the prefix."""
    src = zipfile.ZipFile(io.BytesIO(data))
    prefix = src.namelist()[0].split("/")[0] + "/"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            rel = info.filename[len(prefix):]
            if rel in replace:
                if replace[rel] is not None:
                    z.writestr(info.filename, replace[rel])  # type: ignore[arg-type]
                continue
            z.writestr(info.filename, src.read(info.filename))
        for rel, payload in (add or {}).items():
            z.writestr(prefix + rel, payload)
    return out.getvalue()


def zip_json(data: bytes, rel: str) -> Any:
    src = zipfile.ZipFile(io.BytesIO(data))
    prefix = src.namelist()[0].split("/")[0] + "/"
    return json.loads(src.read(prefix + rel))


def zip_names(data: bytes) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(data)).namelist()
