"""Hand-made data.pkl cases for the weights-only emulator, built with pickle_asm.

Each case: (name, pickle bytes, records {name: bytes}, allow [names]). The differential
test runs every case through real torch 2.13 and through `emulate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.builders.pickle_asm import asm

Items = list[Any]
P2: Items = [("PROTO", 2)]


@dataclass
class Case:
    name: str
    pkl: bytes
    records: dict[str, bytes] = field(default_factory=dict)
    allow: list[str] = field(default_factory=list)


def g(full: str) -> tuple[str, str, str]:
    module, _, name = full.rpartition(".")
    return ("GLOBAL", module, name)


def ints(values: tuple[int, ...]) -> Items:
    if not values:
        return ["EMPTY_TUPLE"]
    return ["MARK", *[("BININT", v) for v in values], "TUPLE"]


def pid(storage: str = "torch.FloatStorage", key: str = "0", loc: str = "cpu", numel: int = 4) -> Items:
    return ["MARK", ("BINUNICODE", "storage"), g(storage), ("BINUNICODE", key), ("BINUNICODE", loc),
            ("BININT", numel), "TUPLE", "BINPERSID"]


def od() -> Items:
    return [g("collections.OrderedDict"), "EMPTY_TUPLE", "REDUCE"]


def v2(p: Items, off: int = 0, size: tuple[int, ...] = (4,), stride: tuple[int, ...] = (1,),
       rg: Any = "NEWFALSE", extra: Items | None = None) -> Items:
    return [g("torch._utils._rebuild_tensor_v2"), "MARK", *p, ("BININT", off), *ints(size),
            *ints(stride), rg, *od(), *(extra or []), "TUPLE", "REDUCE"]


def call(full: str, *args: Items) -> Items:
    flat: Items = [x for a in args for x in a]
    return [g(full), "MARK", *flat, "TUPLE", "REDUCE"]


def s(text: str) -> Items:
    return [("BINUNICODE", text)]


def i(n: int) -> Items:
    return [("BININT", n)]


def pk(*items: Any) -> bytes:
    return asm(*P2, *items, "STOP")


F16 = b"\0" * 16
CASES: list[Case] = []


def add(name: str, pkl: bytes, records: dict[str, bytes] | None = None,
        allow: list[str] | None = None) -> None:
    CASES.append(Case(name, pkl, records or {}, allow or []))


# §3.2 GLOBAL policy
for full in ("os.system", "posix.system", "nt.system", "sys.exit", "builtins.eval", "builtinsX.f",
             "builtins.sub.x", "__main__.Foo", "torch.float", "torch.half", "torch.UntypedStorage",
             "numpy.core.multiarray._reconstruct", "numpy.dtype", "copy_reg._reconstructor",
             "UserDict.UserDict", "itertools.izip", "exceptions.StandardError", "__builtin__.eval",
             "__builtin__.intern", "__builtin__.long", "torch._dynamo.decorators._DimRange",
             "torch.distributed.tensor.DTensor", "torch.distributed.device_mesh.DeviceMesh",
             "os.path.join", "subprocess.Popen", "builtins.getattr", "argparse.Namespace",
             "torch.nested._internal.nested_tensor.NestedTensor",
             "torch.distributed._mesh_layout._MeshLayout", "torch.float32", "torch.FloatStorage",
             "torch.cuda.sparse.FloatTensor", "torch.per_channel_affine", "torch.storage.UntypedStorage",
             "torch._utils._rebuild_qtensor", "torch.uint3", "torch.int7", "collections.Counter"):
    add(f"global:{full}", pk(g(full)))
add("global:bad-utf8", asm(*P2, ("RAW", b"c\xff\nx\n"), "STOP"))
add("global:no-newline", asm(*P2, ("RAW", b"cos")))
add("allow:namespace", pk(g("argparse.Namespace"), "EMPTY_TUPLE", "NEWOBJ", "EMPTY_DICT", "BUILD"),
    allow=["argparse.Namespace"])
add("allow:namespace-setitem", pk(g("argparse.Namespace"), "EMPTY_TUPLE", "NEWOBJ", *s("a"), *i(1),
                                  "SETITEM"), allow=["argparse.Namespace"])
add("allow:slice", pk(g("builtins.slice"), "MARK", *i(1), *i(2), "TUPLE", "REDUCE"),
    allow=["builtins.slice"])
add("allow:blocked-stays", pk(g("os.getcwd")), allow=["os.getcwd"])

# §3.4 opcodes
for name, body in (("INT", [("INT", 5)]), ("DICT", ["MARK", "DICT"]), ("LIST", ["MARK", "LIST"]),
                   ("BINBYTES", [("BINBYTES", b"ab")]), ("SHORT_BINBYTES", [("SHORT_BINBYTES", b"a")]),
                   ("SHORT_BINUNICODE", [("SHORT_BINUNICODE", "a")]),
                   ("STACK_GLOBAL", [*s("os"), *s("system"), "STACK_GLOBAL"]),
                   ("MEMOIZE", ["EMPTY_DICT", "MEMOIZE"]), ("BINSTRING", [("BINSTRING", b"ab")]),
                   ("LONG4", [("LONG4", 5)]), ("NEWOBJ_EX", ["NEWOBJ_EX"]), ("INST", [("INST", "a", "b")]),
                   ("POP", ["NONE", "POP", "NONE"]), ("DUP", ["NONE", "DUP"]), ("FLOAT", [("FLOAT", 1.5)])):
    add(f"op:{name}", pk(*body))
add("op:FRAME", asm(("PROTO", 4), ("FRAME", 2), "EMPTY_DICT", "STOP"))
add("proto:3", asm(("PROTO", 3), "EMPTY_DICT", "STOP"))
add("proto:none", asm("EMPTY_DICT", "STOP"))
add("leftover-stack", pk("NONE", "EMPTY_LIST"))
add("trailing-bytes", pk("EMPTY_DICT") + b"garbage")
add("eof", asm(*P2, "EMPTY_DICT"))
add("empty", b"")
add("memo:unknown", pk(("BINGET", 5)))
add("memo:long-unknown", pk(("LONG_BINGET", 70000)))
add("memo:ok", pk("EMPTY_DICT", ("BINPUT", 0), "POP" if False else "NONE", ("BINGET", 0)))
add("stop:empty", asm(*P2, "STOP"))
add("binfloat", pk(("BINFLOAT", 1.5)))
add("long1", pk(("LONG1", 10**30)))
add("short_binstring:bad", pk(("SHORT_BINSTRING", b"\xff\xfe")))
add("short_binstring:ok", pk(("SHORT_BINSTRING", b"abc")))
add("binunicode:surrogate", pk(("BINUNICODE", b"\xed\xa0\x80")))
add("binunicode:bad", pk(("BINUNICODE", b"\xff")))
add("binint:truncated", asm(*P2, ("RAW", b"J\x01\x02")))
add("binunicode:short", asm(*P2, ("RAW", b"X\x10\x00\x00\x00ab")))
add("binint1:truncated", asm(*P2, ("RAW", b"K")))
add("tuple1:empty", pk("TUPLE1"))
add("tuple2:one", pk("NONE", "TUPLE2"))
add("tuple3:mark", pk("NONE", "NONE", "MARK", "NONE", "TUPLE3"))
add("appends:nomark", pk("EMPTY_LIST", "APPENDS"))
add("setitem:empty", pk("NONE", "NONE", "SETITEM"))
add("binput:empty", pk(("BINPUT", 1)))
add("mark:stop", pk("EMPTY_DICT", "MARK"))

# §3.5 stack rules
add("setitem:list", pk("EMPTY_LIST", *s("a"), *i(1), "SETITEM"))
add("setitems:tuple", pk("EMPTY_TUPLE", "MARK", *s("a"), *i(1), "SETITEMS"))
add("setitem:set", pk("EMPTY_SET", *s("a"), *i(1), "SETITEM"))
add("setitem:od", pk(*od(), *s("a"), *i(1), "SETITEM"))
add("setitems:counter", pk(g("collections.Counter"), "EMPTY_TUPLE", "REDUCE", "MARK", *s("a"), *i(1),
                           "SETITEMS"))
add("setitem:size", pk(*call("torch.Size", ints((1, 2))), *s("a"), *i(1), "SETITEM"))
add("setitem:global", pk(g("torch.float32"), *s("a"), *i(1), "SETITEM"))
add("setitem:storage", pk(*pid(), *s("a"), *i(1), "SETITEM"), {"data/0": F16})
add("append:dict", pk("EMPTY_DICT", "NONE", "APPEND"))
add("appends:tuple", pk("EMPTY_TUPLE", "MARK", "NONE", "APPENDS"))
add("append:list", pk("EMPTY_LIST", "NONE", "APPEND", "MARK", *i(1), *i(2), "APPENDS"))
add("append:od", pk(*od(), "NONE", "APPEND"))
add("build:dict", pk("EMPTY_DICT", "EMPTY_DICT", "BUILD"))
add("build:list", pk("EMPTY_LIST", "EMPTY_DICT", "BUILD"))
add("build:int", pk(*i(3), "EMPTY_DICT", "BUILD"))
add("build:od", pk(*od(), "EMPTY_DICT", *s("_metadata"), "EMPTY_DICT", "SETITEM", "BUILD"))
add("build:dtype", pk(g("torch.float32"), "EMPTY_DICT", "BUILD"))
add("build:class", pk(g("collections.OrderedDict"), "EMPTY_DICT", "BUILD"))
add("build:storagetype", pk(g("torch.FloatStorage"), "EMPTY_DICT", "BUILD"))
add("build:function", pk(g("torch._utils._rebuild_tensor"), "EMPTY_DICT", "BUILD"))
add("build:tensortype", pk(g("torch.FloatTensor"), "EMPTY_DICT", "BUILD"))
add("newobj:int", pk(*i(5), "EMPTY_TUPLE", "NEWOBJ"))
add("newobj:str", pk(*s("abc"), "EMPTY_TUPLE", "NEWOBJ"))
add("newobj:list", pk("EMPTY_LIST", "EMPTY_TUPLE", "NEWOBJ"))
add("newobj:od", pk(g("collections.OrderedDict"), "EMPTY_TUPLE", "NEWOBJ", *s("a"), *i(1), "SETITEM"))
add("reduce:str", pk(*s("abc"), "EMPTY_TUPLE", "REDUCE"))
add("reduce:none", pk("NONE", "EMPTY_TUPLE", "REDUCE"))
add("reduce:dict", pk("EMPTY_DICT", "EMPTY_TUPLE", "REDUCE"))
add("reduce:tuple", pk("MARK", *i(1), *s("x"), "TUPLE", "EMPTY_TUPLE", "REDUCE"))
add("persid:list", pk("EMPTY_LIST", "BINPERSID"))
add("persid:str", pk(*s("storage"), "BINPERSID"))
add("persid:dict", pk("EMPTY_DICT", "BINPERSID"))
add("persid:int", pk(*i(5), "BINPERSID"))
add("persid:empty", pk("EMPTY_TUPLE", "BINPERSID"))
add("persid:foo", pk(*s("foo"), "TUPLE1", "BINPERSID"))
add("persid:int-tag", pk(*i(5), "TUPLE1", "BINPERSID"))
add("persid:short", pk("MARK", *s("storage"), *i(1), *i(2), "TUPLE", "BINPERSID"))
add("persid:long", pk("MARK", *s("storage"), *i(1), *i(2), *i(3), *i(4), *i(5), "TUPLE", "BINPERSID"))
add("persid:str-type", pk("MARK", *s("storage"), *s("x"), *s("0"), *s("cpu"), *i(4), "TUPLE", "BINPERSID"))
add("persid:none-type", pk("MARK", *s("storage"), "NONE", *s("0"), *s("cpu"), *i(4), "TUPLE",
                           "BINPERSID"))
add("persid:bytes-tag", pk("MARK", *call("_codecs.encode", s("storage"), s("latin1")),
                           g("torch.FloatStorage"),
                           *s("0"), *s("cpu"), *i(4), "TUPLE", "BINPERSID"), {"data/0": F16})
add("setitem:unhashable", pk("EMPTY_DICT", "EMPTY_LIST", *i(1), "SETITEM"))
add("setitem:unhashable-tuple", pk("EMPTY_DICT", "EMPTY_LIST", "TUPLE1", *i(1), "SETITEM"))
add("setitem:od-key", pk("EMPTY_DICT", *od(), *i(1), "SETITEM"))
add("setitems:odd", pk("EMPTY_DICT", "MARK", *s("a"), *i(1), *s("b"), "SETITEMS"))
add("set:unhashable", pk(*call("builtins.set", ["EMPTY_LIST", "EMPTY_LIST", "APPEND"])))

# storages and tensors (§2.2-§2.6, §1.1 record checks)
add("tensor:ok", pk(*v2(pid())), {"data/0": F16})
add("tensor:missing-record", pk(*v2(pid())))
add("tensor:size-mismatch", pk(*v2(pid())), {"data/0": b"\0" * 8})
add("tensor:v3-untyped", pk(g("torch._utils._rebuild_tensor_v3"), "MARK",
                            *pid("torch.storage.UntypedStorage", numel=16), *i(0), *ints((8,)), *ints((1,)),
                            "NEWFALSE", *od(), g("torch.float16"), "TUPLE", "REDUCE"), {"data/0": F16})
add("tensor:v3-bounds", pk(g("torch._utils._rebuild_tensor_v3"), "MARK",
                           *pid("torch.storage.UntypedStorage", numel=16), *i(0), *ints((9,)), *ints((1,)),
                           "NEWFALSE", *od(), g("torch.float16"), "TUPLE", "REDUCE"), {"data/0": F16})
add("tensor:bounds", pk(*v2(pid(), size=(5,))), {"data/0": F16})
add("tensor:bounds-offset", pk(*v2(pid(), off=1, size=(4,))), {"data/0": F16})
add("tensor:bounds-stride", pk(*v2(pid(), size=(2, 2), stride=(3, 1))), {"data/0": F16})
add("tensor:view-ok", pk(*v2(pid(), off=1, size=(3,))), {"data/0": F16})
add("tensor:negative-offset", pk(*v2(pid(), off=-1, size=(2,))), {"data/0": F16})
add("tensor:negative-stride", pk(*v2(pid(), size=(2,), stride=(-1,))), {"data/0": F16})
add("tensor:len-mismatch", pk(*v2(pid(), size=(2,), stride=(1, 1))), {"data/0": F16})
add("tensor:zero-numel-far", pk(*v2(pid(), off=1000, size=(0,))), {"data/0": F16})
add("tensor:zero-numel-neg", pk(*v2(pid(), off=-3, size=(0,))), {"data/0": F16})
add("tensor:scalar", pk(*v2(pid(), off=3, size=(), stride=())), {"data/0": F16})
add("tensor:stride0", pk(*v2(pid(), size=(100,), stride=(0,))), {"data/0": F16})
add("tensor:rg-long", pk(*v2(pid("torch.LongStorage", numel=2), size=(2,), rg="NEWTRUE")), {"data/0": F16})
add("tensor:rg-float", pk(*v2(pid(), rg="NEWTRUE")), {"data/0": F16})
add("tensor:rg-int", pk(*v2(pid(), rg=("BININT1", 1))), {"data/0": F16})
add("tensor:argc", pk(g("torch._utils._rebuild_tensor_v2"), "MARK", *pid(), *i(0), *ints((4,)), *ints((1,)),
                      "NEWFALSE", "TUPLE", "REDUCE"), {"data/0": F16})
add("tensor:argc-many", pk(g("torch._utils._rebuild_tensor_v2"), "MARK", *pid(), *i(0), *ints((4,)),
                           *ints((1,)), "NEWFALSE", *od(), "NONE", "NONE", "TUPLE", "REDUCE"),
    {"data/0": F16})
add("tensor:storage-int", pk(g("torch._utils._rebuild_tensor_v2"), "MARK", *i(5), *i(0), *ints((4,)),
                             *ints((1,)), "NEWFALSE", *od(), "TUPLE", "REDUCE"))
add("tensor:v1", pk(g("torch._utils._rebuild_tensor"), "MARK", *pid(), *i(0), *ints((2, 2)), *ints((2, 1)),
                    "TUPLE", "REDUCE"), {"data/0": F16})
add("tensor:v1-bounds", pk(g("torch._utils._rebuild_tensor"), "MARK", *pid(), *i(0), *ints((2, 3)),
                           *ints((3, 1)), "TUPLE", "REDUCE"), {"data/0": F16})
add("tensor:shared-key", pk("EMPTY_LIST", "MARK", *v2(pid()), *v2(pid(numel=4), off=2, size=(2,)),
                            "APPENDS"), {"data/0": F16})
add("tensor:reuse-first-dtype", pk("EMPTY_LIST", "MARK", *v2(pid()),
                                   *v2(pid("torch.DoubleStorage", numel=2), size=(3,)), "APPENDS"),
    {"data/0": F16})
add("tensor:key-not-0", pk(*v2(pid(key="7"))), {"data/7": F16})
add("tensor:int-key", pk("MARK", *s("storage"), g("torch.FloatStorage"), *i(0), *s("cpu"), *i(4), "TUPLE",
                         "BINPERSID"), {"data/0": F16})
add("tensor:zero-bytes", pk(*v2(pid(numel=0), size=(0,))), {"data/0": b""})
add("tensor:zero-bytes-missing", pk(*v2(pid(numel=0), size=(0,))))
add("tensor:byte-storage-size", pk(*pid("torch.ByteStorage", numel=10)), {"data/0": F16})
add("tensor:meta-conj", pk(*v2(pid("torch.ComplexFloatStorage", numel=2), size=(2,),
                               extra=["EMPTY_DICT", *s("conj"), "NEWTRUE", "SETITEM"])), {"data/0": F16})
add("tensor:meta-list", pk(*v2(pid(), extra=["EMPTY_LIST", *i(1), "APPEND"])), {"data/0": F16})
add("param:ok", pk(*call("torch._utils._rebuild_parameter", v2(pid()), ["NEWTRUE"], od())), {"data/0": F16})
add("param:long-rg", pk(*call("torch._utils._rebuild_parameter",
                             v2(pid("torch.LongStorage", numel=2), size=(2,)), ["NEWTRUE"], od())),
    {"data/0": F16})
add("param:not-tensor", pk(*call("torch._utils._rebuild_parameter", i(5), ["NEWFALSE"], od())))
add("param:rg-none", pk(*call("torch._utils._rebuild_parameter", v2(pid()), ["NONE"], od())), {"data/0": F16})

# allowlisted callables with odd arguments
add("device:bogus", pk(*call("torch.device", s("bogus"))))
add("device:cpu", pk(*call("torch.device", s("cpu"))))
add("device:cuda1", pk(*call("torch.device", s("cuda"), i(1))))
add("device:none", pk(g("torch.device"), "EMPTY_TUPLE", "REDUCE"))
add("layout:bad", pk(*call("torch.serialization._get_layout", s("bad"))))
add("layout:int", pk(*call("torch.serialization._get_layout", i(5))))
add("layout:coo", pk(*call("torch.serialization._get_layout", s("torch.sparse_coo"))))
add("od:int", pk(*call("collections.OrderedDict", i(5))))
add("counter:int", pk(*call("collections.Counter", i(5))))
add("set:int", pk(*call("builtins.set", i(5))))
add("set:two", pk(*call("builtins.set", ["EMPTY_LIST"], ["EMPTY_LIST"])))
add("set:ok", pk(*call("builtins.set", ["EMPTY_LIST", *i(1), "APPEND"])))
add("complex:ok", pk(*call("builtins.complex", [("BINFLOAT", 1.0)], [("BINFLOAT", 2.0)])))
add("complex:three", pk(*call("builtins.complex", i(1), i(2), i(3))))
add("bytearray:str", pk(*call("builtins.bytearray", s("abc"))))
add("bytearray:ok", pk(*call("builtins.bytearray", call("_codecs.encode", s("ab"), s("latin1")))))
add("encode:bad", pk(*call("_codecs.encode", s("\u20ac"), s("latin1"))))
add("size:str-item", pk(*call("torch.Size", ["EMPTY_LIST", *s("a"), "APPEND"])))
add("size:int", pk(*call("torch.Size", i(5))))
add("size:ok", pk(*call("torch.Size", ints((2, 3)))))
add("call:dtype", pk(g("torch.float32"), "EMPTY_TUPLE", "REDUCE"))
add("call:qscheme", pk(g("torch.per_tensor_affine"), "EMPTY_TUPLE", "REDUCE"))
add("call:storagetype", pk(g("torch.FloatStorage"), "EMPTY_TUPLE", "REDUCE"))
add("call:args-int", pk(g("torch.serialization._get_layout"), *i(5), "REDUCE"))
add("call:args-none-od", pk(g("collections.OrderedDict"), "NONE", "REDUCE"))

# composite rebuilders and object state
QS = "torch.QUInt8Storage"


def qt(params: Items, size: tuple[int, ...] = (4,)) -> Items:
    return call("torch._utils._rebuild_qtensor", pid(QS, numel=4), i(0), ints(size), ints((1,) * len(size)
                                                                                             if size else ()),
                params, ["NEWFALSE"], od())


add("qtensor:ok", pk(*qt(["MARK", g("torch.per_tensor_affine"), ("BINFLOAT", 0.5), *i(3), "TUPLE"])),
    {"data/0": b"\0" * 4})
add("qtensor:bounds", pk(*qt(["MARK", g("torch.per_tensor_affine"), ("BINFLOAT", 0.5), *i(3), "TUPLE"],
                             size=(5,))), {"data/0": b"\0" * 4})
add("qtensor:axis", pk(*qt(["MARK", g("torch.per_channel_affine"), "NONE", "NONE", *i(3), "TUPLE"])),
    {"data/0": b"\0" * 4})
add("qtensor:float-storage", pk(*call("torch._utils._rebuild_qtensor", pid(), i(0), ints((4,)), ints((1,)),
                                      ["MARK", g("torch.per_tensor_affine"), ("BINFLOAT", 0.5), *i(3),
                                       "TUPLE"], ["NEWFALSE"], od())), {"data/0": F16})
# sub-byte quantized storages: bounds are ceil(elements / per-byte) bytes (torch 2.13)
for storage, per_byte in (("torch.QUInt4x2Storage", 2), ("torch.QUInt2x4Storage", 4)):
    for n, off, stride, nbytes in ((6, 0, 1, 3), (7, 0, 1, 3), (6, 1, 1, 3), (1, 5, 1, 3),
                                   (1, 6, 1, 3), (4, 0, 3, 3), (12, 0, 1, 3), (13, 0, 1, 3),
                                   (8, 0, 1, 2), (9, 0, 1, 2)):
        add(f"qtensor:packed-{per_byte}-{n}-{off}-{stride}-{nbytes}", pk(*call(
            "torch._utils._rebuild_qtensor", pid(storage, numel=nbytes), i(off), ints((n,)),
            ints((stride,)), ["MARK", g("torch.per_tensor_affine"), ("BINFLOAT", 0.5), *i(3), "TUPLE"],
            ["NEWFALSE"], od())), {"data/0": b"\0" * nbytes})
# per-channel qparams as tensors: which dtypes torch accepts for scales / zero points
_TENSOR_OF = {"f64": "torch.DoubleStorage", "f32": "torch.FloatStorage", "f16": "torch.HalfStorage",
              "bf16": "torch.BFloat16Storage", "i64": "torch.LongStorage", "i32": "torch.IntStorage",
              "u8": "torch.ByteStorage", "b": "torch.BoolStorage", "c64": "torch.ComplexFloatStorage"}
_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "u8": 1, "b": 1, "c64": 8}
for scheme in ("torch.per_channel_affine", "torch.per_channel_affine_float_qparams"):
    for sd, zd in (("f64", "i64"), ("f32", "f32"), ("f16", "i32"), ("bf16", "b"), ("f32", "c64"),
                   ("i64", "i64"), ("b", "f32"), ("c64", "f32"), ("u8", "u8")):
        add(f"qtensor:channel-{scheme.rsplit('.', 1)[1]}-{sd}-{zd}", pk(*call(
            "torch._utils._rebuild_qtensor", pid(QS, numel=4), i(0), ints((2, 2)), ints((2, 1)),
            ["MARK", g(scheme), *v2(pid(_TENSOR_OF[sd], key="1", numel=2), size=(2,)),
             *v2(pid(_TENSOR_OF[zd], key="2", numel=2), size=(2,)), *i(0), "TUPLE"],
            ["NEWFALSE"], od())),
            {"data/0": b"\0" * 4, "data/1": b"\0" * 2 * _BYTES[sd], "data/2": b"\0" * 2 * _BYTES[zd]})
add("meta:ok", pk(*call("torch._utils._rebuild_meta_tensor_no_storage", [g("torch.float32")], ints((2, 3)),
                        ints((3, 1)), ["NEWFALSE"])))
add("from_type:attr", pk(*call("torch._tensor._rebuild_from_type_v2", [g("torch._utils._rebuild_tensor_v2")],
                               [g("torch.Tensor")],
                               ["MARK", *pid(), *i(0), *ints((4,)), *ints((1,)), "NEWFALSE", *od(), "TUPLE"],
                               ["EMPTY_DICT", *s("extra"), *i(1), "SETITEM"])), {"data/0": F16})
add("from_type:int-attr", pk(*call("torch._tensor._rebuild_from_type_v2",
                                   [g("torch._utils._rebuild_tensor_v2")], [g("torch.Tensor")],
                                   ["MARK", *pid(), *i(0), *ints((4,)), *ints((1,)), "NEWFALSE", *od(),
                                    "TUPLE"],
                                   ["EMPTY_DICT", *i(5), *i(1), "SETITEM"])), {"data/0": F16})
add("from_type:bounds", pk(*call("torch._tensor._rebuild_from_type_v2",
                                 [g("torch._utils._rebuild_tensor_v2")], [g("torch.Tensor")],
                                 ["MARK", *pid(), *i(0), *ints((9,)), *ints((1,)), "NEWFALSE", *od(),
                                  "TUPLE"], ["NONE"])), {"data/0": F16})
add("param_state:int-attr", pk(*call("torch._utils._rebuild_parameter_with_state", v2(pid()), ["NEWFALSE"],
                                     od(), ["EMPTY_DICT", *i(5), *i(1), "SETITEM"])), {"data/0": F16})
add("param_state:ok", pk(*call("torch._utils._rebuild_parameter_with_state", v2(pid()), ["NEWFALSE"],
                               od(), ["EMPTY_DICT", *s("note"), *s("x"), "SETITEM"])), {"data/0": F16})
add("sparse:ok", pk(*call("torch._utils._rebuild_sparse_tensor",
                          call("torch.serialization._get_layout", s("torch.sparse_coo")),
                          ["MARK", *v2(pid("torch.LongStorage", numel=2), size=(1, 2), stride=(2, 1)),
                           *v2(pid(key="1", numel=2), size=(2,)), *call("torch.Size", ints((3,))),
                           "NEWFALSE", "TUPLE"])),
    {"data/0": F16, "data/1": b"\0" * 8})

for loc in ("bogus", "", "cpu:0", "cudax", "CPU", "meta", "xla:0"):
    add(f"location:{loc}", pk(*v2(pid(loc=loc))), {"data/0": F16})
add("location:missing-record-first", pk(*v2(pid(loc="bogus"))))

add("sparse:strided", pk(*call("torch._utils._rebuild_sparse_tensor",
                               call("torch.serialization._get_layout", s("torch.strided")), ["EMPTY_TUPLE"])))
add("sparse:str-layout", pk(*call("torch._utils._rebuild_sparse_tensor", s("torch.sparse_coo"),
                                  ["EMPTY_TUPLE"])))
add("sparse:list-layout", pk(*call("torch._utils._rebuild_sparse_tensor", ["EMPTY_LIST"], ["EMPTY_TUPLE"])))
add("sparse:csr-odd", pk(*call("torch._utils._rebuild_sparse_tensor",
                               call("torch.serialization._get_layout", s("torch.sparse_csr")),
                               ["MARK", *v2(pid(numel=4)), *v2(pid(numel=4), size=(2,)),
                                *v2(pid(numel=4), size=(3,)), *ints((2, 5)), "TUPLE"])), {"data/0": F16})
add("counter:none", pk(*call("collections.Counter", ["NONE"])))
add("od:none", pk(*call("collections.OrderedDict", ["NONE"])))
