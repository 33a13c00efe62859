"""Never execute: pickles that would create a file go through run_vm and the file never appears."""

from __future__ import annotations

import pathlib
import pickle
import sys

import pytest

from ckptguard.core.pickle.vm import run_vm
from tests.builders.pickle_asm import asm


def payloads(target: pathlib.Path) -> dict[str, bytes]:
    t = str(target)
    call = ("BINUNICODE", f"touch {t}")
    return {
        "os.system": asm(("PROTO", 2), ("GLOBAL", "os", "system"), call, "TUPLE1", "REDUCE", "STOP"),
        "posix.system": asm(("GLOBAL", "posix", "system"), "MARK", call, "TUPLE", "REDUCE", "STOP"),
        "builtins.exec": asm(("PROTO", 3), ("GLOBAL", "builtins", "exec"),
                             ("BINUNICODE", f"open({t!r}, 'w').close()"), "TUPLE1", "REDUCE", "STOP"),
        "__builtin__.eval": asm(("GLOBAL", "__builtin__", "eval"),
                                ("UNICODE", f"open({t!r}, 'w')"), "TUPLE1", "REDUCE", "STOP"),
        "builtins.open": asm(("PROTO", 4), ("SHORT_BINUNICODE", "builtins"), "MEMOIZE",
                             ("SHORT_BINUNICODE", "open"), "MEMOIZE", "STACK_GLOBAL",
                             ("BINUNICODE", t), ("BINUNICODE", "w"), "TUPLE2", "REDUCE", "STOP"),
        "subprocess.Popen": asm(("PROTO", 2), ("GLOBAL", "subprocess", "Popen"),
                                "MARK", ("BINUNICODE", "touch"), ("BINUNICODE", t), "LIST",
                                "TUPLE1", "REDUCE", "STOP"),
        "INST os.system": asm("MARK", ("STRING", f"touch {t}"), ("INST", "os", "system"), "STOP"),
        "OBJ os.system": asm("MARK", ("GLOBAL", "os", "system"), call, "OBJ", "STOP"),
        "NEWOBJ_EX": asm(("PROTO", 4), ("GLOBAL", "subprocess", "Popen"), "MARK", "MARK",
                         ("BINUNICODE", "touch"), ("BINUNICODE", t), "LIST", "TUPLE", "EMPTY_DICT",
                         "NEWOBJ_EX", "STOP"),
    }


def test_control_real_pickle_would_create_the_file(tmp_path: pathlib.Path) -> None:
    # Proves the canary is armed: the same bytes through pickle.loads do create the file.
    target = tmp_path / "control"
    f = pickle.loads(payloads(target)["builtins.open"])
    f.close()
    assert target.exists()


@pytest.mark.parametrize("name", sorted(payloads(pathlib.Path("x"))))
def test_run_vm_never_executes(tmp_path: pathlib.Path, name: str) -> None:
    target = tmp_path / "pwned"
    data = payloads(target)[name]
    for cut, complete in ((len(data), True), (len(data) - 1, False)):   # and truncated before STOP
        r = run_vm(data[:cut])
        assert r.complete is complete and r.calls and r.calls[-1].opcode in name + "REDUCE"
        assert r.globals[0].module in {"os", "posix", "builtins", "subprocess"}
        assert not target.exists()


def test_run_vm_never_imports(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "imported"
    (tmp_path / "ckptguard_canary_mod.py").write_text(
        f"open({str(target)!r}, 'w').close()\ndef boom(*a):\n    open({str(target)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = asm(("PROTO", 2), ("GLOBAL", "ckptguard_canary_mod", "boom"), "EMPTY_TUPLE", "REDUCE",
               ("GLOBAL", "ckptguard_canary_mod", "boom"), "EMPTY_TUPLE", "NEWOBJ", "STOP")
    r = run_vm(data)
    assert r.complete and [u.module for u in r.globals] == ["ckptguard_canary_mod"] * 2
    assert "ckptguard_canary_mod" not in sys.modules and not target.exists()
