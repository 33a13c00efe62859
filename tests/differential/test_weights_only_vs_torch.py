"""core.torch.weights_only vs real torch 2.13 (the oracle), on hand-made and torch.save'd pickles.

Every case is written as a torch zip, loaded by `torch.load(path, weights_only=True)` in
one fresh subprocess (the emulated baseline, FORMATS.md §3.2), and emulated. They must
agree on loadable / exception type / message / wrapped text. A case the emulator calls
"Unmodelled" fails the test unless listed in UNMODELLED (then torch must not succeed
silently in a way we claim — we only check we did not claim loadable).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest

from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from ckptguard.core.torch.dtypes import ITEMSIZE, STORAGE_DTYPE
from ckptguard.core.torch.torch_error import TorchError
from ckptguard.core.torch.weights_only import emulate, unsafe_globals
from tests.builders.torchlayout import torch_layout
from tests.core.torch_rules.cases import CASES, Case, Items, call, g, i, ints, od, pid, pk, s, v2
from tests.core.torch_rules.oracle import run_oracle, write_zip, zip_records
from tests.core.torch_rules.subclass import MyTensor

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

_MINIZ_HINT = (". This is an internal miniz error. If you are seeing this error, there is a high "
               "likelihood that your checkpoint file is corrupted. This can happen if the checkpoint "
               "was not saved properly, was transferred incorrectly, or the file was modified after "
               "saving.")


class Records:
    """The StorageResolver the zip format module provides, over a dict of records."""

    def __init__(self, records: dict[str, bytes]) -> None:
        self.records = records

    def check(self, key: str, nbytes: int) -> TorchError | None:
        data = self.records.get(f"data/{key}")
        if data is None:
            return TorchError("RuntimeError",
                              f"PytorchStreamReader failed locating file data/{key}: file not found"
                              + _MINIZ_HINT)
        if len(data) != nbytes:
            return TorchError("RuntimeError", f"record size ({len(data)} bytes) does not match expected "
                              f"size ({nbytes} bytes = {nbytes} elements * 1 bytes/element) for dtype Byte")
        return None


# Cases where the emulator is allowed to answer "Unmodelled" (never "loadable")
UNMODELLED = {"location:meta",
              "rg:v3-str-offset:float32",  # set_()'s TypeError for its arguments is not modelled
              # a quantized meta tensor: torch's NotImplementedError is a dispatcher dump
              *(f"rg:meta:{d}" for d in ("qint8", "qint32", "quint8", "quint4x2", "quint2x4"))}


class _MyT(MyTensor):  # a subclass nobody allowlists (defined in a test module)
    pass


def _v3(dtype: str, rg: str, off: Items | None = None, size: tuple[int, ...] = (2,),
        stride: tuple[int, ...] = (1,)) -> Items:
    """_rebuild_tensor_v3 of a `dtype` view over UntypedStorage "0" (2 elements of `dtype`)."""
    return [g("torch._utils._rebuild_tensor_v3"), "MARK",
            *pid("torch.storage.UntypedStorage", numel=2 * ITEMSIZE[dtype]), *(off or i(0)), *ints(size),
            *ints(stride), rg, *od(), g(f"torch.{dtype}"), "TUPLE", "REDUCE"]


def _requires_grad_cases() -> list[Case]:
    """requires_grad=True on every dtype, through _rebuild_tensor_v2 (dtypes with a storage
    class: the only ones a v2 call can see), _rebuild_tensor_v3 and _rebuild_parameter."""
    out = []
    storage_of = {dtype: name for name, dtype in STORAGE_DTYPE.items()}
    for dtype, size in ITEMSIZE.items():
        recs = {"data/0": b"\0" * 2 * size}   # room for the (2,) view
        if dtype in storage_of:
            out.append(Case(f"rg:v2:{dtype}", pk(*v2(pid(f"torch.{storage_of[dtype]}", numel=2), size=(2,),
                                                     rg="NEWTRUE")), recs))
        out.append(Case(f"rg:v3:{dtype}", pk(*_v3(dtype, "NEWTRUE")), recs))
        out.append(Case(f"rg:param:{dtype}", pk(*call("torch._utils._rebuild_parameter",
                                                      _v3(dtype, "NEWFALSE"), ["NEWTRUE"], od())), recs))
        # a meta tensor takes requires_grad at torch.empty_strided (a meta Parameter's own)
        out.append(Case(f"rg:meta:{dtype}", pk(*call("torch._utils._rebuild_meta_tensor_no_storage",
                                                     [g(f"torch.{dtype}")], ints((2, 3)), ints((3, 1)),
                                                     ["NEWTRUE"]))))
    # v3: torch.empty refuses the dtype before set_() runs; set_() parses its arguments, then
    # refuses the leaf before checking offset, lengths or bounds
    for dtype in ("float32", "int64"):
        views = {"len": _v3(dtype, "NEWTRUE", stride=(1, 1)), "neg-offset": _v3(dtype, "NEWTRUE", off=i(-1)),
                 "bounds": _v3(dtype, "NEWTRUE", size=(9,)), "neg-size": _v3(dtype, "NEWTRUE", size=(-1,)),
                 "empty": _v3(dtype, "NEWTRUE", size=(0,)), "str-offset": _v3(dtype, "NEWTRUE", off=s("x"))}
        for name, items in views.items():
            out.append(Case(f"rg:v3-{name}:{dtype}", pk(*items), {"data/0": b"\0" * 2 * ITEMSIZE[dtype]}))
    # the Parameter rule is the dtype's, whatever rebuilt the data
    qt = call("torch._utils._rebuild_qtensor", pid("torch.QUInt8Storage", numel=4), i(0), ints((4,)),
              ints((1,)), ["MARK", g("torch.per_tensor_affine"), ("BINFLOAT", 0.5), *i(3), "TUPLE"],
              ["NEWFALSE"], od())
    param = call("torch._utils._rebuild_parameter", qt, ["NEWTRUE"], od())
    out.append(Case("rg:param-qtensor:quint8", pk(*param), {"data/0": b"\0" * 4}))
    for dtype in ("float8_e4m3fn", "uint32"):
        meta = call("torch._utils._rebuild_meta_tensor_no_storage", [g(f"torch.{dtype}")], ints((2,)),
                    ints((1,)), ["NEWFALSE"])
        out.append(Case(f"rg:param-meta:{dtype}", pk(*call("torch._utils._rebuild_parameter", meta,
                                                           ["NEWTRUE"], od()))))
        state = call("torch._utils._rebuild_parameter_with_state", _v3(dtype, "NEWFALSE"), ["NEWTRUE"], od(),
                     ["NONE"])
        out.append(Case(f"rg:param-state:{dtype}", pk(*state), {"data/0": b"\0" * 2 * ITEMSIZE[dtype]}))
    return out


RG_CASES = _requires_grad_cases()


def _saved_cases(tmp: Path) -> list[Case]:
    import argparse

    import numpy as np

    t = torch.arange(6, dtype=torch.float32).view(2, 3)
    p = torch.nn.Parameter(torch.ones(3))
    p_attr = torch.nn.Parameter(torch.ones(2))
    p_attr.note = "x"  # type: ignore[attr-defined]
    t_attr = torch.ones(2)
    t_attr.extra = 1  # type: ignore[attr-defined]
    objs: dict[str, Any] = {
        "state_dict": torch.nn.Linear(3, 2).state_dict(),
        "nested": {"a": [t, (t[1], {"b": t[:, 1]})], "n": None, 1: 2.5, "s": "x"},
        "bytes": b"abc\xff",
        "bytes-empty": b"",
        "bytearray": bytearray(b"xy"),
        "set": {1, 2, "a"},
        "frozenset": frozenset({1}),
        "complex": 1 + 2j,
        "param": p,
        "param-attr": p_attr,
        "tensor-attr": t_attr,
        "dtype": torch.float32,
        "torch.float": torch.float,
        "device": torch.device("cpu"),
        "size": torch.Size((2, 3)),
        "layout": torch.sparse_coo,
        "qscheme": torch.per_tensor_affine,
        "dtypes-all": [torch.bfloat16, torch.float8_e4m3fn, torch.uint16, torch.complex32],
        "v3": [torch.zeros(3, dtype=torch.uint16), torch.zeros(2, dtype=torch.float8_e5m2)],
        "int-tensors": [torch.arange(4, dtype=torch.int64), torch.zeros(2, dtype=torch.bool),
                        torch.zeros(3, dtype=torch.complex64)],
        "empty-tensor": torch.empty(0, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "conj": torch.tensor([1 + 1j]).conj(),
        "ordered": __import__("collections").OrderedDict(a=1),
        "counter": __import__("collections").Counter("aab"),
        "quantized": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8),
        "qchannel": torch.quantize_per_channel(torch.ones(2, 2), torch.tensor([0.1, 0.2]),
                                               torch.tensor([0, 0]), 0, torch.qint8),
        "sparse": torch.ones(2, 2).to_sparse(),
        "sparse-csr": torch.ones(2, 2).to_sparse_csr(),
        "subclass": torch.ones(2).as_subclass(_MyT),
        "subclass-allowed": torch.ones(2).as_subclass(MyTensor),
        "namespace": argparse.Namespace(a=1),
        "namespace-allowed": argparse.Namespace(a=1),
        "numpy": np.arange(3),
        "meta": torch.empty(2, device="meta"),
        "optimizer": _optimizer_state(),
        "dtype-views": [torch.arange(4, dtype=torch.float32).view(torch.int32)[1:],
                        torch.arange(8, dtype=torch.int16)[::3]],
        "channels-last": torch.ones(1, 2, 3, 3).to(memory_format=torch.channels_last),
        "transposed-expanded": [torch.ones(2, 3).t(), torch.ones(3, 1).expand(3, 4)],
        "requires-grad": torch.ones(2, requires_grad=True),
        "uint-fp8": [torch.zeros(2, dtype=torch.uint32), torch.zeros(2, dtype=torch.float8_e4m3fnuz),
                     torch.zeros(2, dtype=torch.complex32)],
        "neg": torch.tensor([1.0, 2.0])._neg_view(),
        "slice": slice(1, 2),
        "range": range(3),
    }
    out = []
    for name, obj in objs.items():
        buf = io.BytesIO()
        torch.save(obj, buf)
        pkl, recs = zip_records_from_bytes(buf.getvalue(), tmp / f"save-{name}.pt")
        allow = {"namespace-allowed": ["argparse.Namespace"],
                 "subclass-allowed": ["tests.core.torch_rules.subclass.MyTensor"]}.get(name, [])
        out.append(Case(f"save:{name}", pkl, recs, allow))
    for name, obj, allow in _allowlisted_objects():
        buf = io.BytesIO()
        torch.save(obj, buf)
        pkl, recs = zip_records_from_bytes(buf.getvalue(), tmp / f"save-{name}.pt")
        out.append(Case(f"save:{name}", pkl, recs, allow))
    return out


_REC = "numpy._core.multiarray._reconstruct"
_ARR = [_REC, "numpy.ndarray", "numpy.dtype"]
_SCALAR = ["numpy._core.multiarray.scalar", "numpy.dtype"]


def _allowlisted_objects() -> list[tuple[str, Any, list[str]]]:
    """numpy values, defaultdict/deque/partial and non-cpu devices, each with the allowlist a
    user reaches by adding the globals torch asks for one by one: the step where torch
    refuses to BUILD a numpy DType it does not know, then the full list (torch loads it)."""
    import collections
    import functools

    import numpy as np

    rng = {"w": torch.ones(2), "np_rng": np.random.RandomState(0).get_state()}
    numpy_objs: list[tuple[str, Any, list[str], str]] = [
        ("np-rng", rng, _ARR, "UInt32DType"),
        ("np-float32", np.float32(1.0), _SCALAR, "Float32DType"),
        ("np-int64", np.int64(3), _SCALAR, "Int64DType"),
        ("np-bool", np.bool_(True), _SCALAR, "BoolDType"),
        ("np-float16-array", np.ones(3, dtype=np.float16), _ARR, "Float16DType"),
        ("np-object-array", np.array([1, "a", None], dtype=object), _ARR, "ObjectDType"),
        ("np-bytes-array", np.array([b"ab", b"c"]), _ARR, "BytesDType"),
        ("np-str-array", np.array(["ab", "c"]), _ARR, "StrDType"),
        ("np-complex-array", np.ones((2, 2), dtype=np.complex64), _ARR, "Complex64DType"),
        ("np-dtype", np.dtype("f4"), ["numpy.dtype"], "Float32DType"),
        ("np-dtype-big-endian", np.dtype(">u4"), ["numpy.dtype"], "UInt32DType"),
        ("np-dtype-void", np.dtype("V8"), ["numpy.dtype"], "VoidDType"),
    ]
    out: list[tuple[str, Any, list[str]]] = []
    for name, obj, base, dtype_class in numpy_objs:
        out.append((f"{name}:no-dtype-class", obj, base))
        out.append((f"{name}:allowed", obj, [*base, f"numpy.dtypes.{dtype_class}"]))
    out += [("defaultdict-allowed", collections.defaultdict(list, a=[1]), ["collections.defaultdict",
                                                                           "builtins.list"]),
            ("defaultdict-none", collections.defaultdict(None, a=1), ["collections.defaultdict"]),
            ("deque-allowed", collections.deque([1, 2]), ["collections.deque"]),
            ("partial-allowed", functools.partial(max, 1), ["functools.partial", "builtins.max"])]
    for dev in ("xpu:0", "xpu", "hpu", "xla:1", "mtia:0", "ipu", "privateuseone:0", "lazy", "ve:3",
                "maia", "vulkan", "hip:1", "fpga", "opengl", "opencl", "ideep"):
        out.append((f"device-{dev}", {"w": torch.ones(2), "device": torch.device(dev)}, []))
    return out


def _device_cases() -> list[Case]:
    """torch.device(...) calls torch.save never writes: bad strings, index types and values."""
    calls: dict[str, Items] = {
        "cpu:-1": s("cpu:-1"), "cuda:x": s("cuda:x"), "foo:0": s("foo:0"),
        "xpu:01": s("xpu:01"), "cpu0": s("cpu0"), "empty": s(""), "xla:2147483648": s("xla:2147483648"),
        "xpu:255": s("xpu:255"), "xpu,-1": [*s("xpu"), *i(-1)], "cpu,-1": [*s("cpu"), *i(-1)],
        "xpu:0,1": [*s("xpu:0"), *i(1)], "xpu:0,None": [*s("xpu:0"), "NONE"], "hpu,None": [*s("hpu"), "NONE"],
        "mtia,True": [*s("mtia"), "NEWTRUE"], "xpu,1.0": [*s("xpu"), ("BINFLOAT", 1.0)],
        "xpu,'0'": [*s("xpu"), *s("0")], "cpu,1,2": [*s("cpu"), *i(1), *i(2)], "None": ["NONE"],
        "1.5": [("BINFLOAT", 1.5)], "[]": ["EMPTY_LIST"], "1,cpu": [*i(1), *s("cpu")],
        "privateuseone,7": [*s("privateuseone"), *i(7)], "xpu,2**63": [*s("xpu"), ("LONG1", 1 << 63)],
        "xla,2**63-1": [*s("xla"), ("LONG1", (1 << 63) - 1)],
    }
    return [Case(f"device-call:{name}", pk(*call("torch.device", items))) for name, items in calls.items()]


DEVICE_CASES = _device_cases()


def _optimizer_state() -> Any:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}


def zip_records_from_bytes(data: bytes, path: Path) -> tuple[bytes, dict[str, bytes]]:
    path.write_bytes(data)
    return zip_records(path)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("wo")
    cases = CASES + RG_CASES + DEVICE_CASES + _saved_cases(tmp)
    jobs: list[dict[str, Any]] = []
    for n, case in enumerate(cases):
        path = write_zip(tmp / f"case{n}.pt", case.pkl, case.records)
        jobs.append({"path": str(path), "allow": case.allow, "mode": "load"})
        jobs.append({"path": str(path), "allow": case.allow, "mode": "unsafe"})
    results = run_oracle(jobs, tmp)
    return {c.name: (c, results[2 * k], results[2 * k + 1]) for k, c in enumerate(cases)}


ALL_NAMES = [c.name for c in CASES + RG_CASES + DEVICE_CASES] + [f"save:{n}" for n in (
    "state_dict", "nested", "bytes", "bytes-empty", "bytearray", "set", "frozenset", "complex", "param",
    "param-attr", "tensor-attr", "dtype", "torch.float", "device", "size", "layout", "qscheme",
    "dtypes-all", "v3", "int-tensors", "empty-tensor", "scalar", "conj", "ordered", "counter",
    "quantized", "qchannel", "sparse", "sparse-csr", "subclass", "subclass-allowed", "namespace",
    "namespace-allowed",
    "numpy", "meta", "slice", "range", "optimizer", "dtype-views", "channels-last", "transposed-expanded",
    "requires-grad", "uint-fp8", "neg")] + [f"save:{n}" for n, _, _ in _allowlisted_objects()]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_emulate_matches_torch_load(oracle: dict[str, Any], name: str) -> None:
    case, want, _ = oracle[name]
    got = emulate(case.pkl, allow=frozenset(case.allow), resolver=Records(case.records))
    if got.error is not None and got.error.type == "Unmodelled":
        assert name in UNMODELLED, f"{name}: {got.error.message} (torch: {want})"
        return
    assert name not in UNMODELLED or got.loadable == want["ok"], name
    assert got.loadable == want["ok"], (name, got.error, want)
    if not want["ok"]:
        assert got.error is not None
        assert got.error.type == want["type"], (name, got.error, want)
        assert got.error.wrapped() == want["msg"], (name, got.error, want)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_unsafe_globals_match_torch(oracle: dict[str, Any], name: str) -> None:
    case, _, want = oracle[name]
    got = unsafe_globals(case.pkl, frozenset(case.allow))
    if want["ok"]:
        assert got == want["globals"], name
    else:
        assert isinstance(got, TorchError), (name, got, want)
        assert (got.type, got.message) == (want["type"], want["msg"]), name


@pytest.mark.parametrize("name", [c.name for c in RG_CASES])
def test_scan_matches_torch_load_on_requires_grad(oracle: dict[str, Any], name: str,
                                                   tmp_path: Path) -> None:
    """The whole scan, C-speed paths included, in both archive layouts: zipfile's (the
    general path's fast path takes it) and torch's writer layout (the fast lane's)."""
    case, want, _ = oracle[name]
    storages = [(k.removeprefix("data/"), b) for k, b in case.records.items()]
    zipped = write_zip(tmp_path / "zipfile.pt", case.pkl, case.records)
    laid_out = tmp_path / "torch.pt"
    laid_out.write_bytes(torch_layout("archive", case.pkl, storages))
    for path in (zipped, laid_out):
        wo = scan_path(path, options=ScanOptions(allow=frozenset(case.allow))).weights_only
        if wo.error_type == "Unmodelled":
            assert name in UNMODELLED, (name, path.name, wo)
            continue
        assert wo.loadable == want["ok"], (name, path.name, wo, want)
        if not want["ok"]:
            assert (wo.error_type, wo.error) == (want["type"], want["msg"].splitlines()[0]), \
                (name, path.name, wo, want)


def test_baseline_user_globals_match_fresh_import(tmp_path: Path) -> None:
    """A fresh `import torch` puts exactly BASELINE_USER_GLOBALS in the user safe set (§3.2)."""
    from ckptguard.core.torch.allowlist import BASELINE_USER_GLOBALS

    [res] = run_oracle([{"path": "", "mode": "baseline"}], tmp_path)
    assert res["ok"] and set(res["globals"]) == BASELINE_USER_GLOBALS


def test_tensor_descriptor_list_matches_torch() -> None:
    """setattr on these is not a plain store; the emulator refuses to model it."""
    import inspect

    from ckptguard.core.torch.callables import TENSOR_DESCRIPTORS

    names = set()
    for cls in (torch.Tensor, torch.nn.Parameter):
        for k in dir(cls):
            v = inspect.getattr_static(cls, k)
            if hasattr(type(v), "__set__") or hasattr(type(v), "__delete__"):
                names.add(k)
    assert names == TENSOR_DESCRIPTORS


def test_allowed_globals_match_torch() -> None:
    from torch._weights_only_unpickler import _get_allowed_globals

    from ckptguard.core.torch.allowlist import ALLOWED_GLOBALS
    from ckptguard.core.torch.callables import global_kind

    allowed = _get_allowed_globals()
    assert set(allowed) == ALLOWED_GLOBALS
    for name, obj in allowed.items():
        assert f"<class '{global_kind(name)}'>" == str(type(obj)), name


# -- legacy (non-zip) streams: magic, protocol, sys_info, main object (FORMATS.md §4.1) -----

def _legacy_pickles(data: bytes) -> list[tuple[int, Any]]:
    """(start, emulate result) for the four leading pickles of a legacy stream."""
    out = []
    pos = 0
    for _ in range(4):
        res = emulate(memoryview(data)[pos:], legacy=True, base_offset=pos)
        out.append((pos, res))
        if not res.loadable:
            break
        pos += res.end
    return out


def _legacy_saved() -> dict[str, bytes]:
    import argparse

    objs: dict[str, Any] = {
        "state_dict": torch.nn.Linear(3, 2).state_dict(),
        "tensors": [torch.arange(6.0).view(2, 3)[1], torch.zeros(2, dtype=torch.int64), torch.ones(0)],
        "param": torch.nn.Parameter(torch.ones(2)),
        "uint16": torch.zeros(2, dtype=torch.uint16),
        "namespace": argparse.Namespace(a=1),
        "plain": {"a": [1, 2.5, "x", None, True]},
        "bytes": b"xyz",
    }
    out = {}
    for name, obj in objs.items():
        buf = io.BytesIO()
        torch.save(obj, buf, _use_new_zipfile_serialization=False)
        out[name] = buf.getvalue()
    return out


def _legacy_stream(main: bytes, storages: list[tuple[str, int, bytes]]) -> bytes:
    """magic + protocol + sys_info + `main` + sorted keys + per key (int64 numel + data)."""
    sys_info = {"protocol_version": 1001, "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 4}}
    out = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
    out += pickle.dumps(sys_info, protocol=2) + main
    out += pickle.dumps(sorted(k for k, _, _ in storages), protocol=2)
    for _key, numel, raw in sorted(storages):
        out += numel.to_bytes(8, "little") + raw
    return out


def _legacy_handmade() -> dict[str, bytes]:
    from tests.core.torch_rules.cases import g, i, ints, od, pk, s

    def lpid(st: str = "torch.FloatStorage", key: str = "k1", numel: int = 4,
             view: list[Any] | None = None) -> list[Any]:
        return ["MARK", *s("storage"), g(st), *s(key), *s("cpu"), *i(numel), *(view or ["NONE"]), "TUPLE",
                "BINPERSID"]

    def lv2(p: list[Any], size: tuple[int, ...] = (4,), off: int = 0) -> list[Any]:
        return [g("torch._utils._rebuild_tensor_v2"), "MARK", *p, *i(off), *ints(size),
                *ints((1,) * len(size)), "NEWFALSE", *od(), "TUPLE", "REDUCE"]

    f16 = b"\0" * 16
    return {
        "ok": _legacy_stream(pk(*lv2(lpid())), [("k1", 4, f16)]),
        "five-field": _legacy_stream(pk("MARK", *s("storage"), g("torch.FloatStorage"), *s("k1"), *s("cpu"),
                                        *i(4), "TUPLE", "BINPERSID"), [("k1", 4, f16)]),
        "untyped": _legacy_stream(pk(*lpid("torch.storage.UntypedStorage", numel=16)), [("k1", 16, f16)]),
        "view": _legacy_stream(pk(*lv2(lpid(view=["MARK", *s("v1"), *i(1), *i(2), "TUPLE"]), size=(2,))),
                               [("k1", 4, f16)]),
        "global": _legacy_stream(pk(g("os.system")), []),
        "int-pid": _legacy_stream(pk(*i(3), "BINPERSID"), []),
        "negative-offset": _legacy_stream(pk(*lv2(lpid(), size=(2,), off=-1)), [("k1", 4, f16)]),
    }


@pytest.fixture(scope="module")
def legacy_oracle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bytes, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("legacy")
    streams = {f"save:{k}": v for k, v in _legacy_saved().items()}
    streams.update({f"hand:{k}": v for k, v in _legacy_handmade().items()})
    jobs = []
    for n, (name, data) in enumerate(streams.items()):
        path = tmp / f"legacy{n}.pt"
        path.write_bytes(data)
        jobs.append({"path": str(path), "mode": "load", "name": name})
    results = run_oracle(jobs, tmp)
    return {name: (data, res) for (name, data), res in zip(streams.items(), results, strict=True)}


LEGACY_NAMES = [f"save:{n}" for n in ("state_dict", "tensors", "param", "uint16", "namespace", "plain",
                                      "bytes")] + [f"hand:{n}" for n in (
    "ok", "five-field", "untyped", "view", "global", "int-pid", "negative-offset")]


@pytest.mark.parametrize("name", LEGACY_NAMES)
def test_legacy_pickles_match_torch(legacy_oracle: dict[str, Any], name: str) -> None:
    data, want = legacy_oracle[name]
    results = _legacy_pickles(data)
    last = results[-1][1]
    if last.error is not None and last.error.type == "Unmodelled":
        pytest.fail(f"{name}: {last.error.message} (torch: {want})")
    if want["ok"]:
        assert len(results) == 4 and last.loadable, (name, last.error)
    else:
        assert not last.loadable, (name, want)
        assert last.error is not None
        assert (last.error.type, last.error.wrapped()) == (want["type"], want["msg"]), (name, last.error)


# -- random programs over the accepted opcode set: torch and emulate must agree ------------

_POOL: list[list[Any]] = [
    ["NONE"], ["NEWTRUE"], ["NEWFALSE"], [("BININT1", 2)], [("BININT", -1)], [("BINFLOAT", 0.5)],
    [("BINUNICODE", "a")], [("BINUNICODE", "cpu")], [("BINUNICODE", "storage")], ["EMPTY_DICT"],
    [("BINUNICODE", "latin1")], [("BINUNICODE", "bogus")], [("BINUNICODE", "torch.sparse_coo")],
    [("BINUNICODE", "cuda")], [("BININT1", 0)], [("SHORT_BINSTRING", b"x")], [("LONG1", 2**70)],
    ["EMPTY_LIST"], ["EMPTY_TUPLE"], ["EMPTY_SET"], ["MARK"], ["TUPLE"], ["TUPLE1"], ["TUPLE2"],
    ["TUPLE3"], ["SETITEM"], ["SETITEMS"], ["APPEND"], ["APPENDS"], ["BUILD"], ["REDUCE"], ["REDUCE"],
    ["NEWOBJ"], [("BINPUT", 0)], [("BINGET", 0)], [("BINPUT", 1)], [("BINGET", 1)], ["BINPERSID"],
    *[[("GLOBAL", *full.rsplit(".", 1))] for full in (
        "collections.OrderedDict", "collections.Counter", "torch.Size", "torch.device", "builtins.set",
        "builtins.complex", "builtins.bytearray", "_codecs.encode", "torch.float32", "torch.FloatStorage",
        "torch.serialization._get_layout", "torch._utils._rebuild_tensor_v2", "torch.Tensor",
        "torch.per_tensor_affine", "torch.storage.UntypedStorage", "torch.nn.parameter.Parameter")],
]


def _random_program(rng: Any) -> bytes:
    from tests.core.torch_rules.cases import pid, pk, v2

    items: list[Any] = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.05:
            items += pid(numel=rng.choice([4, 2, 0]), key=rng.choice(["0", "1"]))
        elif r < 0.1:
            items += v2(pid(numel=4), off=rng.choice([0, 1, -1]), size=rng.choice([(4,), (2, 2), (5,), ()]),
                        stride=rng.choice([(1,), (2, 1), ()]))
        else:
            items += rng.choice(_POOL)
    return pk(*items)


@pytest.fixture(scope="module")
def random_oracle(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[bytes, dict[str, Any]]]:
    import random

    rng = random.Random(20261123)
    tmp = tmp_path_factory.mktemp("rand")
    programs = [_random_program(rng) for _ in range(600)]
    jobs = []
    for n, prog in enumerate(programs):
        path = write_zip(tmp / f"r{n}.pt", prog, {"data/0": b"\0" * 16})
        jobs.append({"path": str(path), "mode": "load"})
    return list(zip(programs, run_oracle(jobs, tmp), strict=True))


@pytest.mark.slow
def test_random_programs_match_torch(random_oracle: list[tuple[bytes, dict[str, Any]]]) -> None:
    modelled = 0
    mismatches = []
    for prog, want in random_oracle:
        got = emulate(prog, resolver=Records({"data/0": b"\0" * 16}))
        if got.error is not None and got.error.type == "Unmodelled":
            assert not got.loadable
            continue
        modelled += 1
        same = got.loadable == want["ok"] and (want["ok"] or (
            got.error is not None and (got.error.type, got.error.wrapped()) == (want["type"], want["msg"])))
        if not same:
            mismatches.append((prog, got.error, want))
    assert not mismatches, mismatches[:3]
    assert modelled > 500


_FUNCS = ["collections.OrderedDict", "collections.Counter", "torch.Size", "torch.device", "builtins.set",
          "builtins.complex", "builtins.bytearray", "_codecs.encode", "torch.serialization._get_layout",
          "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor",
          "torch._utils._rebuild_parameter",
          "torch._utils._rebuild_parameter_with_state", "torch._utils._rebuild_tensor_v3",
          "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_qtensor",
          "torch._tensor._rebuild_from_type_v2", "torch._utils._rebuild_sparse_tensor"]


def _random_value(rng: Any, depth: int = 0) -> list[Any]:
    from tests.core.torch_rules.cases import call, g, i, ints, od, pid, s, v2

    if depth < 1 and rng.random() < 0.15:
        return ["MARK", *[x for _ in range(rng.randint(0, 4)) for x in _random_value(rng, 1)], "TUPLE"]
    pick = rng.randrange(16)
    if pick == 0:
        return [rng.choice(["NONE", "NEWTRUE", "NEWFALSE"])]
    if pick == 1:
        return i(rng.choice([0, 1, 2, 3, -1, 4, 16]))
    if pick == 2:
        return [("BINFLOAT", rng.choice([0.5, -1.0, 2.0]))]
    if pick == 3:
        return s(rng.choice(["cpu", "cuda", "cuda:1", "bogus", "latin1", "torch.sparse_coo", "torch.strided",
                             "a", "", "meta", "mps", "cpu:0", "xla"]))
    if pick == 4:
        return ints(tuple(rng.choice([0, 1, 2, 4, -1]) for _ in range(rng.randint(0, 3))))
    if pick == 5:
        return ["EMPTY_LIST"] + ([*i(2), "APPEND"] if rng.random() < .5 else [])
    if pick == 6:
        key = rng.choice(["a", "conj", "neg", "data", "x"])
        return ["EMPTY_DICT"] + ([*s(key), "NEWTRUE", "SETITEM"] if rng.random() < .5 else [])
    if pick == 7:
        return [g(rng.choice(["torch.float32", "torch.int64", "torch.float16", "torch.Tensor",
                              "torch.per_tensor_affine", "torch.quint8", "torch.FloatStorage"]))]
    if pick == 8:
        return od()
    if pick == 9:
        return v2(pid(numel=4))
    if pick == 10:
        return v2(pid("torch.LongStorage", key="1", numel=2), size=(2,))
    if pick == 11:
        return pid(rng.choice(["torch.FloatStorage", "torch.QUInt8Storage", "torch.storage.UntypedStorage"]),
                   numel=rng.choice([4, 16]))
    if pick == 12:
        return call("torch.Size", ints((rng.choice([1, 2, 4]),)))
    if pick == 13:
        return call("torch.serialization._get_layout", s("torch.sparse_coo"))
    if pick == 14:
        return [g(rng.choice(["torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor"]))]
    return ["EMPTY_TUPLE"]


def _random_call(rng: Any) -> bytes:
    from tests.core.torch_rules.cases import call, pk, s

    args = [_random_value(rng) for _ in range(rng.choice([0, 1, 2, 3, 4, 4, 6, 7]))]
    items = call(rng.choice(_FUNCS), *args)
    if rng.random() < 0.3:
        items = ["EMPTY_DICT", *s("k"), *items, "SETITEM"]
    return pk(*items)


@pytest.mark.slow
def test_random_calls_match_torch(tmp_path: Path) -> None:
    """Allowlisted callables with random arguments: the models of core.torch.callables."""
    import random

    rng = random.Random(5)
    recs = {"data/0": b"\0" * 16, "data/1": b"\0" * 16}
    programs = [_random_call(rng) for _ in range(800)]
    jobs = [{"path": str(write_zip(tmp_path / f"c{n}.pt", p, recs)), "mode": "load"}
            for n, p in enumerate(programs)]
    modelled, mismatches = 0, []
    for prog, want in zip(programs, run_oracle(jobs, tmp_path), strict=True):
        got = emulate(prog, resolver=Records(recs))
        if got.error is not None and got.error.type == "Unmodelled":
            continue
        modelled += 1
        same = got.loadable == want["ok"] and (want["ok"] or (
            got.error is not None and (got.error.type, got.error.wrapped()) == (want["type"], want["msg"])))
        if not same:
            mismatches.append((prog, got.error, want))
    assert not mismatches, mismatches[:3]
    assert modelled > 400


@pytest.mark.slow
def test_mutated_torch_saves_match_torch(tmp_path: Path) -> None:
    """Real torch.save pickles with 1-3 bytes flipped/deleted/inserted: same verdict and text."""
    import random

    rng = random.Random(99)
    objs = [torch.nn.Linear(3, 2).state_dict(),
            {"a": [torch.ones(2), (torch.zeros(3, dtype=torch.int64), 1.5)], "b": b"xy", "c": {1, 2}},
            torch.nn.Parameter(torch.ones(2))]
    bases = []
    for k, obj in enumerate(objs):
        path = tmp_path / f"base{k}.pt"
        torch.save(obj, path)
        bases.append(zip_records(path))
    programs = []
    for _ in range(600):
        pkl, recs = rng.choice(bases)
        buf = bytearray(pkl)
        for _ in range(rng.choice([1, 1, 2, 3])):
            pos, r = rng.randrange(len(buf)), rng.random()
            if r < 0.6:
                buf[pos] = rng.randrange(256)
            elif r < 0.8:
                del buf[pos]
            else:
                buf.insert(pos, rng.randrange(256))
        programs.append((bytes(buf), recs))
    jobs = [{"path": str(write_zip(tmp_path / f"m{n}.pt", p, r)), "mode": "load"}
            for n, (p, r) in enumerate(programs)]
    modelled, mismatches = 0, []
    for (prog, recs), want in zip(programs, run_oracle(jobs, tmp_path), strict=True):
        got = emulate(prog, resolver=Records(recs))
        if got.error is not None and got.error.type == "Unmodelled":
            continue
        modelled += 1
        same = got.loadable == want["ok"] and (want["ok"] or (
            got.error is not None and (got.error.type, got.error.wrapped()) == (want["type"], want["msg"])))
        if not same:
            mismatches.append((prog, got.error, want))
    assert not mismatches, mismatches[:3]
    assert modelled > 550
