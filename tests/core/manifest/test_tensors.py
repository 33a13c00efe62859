"""core.manifest.build.build_manifest on hand-built value graphs: naming, offsets, findings, limits.

The differential suite (tests/differential/test_manifest_vs_torch.py) checks real torch
files; here each rule of FORMATS.md §2.2-§2.6 and each finding gets a small graph.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.limits import Limits
from ckptguard.core.manifest import build as tensors
from ckptguard.core.manifest.build import NoStorages, StorageSite, build_manifest
from ckptguard.core.state import Analysis, ScanOptions
from ckptguard.core.values import Call, Global, PersId

U = "torch._utils"
V2 = Global(U, "_rebuild_tensor_v2")
V3 = Global(U, "_rebuild_tensor_v3")
OD = Global("collections", "OrderedDict")
FLOAT = Global("torch", "FloatStorage")
HALF = Global("torch", "HalfStorage")
UNTYPED = Global("torch.storage", "UntypedStorage")


class Sites:
    """Storage k at 1000 + 100*k, record size = declared unless overridden."""

    def __init__(self, sizes: dict[str, int] | None = None) -> None:
        self.sizes = sizes or {}
        self.calls: list[str] = []

    def locate(self, key: str) -> StorageSite | None:
        self.calls.append(key)
        if not key.isdigit():
            return None
        return StorageSite(f"archive/data/{key}", 1000 + 100 * int(key), self.sizes.get(key), True)


def pid(key: str = "0", stype: Global = FLOAT, numel: int = 6, *extra: Any) -> PersId:
    return PersId(("storage", stype, key, "cpu", numel, *extra))


def v2(p: Any = None, offset: Any = 0, size: Any = (2, 3), stride: Any = (3, 1), rg: Any = False,
       *extra: Any) -> Call:
    return Call(V2, (p if p is not None else pid(), offset, size, stride, rg, Call(OD, ()), *extra))


def manifest(root: Any, locator: Any = None, **limits: int) -> Analysis:
    an = Analysis(options=ScanOptions(limits=Limits(**limits))) if limits else Analysis()
    build_manifest(root, locator or Sites(), an, record="archive/data.pkl")
    return an


def codes(an: Analysis) -> list[Code]:
    return [f.code for f in an.findings]


def od(*items: tuple[Any, Any]) -> Call:
    c = Call(OD, ())
    c.setitems.extend(items)
    return c


# ---- shape of the manifest ----------------------------------------------------------------------


def test_basic_entry_and_storage() -> None:
    an = manifest({"w": v2(pid(numel=8), 2, (2, 3), (3, 1))})
    (t,) = an.tensors
    assert (t.name, t.path, t.dtype, t.shape, t.stride, t.storage_offset, t.storage, t.kind) == (
        "w", ["w"], "float32", [2, 3], [3, 1], 2, "0", "tensor")
    assert (t.data_offset, t.nbytes, t.requires_grad, t.record) == (1000 + 8, 24, False, "archive/data.pkl")
    (s,) = an.storages
    assert (s.key, s.dtype, s.numel, s.nbytes, s.location, s.record, s.data_offset, s.offset_verified) == (
        "0", "float32", 8, 32, "cpu", "archive/data/0", 1000, True)
    assert an.findings == []


def test_names_follow_the_contract() -> None:
    root = od(("a", {"b": [v2(), (v2(),)]}), ("c", {3: v2(), b"k": v2(), (1, 2): v2()}))
    an = manifest(root)
    assert [t.name for t in an.tensors] == ["a.b.0", "a.b.1.0", "c.3", "c.k", "c.(1, 2)"]
    assert an.tensors[0].path == ["a", "b", 0]
    assert an.tensors[2].path == ["c", 3]


def test_storage_listed_once_in_first_encounter_order() -> None:
    an = manifest({"a": v2(pid("1")), "b": v2(pid("0")), "c": v2(pid("1"), 1, (2,), (1,))})
    assert [s.key for s in an.storages] == ["1", "0"]
    assert [t.storage for t in an.tensors] == ["1", "0", "1"]


def test_view_span_and_offset() -> None:
    # FORMATS.md §1.4: c = a[1] -> storage_offset 3, bytes [1100, 1112) when data/0 is at 1088
    loc = Sites()
    loc.locate = lambda key: StorageSite("ex1/data/0", 1088, 24, True)  # type: ignore[method-assign]
    an = manifest({"c": v2(pid(numel=6), 3, (3,), (1,))}, loc)
    t = an.tensors[0]
    assert t.data_offset is not None
    assert (t.data_offset, t.data_offset + t.nbytes) == (1100, 1112)


@pytest.mark.parametrize(("size", "stride", "nbytes"), [
    ((), (), 4),                    # 0-d: one element
    ((0,), (1,), 0),                # empty
    ((2, 0, 3), (0, 3, 1), 0),      # empty in the middle
    ((4, 4), (0, 0), 4),            # expanded scalar: stride 0
    ((3, 2), (1, 3), 24),           # transposed
    ((2, 2), (4, 2), 4 * (1 + 4 + 2)),  # strided
])
def test_nbytes_spans(size: tuple[int, ...], stride: tuple[int, ...], nbytes: int) -> None:
    an = manifest({"t": v2(pid(numel=12), 0, size, stride)})
    assert an.tensors[0].nbytes == nbytes
    assert an.findings == []


def test_v3_dtype_over_untyped_storage() -> None:
    # numel of an UntypedStorage pid counts bytes (FORMATS.md §2.2, §8.1)
    call = Call(V3, (pid("0", UNTYPED, 20), 1, (5,), (2,), False, Call(OD, ()),
                     Global("torch", "uint16")))
    an = manifest({"u": call})
    t, s = an.tensors[0], an.storages[0]
    assert (t.dtype, t.data_offset, t.nbytes) == ("uint16", 1002, 18)
    assert (s.dtype, s.numel, s.nbytes) == ("uint8", 20, 20)
    assert an.findings == []


def test_parameter_and_subclass_wrappers() -> None:
    param = Call(Global(U, "_rebuild_parameter"), (v2(), True, Call(OD, ())))
    with_state = Call(Global(U, "_rebuild_parameter_with_state"),
                      (v2(), False, Call(OD, ()), {"aux": v2(pid("1"))}))
    sub = Call(Global("torch._tensor", "_rebuild_from_type_v2"),
               (V2, Global("__main__", "MyT"), v2().args, None))
    attrs = Call(Global("torch._tensor", "_rebuild_from_type_v2"),
                 (V2, Global("torch", "Tensor"), v2().args, {"extra": v2(pid("2"))}))
    an = manifest({"p": param, "q": with_state, "s": sub, "a": attrs})
    got = {t.name: (t.kind, t.requires_grad) for t in an.tensors}
    assert got == {"p": ("parameter", True), "q": ("parameter", False), "q.aux": ("tensor", False),
                   "s": ("subclass", False), "a": ("tensor", False), "a.extra": ("tensor", False)}


def test_quantized_per_channel_components() -> None:
    scales = Call(Global(U, "_rebuild_tensor_v2"),
                  (pid("1", Global("torch", "DoubleStorage"), 3), 0, (3,), (1,), False, Call(OD, ())))
    zps = Call(V2, (pid("2", Global("torch", "LongStorage"), 3), 0, (3,), (1,), False, Call(OD, ())))
    q = Call(Global(U, "_rebuild_qtensor"),
             (pid("0", Global("torch", "QInt8Storage"), 12), 0, (3, 4), (4, 1),
              (Global("torch", "per_channel_affine"), scales, zps, 0), False, Call(OD, ())))
    an = manifest({"q": q})
    assert [(t.name, t.kind, t.dtype) for t in an.tensors] == [
        ("q", "quantized", "qint8"), ("q.scales", "tensor", "float64"), ("q.zero_points", "tensor", "int64")]


def test_packed_quint4x2_counts_bytes() -> None:
    q = Call(Global(U, "_rebuild_qtensor"),
             (pid("0", Global("torch", "QUInt4x2Storage"), 3), 0, (5,), (1,),
              (Global("torch", "per_tensor_affine"), 0.1, 0), False, Call(OD, ())))
    an = manifest({"q": q})
    assert an.tensors[0].nbytes == 3
    assert an.findings == []


def test_sparse_and_nested_components() -> None:
    layout = Call(Global("torch.serialization", "_get_layout"), ("torch.sparse_csr",))
    csr = Call(Global(U, "_rebuild_sparse_tensor"),
               (layout, (v2(pid("0", Global("torch", "LongStorage"), 3), 0, (3,), (1,)),
                         v2(pid("1", Global("torch", "LongStorage"), 2), 0, (2,), (1,)),
                         v2(pid("2", HALF, 2), 0, (2,), (1,)),
                         Call(Global("torch", "Size"), ((2, 5),)))))
    nested = Call(Global(U, "_rebuild_nested_tensor"),
                  (v2(pid("3", numel=10), 0, (10,), (1,)), v2(pid("4", Global("torch", "LongStorage"), 4), 0,
                                                             (2, 2), (2, 1)),
                   v2(pid("5", Global("torch", "LongStorage"), 4), 0, (2, 2), (2, 1)),
                   v2(pid("6", Global("torch", "LongStorage"), 2), 0, (2,), (1,))))
    an = manifest({"s": csr, "n": nested})
    got = [(t.name, t.kind, t.dtype, t.shape, t.storage) for t in an.tensors]
    assert got == [
        ("s", "sparse", "float16", [2, 5], None),
        ("s.compressed_indices", "tensor", "int64", [3], "0"),
        ("s.plain_indices", "tensor", "int64", [2], "1"),
        ("s.values", "tensor", "float16", [2], "2"),
        ("n", "nested", "float32", [], None),
        ("n.buffer", "tensor", "float32", [10], "3"),
        ("n.sizes", "tensor", "int64", [2, 2], "4"),
        ("n.strides", "tensor", "int64", [2, 2], "5"),
        ("n.storage_offsets", "tensor", "int64", [2], "6"),
    ]
    assert an.findings == []


def test_meta_wrapper_and_bare_storage() -> None:
    meta = Call(Global(U, "_rebuild_meta_tensor_no_storage"),
                (Global("torch", "bfloat16"), (2, 3), (3, 1), True))
    wrapper = Call(Global(U, "_rebuild_wrapper_subclass"),
                   (Global("__main__", "W"), Global("torch", "float32"), (4,), (1,), 0,
                    Global("torch", "strided"), "cpu", False))
    an = manifest({"m": meta, "w": wrapper, "s": pid("0", HALF, 4)})
    got = [(t.name, t.kind, t.dtype, t.storage, t.data_offset, t.nbytes, t.requires_grad) for t in an.tensors]
    assert got == [("m", "meta", "bfloat16", None, None, 0, True),
                   ("w", "wrapper", "float32", None, None, 0, False),
                   ("s", "storage", "float16", "0", 1000, 8, False)]


def test_legacy_view_pid_offsets_into_root() -> None:
    # ('storage', ST, root_key, location, numel, (view_key, offset, size)): torch slices the root
    p = pid("0", FLOAT, 10, ("view1", 4, 3))
    an = manifest({"t": v2(p, 1, (2,), (1,))})
    t = an.tensors[0]
    assert (t.storage, t.storage_offset, t.data_offset, t.nbytes) == ("0", 1, 1000 + 4 * 4 + 4, 8)
    an = manifest({"t": v2(pid("0", FLOAT, 10, ("v", 4, 3)), 0, (4,), (1,))})
    assert codes(an) == [Code.TORCH_TENSOR_OUT_OF_BOUNDS]


def test_unlocated_storage_has_no_offset() -> None:
    an = manifest({"w": v2()}, NoStorages())
    assert an.tensors[0].data_offset is None and an.storages[0].record is None


def test_locator_called_once_per_key() -> None:
    loc = Sites()
    manifest([v2(pid("0")), v2(pid("0")), v2(pid("1"))], loc)
    assert loc.calls == ["0", "1"]


# ---- findings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("root", [
    {"w": v2(pid(numel=5))},                       # 6 elements in a 5-element storage
    {"w": v2(pid(numel=6), 1)},                    # offset pushes the end out
    {"w": v2(pid(numel=6), 0, (2, 3), (4, 1))},    # stride pushes the end out
])
def test_out_of_bounds(root: Any) -> None:
    an = manifest(root)
    assert codes(an) == [Code.TORCH_TENSOR_OUT_OF_BOUNDS]
    assert len(an.tensors) == 1        # still listed


def test_record_size_mismatch_bounds_by_record() -> None:
    an = manifest({"w": v2(pid(numel=6))}, Sites({"0": 16}))
    assert codes(an) == [Code.TORCH_RECORD_SIZE_MISMATCH, Code.TORCH_TENSOR_OUT_OF_BOUNDS]
    assert "record size (16 bytes) does not match expected size (24 bytes" in an.findings[0].message


@pytest.mark.parametrize("call", [
    Call(V2, (pid(), 0, (2, 3))),                                  # arity
    Call(V2, "not a tuple"),
    v2(("storage", FLOAT, "0", "cpu", 6)),                         # pid not a PersId
    v2(PersId(("module", FLOAT, "0", "cpu", 6))),                  # tag
    v2(PersId(("storage", FLOAT, 0, "cpu", 6))),                   # int key
    v2(PersId(("storage", Global("os", "system"), "0", "cpu", 6))),  # not a storage class
    v2(PersId(("storage", FLOAT, "0", "cpu", -1))),                # negative numel
    v2(PersId(("storage", FLOAT, "0"))),                           # short pid
    v2(pid(), 0, (2, 3), (3,)),                                    # size/stride lengths
    v2(pid(), -1),                                                 # negative offset
    v2(pid(), 0, (2,), (-1,)),                                     # negative stride
    v2(pid(), 0, [2, "3"], (3, 1)),                                # non-int size
    v2(pid(), 0.5),                                                # float offset
    v2(pid(), 0, (2, 3), (3, 1), 1),                               # requires_grad not bool
    v2(pid("0", Global("torch", "LongStorage")), 0, (2, 3), (3, 1), True),  # int requires grad
    Call(V3, (pid(), 0, (2,), (1,), False, Call(OD, ()), Global("torch", "float"))),  # alias dtype
    Call(Global(U, "_rebuild_parameter"), ("junk", True, Call(OD, ()))),
    Call(Global(U, "_rebuild_sparse_tensor"), (Global("torch", "sparse_xyz"), ())),
    Call(Global(U, "_rebuild_qtensor"), (pid(), 0, (2,), (1,), ("x",), False, None)),
    Call(Global(U, "_rebuild_meta_tensor_no_storage"), ("float32", (1,), (1,), False)),
])
def test_bad_tensor_args_is_a_finding(call: Call) -> None:
    an = manifest({"w": call})
    assert Code.TORCH_BAD_TENSOR_ARGS in codes(an), an.findings
    assert all(f.record == "archive/data.pkl" for f in an.findings)


def test_redeclared_storage_keeps_the_first() -> None:
    an = manifest({"a": v2(pid("0", FLOAT, 6)), "b": v2(pid("0", HALF, 100), 0, (50,), (1,))})
    assert codes(an)[0] == Code.TORCH_BAD_TENSOR_ARGS
    assert an.tensors[1].dtype == "float32"      # torch's persistent_load cache: first pid wins
    assert Code.TORCH_TENSOR_OUT_OF_BOUNDS in codes(an)


def test_build_on_tensor_repoints_it() -> None:
    # torch's weights-only BUILD on a plain Tensor runs Tensor.set_(*state)
    call = v2(pid("0", FLOAT, 6))
    call.state.append((pid("1", HALF, 8), 2, (3,), (1,)))
    an = manifest({"w": call})
    t = an.tensors[0]
    got = (t.storage, t.dtype, t.storage_offset, t.shape, t.data_offset)
    assert got == ("1", "float32", 2, [3], 1100 + 8)
    assert Code.TORCH_BAD_TENSOR_ARGS in codes(an)


def test_a_tensor_the_replay_saw_built_is_listed_as_torch_ends_up_with_it() -> None:
    # the weights-only replay's view wins over the rebuild arguments and the raw BUILD state:
    # a parameter (its call's offset) on storage "1" at offset 2, shape [3], requiring grad
    from ckptguard.core.torch.rules import StorageInfo
    from ckptguard.core.torch.tensor_build import TensorView

    inner = v2(pid("0", FLOAT, 6))
    param = Call(Global(U, "_rebuild_parameter"), (inner, False, Call(OD, ())), offset=40)
    param.state.append(("ignored",))
    view = TensorView(StorageInfo("1", "float32", 32), pid("1", FLOAT, 8), "float32", 2, (3,), (1,))
    fresh = Call(V2, inner.args, offset=60)   # set_(): a fresh storage of its own
    an = Analysis()
    build_manifest({"p": param, "t": fresh}, Sites(), an, record="archive/data.pkl",
                   built={40: (view, True), 60: (TensorView(None, None, "float32", 0, (0,), (1,)), False)})
    p, t = an.tensors
    assert (p.kind, p.storage, p.dtype, p.storage_offset, p.shape, p.stride, p.requires_grad) == (
        "parameter", "1", "float32", 2, [3], [1], True)
    assert (p.data_offset, p.nbytes) == (1100 + 8, 12)
    assert (t.storage, t.shape, t.data_offset, t.nbytes) == (None, [0], None, 0)
    assert codes(an).count(Code.TORCH_BAD_TENSOR_ARGS) == 2   # each BUILD is said


def test_wrapper_chain_is_bounded() -> None:
    node: Any = v2()
    for _ in range(100):
        node = Call(Global(U, "_rebuild_parameter"), (node, False, Call(OD, ())))
    an = manifest({"p": node})
    assert codes(an) == [Code.TORCH_BAD_TENSOR_ARGS] and an.tensors == []


def test_tensor_limit() -> None:
    with pytest.raises(LimitExceeded) as exc:
        manifest([v2() for _ in range(11)], max_tensors=10)
    assert exc.value.code == Code.LIMIT_TENSORS


# ---- hostile graph shapes --------------------------------------------------------------------


def test_cycles_and_shared_containers_visited_once() -> None:
    loop: list[Any] = [v2()]
    loop.append(loop)
    shared = {"w": v2()}
    an = manifest({"loop": loop, "x": shared, "y": shared})
    assert [t.name for t in an.tensors] == ["loop.0", "x.w"]


def test_exponential_dag_is_linear() -> None:
    node: Any = [v2()]
    for _ in range(200):
        node = [node, node]        # 2**200 paths, 201 distinct lists
    an = manifest(node)
    assert len(an.tensors) == 1


def test_deep_nesting_needs_no_recursion() -> None:
    node: Any = v2()
    for i in range(10_000):   # the VM caps nesting at Limits.max_depth = 10 000
        node = [node] if i % 2 else {"k": node}
    an = manifest(node)
    assert len(an.tensors[0].path) == 10_000


def test_generic_objects_expose_state_and_args() -> None:
    obj = Call(Global("argparse", "Namespace"), (), opcode="NEWOBJ")
    obj.state.append({"w": v2()})
    nt = Call(Global("__main__", "Point"), (v2(), v2()), opcode="NEWOBJ")
    pairs = Call(OD, ([("a", v2()), ("b", v2())],))
    an = manifest({"ns": obj, "pt": nt, "od": pairs})
    assert [t.name for t in an.tensors] == ["ns.w", "pt.0", "pt.1", "od.a", "od.b"]


def test_gc_state_restored() -> None:
    import gc
    gc.disable()
    try:
        manifest({"w": v2()})
        assert not gc.isenabled()
    finally:
        gc.enable()
    manifest({"w": v2()})
    assert gc.isenabled()


# ---- the fast path equals the general path; any graph -> no crash ----------------------------------

_ints = st.integers(min_value=-2, max_value=9)
_dims = st.integers(min_value=0, max_value=3)


@st.composite
def _v2_calls(draw: st.DrawFn) -> Call:
    n = draw(_dims)
    size = tuple(draw(_ints) for _ in range(n))
    stride = tuple(draw(_ints) for _ in range(draw(st.sampled_from([n, n, n, n + 1]))))
    stype = draw(st.sampled_from([FLOAT, HALF, Global("torch", "LongStorage"), UNTYPED,
                                  Global("torch", "QUInt4x2Storage"), Global("torch", "BoolStorage")]))
    key = draw(st.sampled_from(["0", "1", "2"]))
    numel = draw(st.integers(min_value=-1, max_value=40))
    offset = draw(st.one_of(_ints, st.just(0.5)))
    rg = draw(st.sampled_from([False, True, 0]))
    return v2(pid(key, stype, numel), offset, size, stride, rg)


def _as_json(an: Analysis) -> Any:
    return ([tuple(t) for t in an.tensors], [tuple(s) for s in an.storages],
            [(f.code, f.message) for f in an.findings])


@settings(max_examples=300, deadline=None)
@given(st.lists(_v2_calls(), min_size=1, max_size=6), st.sampled_from([None, 8, 16, 1000]))
def test_fast_path_equals_general_path(calls: list[Call], record_size: int | None) -> None:
    sizes = {"0": record_size} if record_size is not None else {}
    fast = manifest({f"t{i}": c for i, c in enumerate(calls)}, Sites(sizes))
    original = tensors._Builder.fast_v2
    try:
        tensors._Builder.fast_v2 = lambda self, path, call: False  # type: ignore[method-assign]
        slow = manifest({f"t{i}": c for i, c in enumerate(calls)}, Sites(sizes))
    finally:
        tensors._Builder.fast_v2 = original  # type: ignore[method-assign]
    assert _as_json(fast) == _as_json(slow)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.text(max_size=3), st.binary(max_size=3),
                  st.sampled_from([FLOAT, HALF, UNTYPED, Global("torch", "float32"), Global("torch", "Size"),
                                   Global("torch", "per_channel_affine"), Global("torch", "sparse_coo")]))
_rebuilders = st.sampled_from(sorted(tensors.REBUILDERS, key=lambda g: g.full))


def _graphs() -> st.SearchStrategy[Any]:
    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        tup = st.lists(children, max_size=9).map(tuple)
        return st.one_of(
            tup, st.lists(children, max_size=4), st.dictionaries(st.text(max_size=2), children, max_size=3),
            st.builds(lambda f, a: Call(f, a), _rebuilders, tup),
            st.builds(lambda f, a: Call(f, a), st.one_of(_leaf, children), children),
            st.builds(lambda p: PersId(p), st.one_of(tup, children)),
            st.builds(lambda k, s, n, x: PersId(("storage", s, k, "cpu", n, *x)),
                      st.sampled_from(["0", "1"]), st.one_of(_leaf, children), st.integers(-1, 30),
                      st.lists(children, max_size=1)),
        )
    return st.recursive(_leaf, extend, max_leaves=40)


@settings(max_examples=400, deadline=None)
@given(_graphs())
def test_any_graph_gives_a_manifest_never_a_crash(root: Any) -> None:
    an = manifest(root)
    for f in an.findings:
        assert f.code in (Code.TORCH_BAD_TENSOR_ARGS, Code.TORCH_TENSOR_OUT_OF_BOUNDS,
                          Code.TORCH_RECORD_SIZE_MISMATCH)
    for t in an.tensors:
        assert t.nbytes >= 0 and t.name == ".".join(map(str, t.path))


def test_old_rebuild_tensor_and_device_wrappers() -> None:
    old = Call(Global(U, "_rebuild_tensor"), (pid(), 1, (5,), (1,)))
    dev = Call(Global(U, "_rebuild_device_tensor_from_cpu_tensor"),
               (v2(pid("1", HALF, 4), 0, (4,), (1,)), Global("torch", "float16"), "xla:0", True))
    npy = Call(Global(U, "_rebuild_device_tensor_from_numpy"),
               (Call(Global("numpy.core.multiarray", "_reconstruct"), ()), Global("torch", "int8"), "xla",
                False))
    an = manifest({"old": old, "dev": dev, "np": npy})
    got = [(t.name, t.kind, t.dtype, t.storage, t.data_offset, t.nbytes, t.requires_grad) for t in an.tensors]
    assert got == [("old", "tensor", "float32", "0", 1004, 20, False),
                   ("dev", "tensor", "float16", "1", 1100, 8, True),
                   ("np", "numpy", "int8", None, None, 0, False)]
    assert an.findings == []


def test_device_copies_flag_values_that_are_not_the_stored_bytes() -> None:
    def copy(dtype: str, device: object) -> Call:
        return Call(Global(U, "_rebuild_device_tensor_from_cpu_tensor"),
                    (v2(pid("1", HALF, 4), 0, (4,), (1,)), Global("torch", dtype), device, False))

    meta = Call(Global("torch", "device"), ("meta",))
    an = manifest({"same": copy("float16", "cpu"), "wider": copy("float32", "cuda:0"),
                   "meta": copy("float16", meta), "both": copy("int8", "meta:0")})
    got = [(t.name, t.dtype, t.storage, t.data_offset, t.nbytes, tuple(t.flags)) for t in an.tensors]
    assert got == [("same", "float16", "1", 1100, 8, ()), ("wider", "float16", "1", 1100, 8, ("to:float32",)),
                   ("meta", "float16", "1", 1100, 8, ("to:meta",)),
                   ("both", "float16", "1", 1100, 8, ("to:int8", "to:meta"))]
    assert an.findings == []


def test_sparse_coo_legacy_three_tuple_and_bad_data() -> None:
    layout = Global("torch", "sparse_coo")
    ok = Call(Global(U, "_rebuild_sparse_tensor"),
              (layout, (v2(pid("0", Global("torch", "LongStorage"), 4), 0, (2, 2), (2, 1)),
                        v2(pid("1", FLOAT, 2), 0, (2,), (1,)), (3, 3))))
    bad = Call(Global(U, "_rebuild_sparse_tensor"), (layout, (v2(),)))
    an = manifest({"s": ok, "b": bad})
    assert [t.name for t in an.tensors] == ["s", "s.indices", "s.values"]
    assert an.tensors[0].dtype == "float32" and an.tensors[0].shape == [3, 3]
    assert codes(an) == [Code.TORCH_BAD_TENSOR_ARGS]
