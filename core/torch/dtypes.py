"""Tables: torch storage classes, dtype names and item sizes (FORMATS.md §2.3, §5, §6)."""

from __future__ import annotations

# torch dtype name -> bytes per element (sub-byte/packed dtypes count their container byte)
ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "qint8": 1, "qint32": 4, "quint8": 1, "quint4x2": 1, "quint2x4": 1,
    "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2fnuz": 1, "float8_e4m3fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    **{f"uint{n}": 1 for n in range(1, 8)},
    **{f"int{n}": 1 for n in range(1, 8)},
}

# `torch.<X>Storage` (and `torch.cuda.<X>Storage`) -> dtype of its elements
STORAGE_DTYPE: dict[str, str] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
    "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "BFloat16Storage": "bfloat16", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}
CUDA_STORAGES = frozenset(k for k in STORAGE_DTYPE if not k.startswith("Q"))

# Dtypes that torch allowlists as `torch.<name>` globals (FORMATS.md §3.3: 46 names)
TORCH_DTYPE_GLOBALS: frozenset[str] = frozenset(
    ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
     "bool", "complex128", "complex64", "qint8", "qint32", "quint8", "quint4x2", "quint2x4",
     "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
     "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "complex32",
     "uint16", "uint32", "uint64"]
    + [f"uint{n}" for n in range(1, 8)] + [f"int{n}" for n in range(1, 8)]
)

# dtypes whose tensors may require gradients (torch: "floating point and complex dtype"),
# measured with torch 2.13 over every dtype of ITEMSIZE (tests/differential)
FLOATING: frozenset[str] = frozenset(
    ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
     "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
     "float4_e2m1fn_x2"))

# sub-byte quantized dtypes: elements per byte (a quint4x2 tensor of 5 elements holds 3 bytes)
PACKED_PER_BYTE: dict[str, int] = {"quint4x2": 2, "quint2x4": 4}

# storage class globals whose numel counts bytes (FORMATS.md §8.1)
UNTYPED_STORAGES: frozenset[tuple[str, str]] = frozenset(
    (("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage")))

# numpy-compatible dtype strings for reading tensor bytes (ml_dtypes names for the exotic ones)
NUMPY_DTYPE: dict[str, str] = {
    "float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4",
    "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "?", "complex128": "<c16",
    "complex64": "<c8", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "qint8": "i1", "quint8": "u1", "qint32": "<i4",
    "bfloat16": "bfloat16", "float8_e5m2": "float8_e5m2", "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2fnuz": "float8_e5m2fnuz", "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
}

# safetensors dtype tag -> (torch dtype name, bits per element)
SAFETENSORS_DTYPE: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 8), "U8": ("uint8", 8), "I8": ("int8", 8), "I16": ("int16", 16),
    "U16": ("uint16", 16), "F16": ("float16", 16), "BF16": ("bfloat16", 16),
    "I32": ("int32", 32), "U32": ("uint32", 32), "F32": ("float32", 32),
    "C64": ("complex64", 64), "F64": ("float64", 64), "I64": ("int64", 64),
    "U64": ("uint64", 64), "F8_E5M2": ("float8_e5m2", 8), "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8), "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8), "F4": ("float4_e2m1fn", 4),
    "F6_E2M3": ("float6_e2m3fn", 6), "F6_E3M2": ("float6_e3m2fn", 6),
}

# torch.export ScalarType enum (FORMATS.md §5) -> dtype name
EXPORT_SCALAR_TYPE: dict[int, str] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool",
    13: "bfloat16", 28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2",
    31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32",
    35: "uint64",
}


def storage_dtype(module: str, name: str) -> str | None:
    """dtype of a `torch.<X>Storage` / `torch.cuda.<X>Storage` global, else None."""
    if module == "torch" and name in STORAGE_DTYPE:
        return STORAGE_DTYPE[name]
    if module == "torch.cuda" and name in CUDA_STORAGES:
        return STORAGE_DTYPE[name]
    return None

# torch 2.13's device types, in the order its "Expected one of ..." message lists them
DEVICE_TYPES: tuple[str, ...] = (
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia",
    "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone")
# the layouts `torch.serialization._get_layout` knows
LAYOUTS: frozenset[str] = frozenset(
    ("torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
     "torch.sparse_bsr", "torch.sparse_bsc", "torch._mkldnn", "torch.jagged"))
