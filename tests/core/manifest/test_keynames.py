"""Names of dict keys that are not plain data (core.manifest.build.segment / key_text).

The rule (core/manifest/build.py, "names of keys"): a key's segment is what a user writes to index
the loaded object — `str`/`int` as is, `bytes` decoded latin-1, anything else `repr()` of
the object torch would build, computed from the value graph; never a node's own repr (which
holds a file offset). tests/differential/test_manifest_vs_torch.py checks the same rule
against torch.load on torch-written files.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.manifest.build import NoStorages, build_manifest
from ckptguard.core.manifest.keynames import key_text, segment
from ckptguard.core.pickle.fast.stubs import GlobalStub, StubMeta
from ckptguard.core.state import Analysis
from ckptguard.core.values import Buffer, Call, ExtRef, Global, PersId, Unhashable

V2 = Global("torch._utils", "_rebuild_tensor_v2")
OD = Global("collections", "OrderedDict")
COUNTER = Global("collections", "Counter")
DEFAULTDICT = Global("collections", "defaultdict")
ENCODE = Global("_codecs", "encode")
DEVICE = Global("torch", "device")
SIZE = Global("torch", "Size")
LAYOUT = Global("torch.serialization", "_get_layout")
FROZENSET = Global("builtins", "frozenset")


def v2(offset: int = 100) -> Call:
    pid = PersId(("storage", Global("torch", "FloatStorage"), "0", "cpu", 4))
    return Call(V2, (pid, 0, (2,), (1,), False, Call(OD, ())), offset=offset)


def names(root: Any) -> list[str]:
    an = Analysis()
    build_manifest(root, NoStorages(), an)
    assert all(t.name == ".".join(map(str, t.path)) for t in an.tensors)
    return [t.name for t in an.tensors]


def call(func: Global, *args: Any, offset: int = 310, opcode: str = "REDUCE") -> Call:
    return Call(func, args, opcode, offset)


def repr_id(v: Any) -> str:
    return repr(v)[:20]


# ---- plain keys: unchanged (core.lane.torch_zip relies on them) -------------------------------------------


@pytest.mark.parametrize(("key", "want"), [
    ("w", "w"), ("", ""), (3, 3), (-1, -1), (b"k\xff", "kÿ"), (b"", ""), (1.5, "1.5"),
    (float("nan"), "nan"), (True, "True"), (None, "None"), (2**13999, 2**13999)], ids=repr_id)
def test_plain_keys_unchanged(key: Any, want: Any) -> None:
    got = segment(key)
    assert got == want and type(got) is type(want)


def test_int_past_the_str_limit_is_named_by_size_not_a_crash() -> None:
    big = 2**20000
    assert segment(big) == "<int of 20001 bits>"
    assert key_text((big, 1)) == "(<int of 20001 bits>, 1)"
    # both the inline _rebuild_tensor_v2 path and the general one build names
    assert names({big: v2(), "x": {big: Call(V2, (None,))}}) == ["<int of 20001 bits>"]


# ---- the tester's report (r5.pt) --------------------------------------------------------------------


def test_reported_keys() -> None:
    root = {"c": call(COUNTER, {"a": v2()}),
            call(ENCODE, "kÿ", "latin1"): v2(),
            Global("torch", "float16"): v2(),
            call(DEVICE, "cpu", offset=457): v2()}
    assert names(root) == ["c.a", "kÿ", "torch.float16", "device(type='cpu')"]


# ---- each node kind -----------------------------------------------------------------------------------


def test_bytes_nodes() -> None:
    assert segment(call(ENCODE, "kÿ", "latin1")) == "kÿ"
    assert segment(call(ENCODE, "k", "latin-1")) == "k"
    assert segment(call(Global("builtins", "bytes"))) == ""
    # inside a tuple, bytes show as repr() does
    assert segment((call(ENCODE, "kÿ", "latin1"), call(Global("builtins", "bytes")))) == "(b'k\\xff', b'')"
    # not latin-1 encodable (torch fails too) or another codec: the stable fallback
    assert segment(call(ENCODE, "Ā", "latin1")) == "_codecs.encode('Ā', 'latin1')"
    assert segment(call(ENCODE, "k", "rot13")) == "_codecs.encode('k', 'rot13')"


def test_globals_and_fastpath_stubs() -> None:
    assert segment(Global("torch", "bfloat16")) == "torch.bfloat16"
    assert segment(Global("torch", "per_channel_affine")) == "torch.per_channel_affine"
    stub = StubMeta("float16", (GlobalStub,), {"node": Global("torch", "float16")})
    assert segment(stub) == "torch.float16"
    assert segment(("a", stub)) == "('a', torch.float16)"


@pytest.mark.parametrize(("args", "want"), [
    (("cpu",), "device(type='cpu')"),
    (("cuda", 1), "device(type='cuda', index=1)"),
    (("cuda:1",), "device(type='cuda', index=1)"),
    (("cpu:0",), "device(type='cpu', index=0)"),
    (("cuda", None), "device(type='cuda')"),
    (("meta",), "device(type='meta')"),
    # torch refuses these: the fallback, still without offsets
    (("CPU",), "torch.device('CPU')"),
    (("cuda:01",), "torch.device('cuda:01')"),
    (("cuda", -1), "torch.device('cuda', -1)"),
    (("cuda", True), "torch.device('cuda', True)"),
    (("cuda:1", 1), "torch.device('cuda:1', 1)"),
    (("cuda", 200), "torch.device('cuda', 200)"),
])
def test_device(args: tuple[Any, ...], want: str) -> None:
    assert segment(call(DEVICE, *args)) == want


def test_size_layout_complex() -> None:
    assert segment(call(SIZE, (2, 3))) == "torch.Size([2, 3])"
    assert segment(call(SIZE, ())) == "torch.Size([])"
    assert segment(call(SIZE, ("a",))) == "torch.Size(('a',))"
    assert segment(call(LAYOUT, "torch.sparse_csr")) == "torch.sparse_csr"
    assert segment(call(LAYOUT, "torch.evil")) == "torch.serialization._get_layout('torch.evil')"
    assert segment(call(Global("builtins", "complex"), 1.0, 2.0)) == "(1+2j)"


def test_sets() -> None:
    assert segment(call(FROZENSET, [3, 1, 2])) == repr(frozenset([3, 1, 2]))
    mixed = [100, 8, 1.5, (1, 2), True]
    assert segment(call(FROZENSET, mixed)) == repr(frozenset(mixed))
    assert segment(call(FROZENSET)) == "frozenset()"
    assert segment(frozenset({2, 1})) == repr(frozenset({2, 1}))    # the FROZENSET opcode
    # salted hashes: sorted by text, so every process names it the same
    assert segment(call(FROZENSET, ["y", "x", b"z"])) == "frozenset({'x', 'y', b'z'})"
    assert segment(frozenset({"b", "a"})) == "frozenset({'a', 'b'})"
    assert segment(call(FROZENSET, [float("nan"), 1])) == "frozenset({1, nan})"
    assert segment((call(Global("builtins", "set"), [1]),)) == "({1},)"


@pytest.mark.timeout(20)   # the same tuple 50k times took 26 s when walked per member
def test_set_members_are_one_per_object_and_many_are_counted() -> None:
    big = tuple(range(9_000))
    assert segment(call(FROZENSET, [big] * 50_000)) == repr(frozenset([big]))[:1_000] + "..."
    assert segment(call(FROZENSET, list(range(300)))) == "frozenset(<300 members>)"
    assert segment(call(FROZENSET, list(range(256)))) == repr(frozenset(range(256)))[:1_000] + "..."


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: st.tuples(inner) | st.tuples(inner, inner) | st.tuples(inner, inner, inner),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.tuples(_plain) | st.tuples(_plain, _plain) | st.tuples())
def test_plain_tuples_render_as_repr(key: tuple[Any, ...]) -> None:
    assert segment(key) == repr(key)


def test_fallback_is_stable_and_offset_free() -> None:
    def key(offset: int) -> Call:
        inner = Call(Global("mod", "Thing"), (1, "a", Global("torch", "float16")), "NEWOBJ", offset)
        inner.state.append({"ignored": 1})
        return Call(Global("mod", "make"), (inner, [b"x"], {"k": None}), "NEWOBJ_EX", offset + 5,
                    {"flag": True})
    want = "mod.make(mod.Thing(1, 'a', torch.float16), [b'x'], {'k': None}, flag=True)"
    assert segment(key(310)) == segment(key(9999)) == want
    assert names({key(1): v2(), key(2): v2()}) == [want, want]
    pid = PersId(("storage", Global("torch", "FloatStorage"), "0", "cpu", 4), offset=77)
    assert segment((pid, ExtRef(7, 9), Buffer(True, 3), Unhashable([1, {2: 3}]))) == (
        "(persistent_load(('storage', torch.FloatStorage, '0', 'cpu', 4)), <extension 7>, "
        "<out-of-band buffer>, [1, {2: 3}])")
    assert segment(Call(call(Global("m", "f"), offset=1), "odd", offset=2)) == "m.f()(*'odd')"
    assert segment(Call(Global("m", "f"), (1,), kwargs=[2])) == "m.f(1, **[2])"
    assert "@" not in segment(v2(offset=12345))


def test_hostile_keys_are_bounded() -> None:
    dag: Any = (1,)
    for _ in range(200):          # 2**200 leaves, 200 distinct tuples
        dag = (dag, dag)
    start = time.perf_counter()
    text = segment(dag)
    assert isinstance(text, str) and len(text) <= 1003 and text.endswith("...")
    deep: Any = 1
    for _ in range(100):
        deep = (deep,)
    assert "..." in key_text(deep)
    assert segment(call(FROZENSET, [dag, dag, "a" * 5000])).endswith("...")
    assert segment(call(FROZENSET, [dag])).endswith("...")      # no 2**200 hashing either
    assert len(segment("x" * 5000)) == 5000                    # str keys are never cut
    assert time.perf_counter() - start < 2


# ---- dict types built with their items as an argument -----------------------------------------------


def test_counter_and_ordered_dict_items_are_named_by_key() -> None:
    root = {"c": call(COUNTER, {"a": v2(), Global("torch", "float16"): v2()}),
            "o": call(OD, [("x", v2()), [call(ENCODE, "y", "latin1"), v2()]]),
            "d": call(DEFAULTDICT, Global("builtins", "list"), {"q": v2()}),
            "t": call(OD, (("p", v2()),)),
            "l": Call(COUNTER, [{"k": v2()}], offset=5)}     # REDUCE with a list of arguments
    assert names(root) == ["c.a", "c.torch.float16", "o.x", "o.y", "d.q", "t.p", "l.k"]


def test_items_come_first_then_setitems_then_attributes() -> None:
    od = call(OD, [("a", v2())])
    od.setitems.append(("b", v2()))
    od.state.append({"attr": v2()})
    assert names({"od": od}) == ["od.a", "od.b", "od.attr"]


def test_other_arguments_keep_their_index() -> None:
    dd = call(DEFAULTDICT, v2(), {"q": v2()})      # a tensor as the factory: still listed
    assert names({"d": dd}) == ["d.q", "d.0"]
    two = call(COUNTER, {"a": v2()}, v2())          # not Counter(mapping): no items rule
    assert names({"c": two}) == ["c.0.a", "c.1"]


def test_newobj_ignores_the_arguments() -> None:
    # NEWOBJ runs dict.__new__, which drops its arguments: the object torch returns holds
    # none of them (their storages are still loaded: the storage list has them), as the
    # fast paths' C unpickler builds it
    od = call(OD, {"a": v2()}, opcode="NEWOBJ")
    assert names({"od": od}) == []
    assert names({"od": call(OD, {"a": v2()}, opcode="REDUCE")}) == ["od.a"]


def test_counter_without_items() -> None:
    assert names({"c": call(COUNTER), "n": call(COUNTER, None), "s": call(COUNTER, "abc")}) == []


def test_matches_python_for_a_real_counter() -> None:
    """The items rule is what Python builds: Counter(mapping) holds mapping's items."""
    mapping = {"a": 1, ("t", 2): 2}
    assert list(Counter(mapping)) == list(mapping)
