"""Device-copy and wrapper-subclass rebuilds against torch.load(weights_only=True) itself.

torch 2.13 allowlists `_rebuild_device_tensor_from_cpu_tensor(data, dtype, device,
requires_grad)` (`data.to(dtype=, device=)`, then the requires_grad setter) and
`_rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device,
requires_grad)` (`Tensor._make_wrapper_subclass`). Each case here is a real torch.save'd
`{"x": <call>}` (an object whose `__reduce__` is the call, its tensor argument saved by torch),
over a generated product of arguments: data tensors of several dtypes, views, transposes and
requires_grad; target dtypes equal, different and not dtypes; devices as strings,
`torch.device`s, ints and garbage; requires_grad bools and non-bools; wrong arities. The scan
must give torch's answer (loadable, error type, first line), and for a file torch loads, the
manifest entry of "x" must describe the tensor torch returns. `_rebuild_device_tensor_from_numpy`
is checked where a fresh torch answers without numpy: its globals are not allowed.

The policy (core.torch.weights_only): a copy to "cuda[:N]" or "mps" is loadable whatever this
CPU-only host says; such a case must get the answer of the same call with device "meta" (a copy
to another device). A device that depends on the host beyond that policy (an int: the current
accelerator; a backend such as "xla") is left Unmodelled, and so is a call whose `to` returns
`data` itself and whose setter then changes its requires_grad (which every other reference to
that tensor in the pickle would see), and a quantized copy to a device other than cpu (torch's
message lists the backends of its build).
"""

from __future__ import annotations

import io
import itertools
import random
import warnings
from typing import Any

import pytest

from ckptguard.core.scan import scan_bytes
from tests.differential.torch_answer import torch_first_line

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

Answer = tuple[bool, str | None, str | None]


class Call:
    """Pickles as `func(*args)`: what torch.save writes for a tensor of another device."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def _data() -> dict[str, Any]:
    base = torch.arange(12.0).reshape(3, 4)
    return {
        "f32": torch.arange(4.0), "f16": torch.arange(4, dtype=torch.float16),
        "i64": torch.arange(4), "u8": torch.arange(3, dtype=torch.uint8),
        "bool": torch.tensor([True, False]), "c64": torch.ones(2, dtype=torch.complex64),
        "transposed": base.t(), "slice": base[1:, ::2], "empty": torch.zeros(0, 3),
        "grad": torch.arange(3.0).requires_grad_(),
        "grad-f64": torch.arange(2.0, dtype=torch.float64).requires_grad_(),
        "int": 3, "none": None, "list": [1, 2],
    }


DTYPES = {"same": "same", "f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "i32": torch.int32, "bool": torch.bool, "c128": torch.complex128, "qint8": torch.qint8,
          "none": None, "str": "float32", "int": 3}
DEVICES = {"cpu": "cpu", "cpu:1": "cpu:1", "meta": "meta", "meta:0": "meta:0", "none": None,
           "device-cpu": torch.device("cpu"), "device-meta": torch.device("meta"),
           "cuda": "cuda", "cuda:0": "cuda:0", "device-cuda:1": torch.device("cuda", 1), "mps": "mps",
           "garbage": "xyz", "empty": "", "bad-index": "cpu:x", "float": 1.5,
           "int": 0, "negative": -1, "xla": "xla", "hpu:0": "hpu:0"}
# the host's business beyond the policy: left Unmodelled
HOST_DEVICES = frozenset(("int", "negative", "xla", "hpu:0"))
# the policy's devices; this CPU-only host refuses them
POLICY_DEVICES = frozenset(("cuda", "cuda:0", "device-cuda:1", "mps"))
GRADS = {"T": True, "F": False, "one": 1, "none": None}


def _answer(obj: Any) -> tuple[bytes, Answer, Any]:
    buf = io.BytesIO()
    torch.save({"x": obj}, buf)
    data = buf.getvalue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            loaded = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:   # torch's refusal is the oracle's answer
            return data, (False, type(exc).__name__, torch_first_line(exc)), None
    return data, (True, None, None), loaded["x"]


def _stored(data: bytes, e: Any) -> Any:
    """The tensor a manifest entry places in the file: its dtype, view and bytes."""
    dtype = getattr(torch, e.dtype)
    if not e.nbytes:
        return torch.empty(e.shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(data[e.data_offset:e.data_offset + e.nbytes]), dtype=dtype)
    return flat.as_strided(e.shape, e.stride)


def _compare_manifest(report: Any, data: bytes, x: Any, case: str) -> None:
    [e] = [t for t in report.tensors if t.path == ["x"]]
    assert (e.kind, e.requires_grad, e.shape) == ("tensor", x.requires_grad, list(x.shape)), case
    target = str(x.dtype).removeprefix("torch.")
    converted = [f for f in e.flags if f.startswith("to:")]
    assert ("to:meta" in converted) == (x.device.type == "meta"), case
    assert (f"to:{target}" in converted) == (e.dtype != target), case
    stored = _stored(data, e)
    if not converted:   # torch returns the stored tensor itself
        assert (e.dtype, e.stride, e.storage_offset) == (target, list(x.stride()), x.storage_offset()), case
        assert torch.equal(stored, x), case
    elif x.device.type != "meta":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # complex -> real drops the imaginary part, as torch.load did
            assert torch.equal(stored.to(x.dtype), x), case


def _scan(data: bytes) -> tuple[Answer, Any]:
    report = scan_bytes(data)
    wo = report.weights_only
    return (wo.loadable, wo.error_type, wo.error), report


def test_device_copies_answer_as_torch() -> None:
    from torch._utils import _rebuild_device_tensor_from_cpu_tensor as rebuild

    rng = random.Random(8)
    datas = _data()
    wrong, unmodelled, loadable, policy = [], [], 0, 0
    for (dn, d), (tn, t), (vn, v), (gn, g) in itertools.product(
            datas.items(), DTYPES.items(), DEVICES.items(), GRADS.items()):
        if rng.random() >= 0.05 and not (gn == "F" and dn in ("transposed", "grad")):
            continue
        case = f"data={dn} dtype={tn} device={vn} requires_grad={gn}"
        dtype = getattr(d, "dtype", None) if tn == "same" else t
        data, want, x = _answer(Call(rebuild, d, dtype, v, g))
        ours, report = _scan(data)
        if vn in POLICY_DEVICES:   # assumed present: the answer of a copy to another device
            policy += 1
            twin = torch.device("meta") if isinstance(v, torch.device) else "meta"
            _, want, _ = _answer(Call(rebuild, d, dtype, twin, g))
        if ours[1] == "Unmodelled":
            unmodelled.append((case, ours[2]))
            continue
        if ours != want:
            wrong.append((case, ours, want))
            continue
        if want[0] and vn not in POLICY_DEVICES:
            loadable += 1
            _compare_manifest(report, data, x, case)
    assert wrong == [], f"{len(wrong)} differ:\n" + "\n".join(map(str, wrong[:12]))
    # left Unmodelled: the host's devices (beyond the policy), and a `to` that returns data
    # itself whose requires_grad the setter then changes (every other reference to it changes)
    assert [(c, why) for c, why in unmodelled if c.split(" device=")[1].split(" ")[0] not in HOST_DEVICES
            and "returns unchanged" not in why and "backends decide" not in why] == []
    assert loadable > 40 and policy > 10 and unmodelled


@pytest.mark.parametrize("args", [(), (1,), (1, 2, 3), (1, 2, 3, 4, 5)], ids=len)
def test_device_copy_arity_is_torchs(args: tuple[Any, ...]) -> None:
    from torch._utils import _rebuild_device_tensor_from_cpu_tensor as rebuild

    data, want, _ = _answer(Call(rebuild, *args))
    assert _scan(data)[0] == want


def _classes() -> dict[str, Any]:
    """Every allowlisted class a fresh `import torch` lets a pickle name, and non-classes."""
    import collections

    return {"Tensor": torch.Tensor, "Parameter": torch.nn.Parameter, "OrderedDict": collections.OrderedDict,
            "Counter": collections.Counter, "Size": torch.Size, "device": torch.device, "set": set,
            "bytearray": bytearray, "complex": complex, "TypedStorage": torch.storage.TypedStorage,
            "UntypedStorage": torch.storage.UntypedStorage, "FloatTensor": torch.FloatTensor,
            "cuda.LongTensor": torch.cuda.LongTensor, "sparse.FloatTensor": torch.sparse.FloatTensor,
            "str": "Tensor", "int": 3, "none": None, "list": [1]}


# argument variants; the ones _make_wrapper_subclass's parser refuses (or whose parse is not
# modelled) are marked: only those may be Unmodelled, besides no class
WRAPPER_ARGS: dict[str, dict[str, tuple[Any, bool]]] = {
    "dtype": {"f32": (torch.float32, True), "i64": (torch.int64, True), "str": ("f", False)},
    "size": {"(2,)": ((2,), True), "[2,3]": ([2, 3], True), "Size": (torch.Size([4]), True),
             "neg": ((-2,), True), "str": ("ab", False), "bool": ((True,), False)},
    "stride": {"none": (None, True), "(1,)": ((1,), True), "[3,1]": ([3, 1], True)},
    "offset": {"0": (0, True), "none": (None, True), "-5": (-5, True), "str": ("a", False)},
    "layout": {"strided": (torch.strided, True), "sparse_coo": (torch.sparse_coo, True),
               "none": (None, False)},
    "device": {"cpu": ("cpu", True), "garbage": ("xyz", True), "meta": (torch.device("meta"), True),
               "cuda:0": ("cuda:0", True), "none": (None, True), "int": (0, False)},
    "requires_grad": {"F": (False, True), "T": (True, True), "one": (1, False)},
}


def test_wrapper_subclasses_answer_as_torch() -> None:
    from torch._utils import _rebuild_wrapper_subclass as rebuild

    rng = random.Random(18)
    classes = _classes()
    variants = [list(v.items()) for v in WRAPPER_ARGS.values()]
    # every class with well-typed arguments, then random picks over everything
    cases = [(c, [v[0] for v in variants]) for c in classes]
    typed = [[x for x in v if x[1][1]] for v in variants]
    cases += [(rng.choice(list(classes)), [rng.choice(v) for v in (typed if i % 2 else variants)])
              for i in range(300)]
    wrong, unexpected, answered = [], [], 0
    for cn, picked in cases:
        cls = classes[cn]
        case = f"cls={cn} " + " ".join(f"{k}={n}" for k, (n, _) in zip(WRAPPER_ARGS, picked, strict=True))
        data, want, _ = _answer(Call(rebuild, cls, *(value for _, (value, _) in picked)))
        ours, _ = _scan(data)
        if ours[1] == "Unmodelled":
            if all(typed for _, (_, typed) in picked):
                unexpected.append((case, ours[2], want))
            continue
        answered += 1
        if ours != want:
            wrong.append((case, ours, want))
    assert wrong == [], f"{len(wrong)} differ:\n" + "\n".join(map(str, wrong[:12]))
    assert unexpected == [], unexpected[:8]
    assert answered > 120


@pytest.mark.parametrize("n", [0, 1, 7, 9])
def test_wrapper_subclass_arity_is_torchs(n: int) -> None:
    from torch._utils import _rebuild_wrapper_subclass as rebuild

    data, want, _ = _answer(Call(rebuild, *range(n)))
    assert _scan(data)[0] == want


@pytest.mark.parametrize("data", ["array", 3, None, [1.0, 2.0], "s", 1.5, {}], ids=repr)
def test_numpy_device_copies_answer_as_torch(data: Any) -> None:
    """A fresh torch refuses numpy's globals before the call; anything else is from_numpy's."""
    import numpy as np
    from torch._utils import _rebuild_device_tensor_from_numpy as rebuild

    array = np.arange(4, dtype=np.float32) if data == "array" else data
    blob, want, _ = _answer(Call(rebuild, array, torch.float32, "cpu", False))
    assert _scan(blob)[0] == want
    assert not want[0]


@pytest.mark.parametrize("n", [0, 3, 5])
def test_numpy_device_copy_arity_is_torchs(n: int) -> None:
    from torch._utils import _rebuild_device_tensor_from_numpy as rebuild

    data, want, _ = _answer(Call(rebuild, *range(n)))
    assert _scan(data)[0] == want
