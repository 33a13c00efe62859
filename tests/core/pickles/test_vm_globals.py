"""Hidden globals: memo'd STACK_GLOBAL operands, INST, OBJ, EXT, names, and after truncation."""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

from ckptguard.core.errors import Code
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.values import Call, Global
from tests.builders.pickle_asm import asm


def found(data: bytes) -> list[tuple[str, str]]:
    return [(u.module, u.name) for u in run_vm(data).globals]


def test_stack_global_operands_from_memo() -> None:
    # Strings planted early, memoized, fetched back much later: no "os" next to "system".
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "os"), "MEMOIZE", "POP",
               ("SHORT_BINUNICODE", "sys" + "tem"), ("BINPUT", 9), "POP",
               "EMPTY_LIST", ("BINGET", 0), ("BINGET", 9), "STACK_GLOBAL",
               ("SHORT_BINUNICODE", "id"), "TUPLE1", "REDUCE", "APPEND", "STOP")
    r = run_vm(data)
    assert r.error is None and found(data) == [("os", "system")]
    (call,) = r.calls
    assert call.func == Global("os", "system") and r.root == [call]


def test_stack_global_with_text_memo_and_unicode_escape() -> None:
    data = asm(("UNICODE", "o\x73"), ("PUT", 1), "POP", ("UNICODE", "system"), ("PUT", 2), "POP",
               ("GET", 1), ("GET", 2), "STACK_GLOBAL", "STOP")
    assert found(data) == [("os", "system")]


def test_memoized_global_is_one_use() -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINPUT", 0), "POP",
               ("BINGET", 0), ("BINGET", 0), "TUPLE2", "STOP")
    r = run_vm(data)
    assert len(r.globals) == 1 and r.root == (Global("os", "system"),) * 2


def test_stack_global_non_str_operands() -> None:
    data = asm(("PROTO", 4), ("BININT1", 1), ("SHORT_BINBYTES", b"system"), "STACK_GLOBAL", "STOP")
    r = run_vm(data)
    assert r.complete and r.globals[0].module == "1" and r.globals[0].name == "b'system'"
    assert any(c is Code.PICKLE_NON_ASCII_GLOBAL for c, _m, _o in r.notes)


def test_inst_and_obj_hide_calls() -> None:
    data = asm("MARK", ("STRING", "touch /tmp/x"), ("INST", "os", "system"), "STOP")
    r = run_vm(data)
    assert found(data) == [("os", "system")] and r.calls[0].args == ("touch /tmp/x",)
    data = asm(("PROTO", 1), "MARK", ("GLOBAL", "subprocess", "check_output"),
               "MARK", ("BINUNICODE", "id"), "LIST", "OBJ", "STOP")
    r = run_vm(data)
    assert found(data) == [("subprocess", "check_output")]
    assert r.calls[0].opcode == "OBJ" and r.calls[0].args == (["id"],)


def test_ext_codes_are_noted_not_resolved() -> None:
    r = run_vm(asm(("PROTO", 2), ("EXT2", 0x1234), "EMPTY_TUPLE", "REDUCE", "STOP"))
    assert r.globals == [] and r.calls[0].func.code == 0x1234
    assert r.notes[0][0] is Code.PICKLE_EXTENSION_CODE


def test_globals_before_truncation_survive() -> None:
    full = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "rm -rf /"), "TUPLE1", "REDUCE",
               ("GLOBAL", "builtins", "exec"), "STOP")
    for cut in range(len(full)):
        r = run_vm(full[:cut])
        assert not r.complete and r.error is not None
        assert r.error.code is Code.PICKLE_TRUNCATED, (cut, r.error)
        if cut > 2 + len("cos\nsystem\n") - 1:
            assert ("os", "system") in [(u.module, u.name) for u in r.globals]
        if cut > full.index(b"R"):
            assert len(r.calls) == 1


def test_globals_after_malformed_point_are_not_invented() -> None:
    r = run_vm(asm(("GLOBAL", "os", "system"), "TUPLE2", ("GLOBAL", "os", "popen"), "STOP"))
    assert r.error is not None and r.error.code is Code.PICKLE_MALFORMED
    assert [(u.module, u.name) for u in r.globals] == [("os", "system")]


def test_non_identifier_names_noted() -> None:
    for mod, name in [("os system", "x"), ("os", "sys\ttem"), ("é", "x"), ("os", ""), ("", "x")]:
        r = run_vm(asm(("PROTO", 3), ("GLOBAL", mod, name), "STOP"))
        assert r.complete and r.globals[0].raw_module == mod and r.globals[0].raw_name == name
        assert [c for c, _m, _o in r.notes] == [Code.PICKLE_NON_ASCII_GLOBAL], (mod, name)
    r = run_vm(asm(("PROTO", 4), ("GLOBAL", "torch._utils", "_rebuild_tensor_v2"), "STOP"))
    assert r.notes == []
    r = run_vm(asm(("GLOBAL", b"o\xffs", b"x"), "STOP"))    # not UTF-8
    assert r.complete and r.globals[0].raw_module == "o\\xffs"
    assert {c for c, _m, _o in r.notes} == {Code.PICKLE_NON_ASCII_GLOBAL}


class _Recorder(pickle.Unpickler):
    """The real C unpickler with a find_class that imports nothing: the differential oracle."""

    def __init__(self, data: bytes) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self.seen: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.seen.append((module, name))

        class Stub:
            def __new__(cls, *a: Any, **k: Any) -> Any:
                return object.__new__(cls)

            def __init__(self, *a: Any, **k: Any) -> None:
                pass

            def __setstate__(self, state: Any) -> None:
                pass

            def append(self, x: Any) -> None:
                pass

            def extend(self, x: Any) -> None:
                pass

            def __setitem__(self, k: Any, v: Any) -> None:
                pass

        return Stub

    def persistent_load(self, pid: Any) -> Any:
        return ("pid", pid)


def test_raw_globals_equal_real_unpickler(state_dict_pkl: bytes) -> None:
    samples = [state_dict_pkl]
    for proto in range(6):
        samples.append(pickle.dumps({"a": [1, 2.5, "x", b"y", {3}, frozenset([4]), bytearray(b"z")],
                                     "c": complex(1, 2), "r": range(3), "s": slice(1, 2)}, proto))
    for data in samples:
        rec = _Recorder(data)
        rec.load()
        r = run_vm(data)
        assert r.complete
        # find_class sees names before the fix_imports mapping
        assert [(u.raw_module, u.raw_name) for u in r.globals] == rec.seen
        n_calls = sum(op.name in {"REDUCE", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ"}
                      for op, _a, _p in pickletools.genops(data))
        assert len(r.calls) == n_calls
        assert all(isinstance(c, Call) for c in r.calls)


def test_mutating_an_imported_object_is_noted() -> None:
    # sys.path.append('/tmp/evil'), os.environ['LD_PRELOAD'] = ..., BUILD on a module: no Call at all.
    cases = {
        "APPEND": (("GLOBAL", "sys", "path"), ("BINUNICODE", "/tmp/e"), "APPEND"),
        "APPENDS": (("GLOBAL", "sys", "path"), "MARK", ("BINUNICODE", "/tmp/e"), "APPENDS"),
        "SETITEM": (("GLOBAL", "os", "environ"), ("BINUNICODE", "LD_PRELOAD"), ("BINUNICODE", "x"),
                    "SETITEM"),
        "SETITEMS": (("GLOBAL", "os", "environ"), "MARK", ("BINUNICODE", "A"), ("BINUNICODE", "x"),
                     "SETITEMS"),
        "ADDITEMS": (("PROTO", 4), ("EXT1", 9), "MARK", "NONE", "ADDITEMS"),
        "BUILD": (("GLOBAL", "os", "path"), "EMPTY_DICT", ("BINUNICODE", "join"), "NONE", "SETITEM",
                  "BUILD"),
    }
    for opcode, items in cases.items():
        r = run_vm(asm(*items, "STOP"))
        assert r.complete and r.calls == []
        muts = [(m, o) for c, m, o in r.notes if c is Code.PICKLE_GLOBAL_MUTATION]
        assert len(muts) == 1 and muts[0][0].startswith(f"{opcode} on "), (opcode, r.notes)
    r = run_vm(asm(("GLOBAL", "sys", "path"), ("BINUNICODE", "/tmp/e"), "APPEND", "STOP"))
    assert r.notes == [(Code.PICKLE_GLOBAL_MUTATION, "APPEND on sys.path", len("csys\npath\n") + 11)]


def test_stack_global_operands_of_any_shape_are_described_safely() -> None:
    deep_list = b"]" * 50_000 + b"a" * 49_999
    for operand, text in [(deep_list, "<list>"), (asm(("LONG4", 10**4000)), "<int of 13288 bits>"),
                          (asm(("BINBYTES", b"x" * 500)), repr(b"x" * 100) + "..."),
                          (asm("NONE"), "None")]:
        r = run_vm(asm(("RAW", operand), ("BINUNICODE", "n"), "STACK_GLOBAL", "STOP"))
        assert r.complete and r.globals[-1].module == text and r.globals[-1].name == "n"
        assert {c for c, _, _ in r.notes} == {Code.PICKLE_NON_ASCII_GLOBAL}   # pickle refuses it
    # an imported object as the operand is a value only the load knows: computed, unresolved
    r = run_vm(asm(("GLOBAL", "a", "b"), ("BINUNICODE", "n"), "STACK_GLOBAL", "STOP"))
    assert r.complete and r.globals[-1].module == "<computed module>"
    assert Code.PICKLE_COMPUTED_IMPORT in {c for c, _, _ in r.notes}


def test_globals_after_the_point_where_torch_stops() -> None:
    from ckptguard.core.torch.rules import TORCH_ACCEPTED

    # torch's weights-only unpickler refuses at the first FRAME/MEMOIZE/SHORT_BINBYTES;
    # the VM reads on and still finds what follows.
    body = asm(("SHORT_BINBYTES", b"x"), "MEMOIZE", "POP", ("GLOBAL", "os", "system"),
               ("SHORT_BINUNICODE", "id"), "TUPLE1", "REDUCE", "STOP")
    data = asm(("PROTO", 4), ("FRAME", len(body))) + body
    r = run_vm(data)
    assert r.complete and [(u.module, u.name) for u in r.globals] == [("os", "system")]
    refused = {"FRAME", "SHORT_BINBYTES", "MEMOIZE", "POP", "SHORT_BINUNICODE"}
    assert r.opcodes_used - TORCH_ACCEPTED == refused
    assert r.calls[0].func == Global("os", "system")
