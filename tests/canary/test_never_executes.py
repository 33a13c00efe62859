"""Canaries: live payloads that create a marker file when unpickled, in every container.

Each payload is first proven armed — real `pickle.loads` in a child process creates its
marker — then every container holding it is scanned with `core.scan.scan_path`: the
marker must never appear and the verdict must be `unsafe`.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ckptguard.core.scan import scan_path
from tests.builders.carriers import CARRIERS
from tests.builders.pickle_asm import asm
from tests.builders.torchsave import torch_data_pkl
from tests.core.legacy.conftest import stream

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

Payload = Callable[[Path], bytes]


def _call(module: str, name: str, *args_ops: object) -> list[object]:
    """GLOBAL module.name, MARK, <args_ops>, TUPLE, REDUCE — as opcode items."""
    return [("GLOBAL", module, name), "MARK", *args_ops, "TUPLE", "REDUCE"]


def _pkl(*items: object) -> bytes:
    return asm(("PROTO", 2), *items, "STOP")  # type: ignore[arg-type]


def os_system(m: Path) -> bytes:
    return _pkl(*_call("os", "system", ("BINUNICODE", f"touch {m}")))


def subprocess_call(m: Path) -> bytes:
    return _pkl(*_call("subprocess", "call", "EMPTY_LIST", ("BINUNICODE", "touch"), "APPEND",
                       ("BINUNICODE", str(m)), "APPEND"))


def builtins_exec(m: Path) -> bytes:
    return _pkl(*_call("builtins", "exec", ("BINUNICODE", f"open({str(m)!r}, 'w').close()")))


def builtins_eval(m: Path) -> bytes:
    return _pkl(*_call("builtins", "eval", ("BINUNICODE", f"open({str(m)!r}, 'w').close()")))


def builtins_open(m: Path) -> bytes:
    return _pkl(*_call("builtins", "open", ("BINUNICODE", str(m)), ("BINUNICODE", "w")))


def getattr_import_chain(m: Path) -> bytes:
    return _pkl(("GLOBAL", "builtins", "getattr"), "MARK",
                *_call("builtins", "__import__", ("BINUNICODE", "os")),
                ("BINUNICODE", "system"), "TUPLE", "REDUCE",
                ("BINUNICODE", f"touch {m}"), "TUPLE1", "REDUCE")


def nested_pickle_loads(m: Path) -> bytes:
    return _pkl(*_call("pickle", "loads", ("BINBYTES", os_system(m))))


def nested_torch_load(m: Path) -> bytes:
    """torch.load(BytesIO(<torch zip whose data.pkl runs os.system>), None, pickle)."""
    inner = torch_zip(os_system(m))
    return _pkl(*_call("torch", "load", *_call("io", "BytesIO", ("BINBYTES", inner)), "NONE",
                       *_call("importlib", "import_module", ("BINUNICODE", "pickle"))))


def numpy_object_array(m: Path) -> bytes:
    """numpy.load(BytesIO(<.npy object array whose pickle runs os.system>), None, True)."""
    return _pkl(*_call("numpy", "load", *_call("io", "BytesIO", ("BINBYTES", npy_object(os_system(m)))),
                       "NONE", "NEWTRUE"))


def computed_import(m: Path) -> bytes:
    """STACK_GLOBAL(codecs.decode(base64.b64decode(b'b3M='), 'ascii'), 'system'): no `os` in
    the bytes and no dangerous helper; only folding the import names os.system."""
    return _pkl(*_call("codecs", "decode", *_call("base64", "b64decode", ("BINBYTES", b"b3M=")),
                       ("BINUNICODE", "ascii")),
                ("BINUNICODE", "system"), "STACK_GLOBAL", ("BINUNICODE", f"touch {m}"), "TUPLE1",
                "REDUCE")


PAYLOADS: dict[str, Payload] = {f.__name__: f for f in (
    os_system, subprocess_call, builtins_exec, builtins_eval, builtins_open, getattr_import_chain,
    nested_pickle_loads, nested_torch_load, numpy_object_array, computed_import)}


# -- containers -----------------------------------------------------------------------------

def torch_zip(data_pkl: bytes) -> bytes:
    """A real torch.save zip whose data.pkl record is replaced by `data_pkl`."""
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = data_pkl if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, body)
    return out.getvalue()


def npy_object(pickled: bytes) -> bytes:
    """A .npy file of dtype object (the data part is a pickle numpy would load)."""
    buf = io.BytesIO()
    np.save(buf, np.array([None], dtype=object), allow_pickle=True)
    raw = buf.getvalue()
    header_len = 10 + int.from_bytes(raw[8:10], "little")
    return raw[:header_len] + pickled


def _torch_state_pkl() -> bytes:
    torch = pytest.importorskip("torch")
    return torch_data_pkl({"w": torch.ones(2)})


CONTAINERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "plain_pickle": ("x.pkl", lambda p: p),
    "torch_zip": ("x.pt", torch_zip),
    "legacy_stream": ("x.pt", lambda p: stream(p, [], [])),
    "pickle_after_stop": ("x.pkl", lambda p: pickle.dumps({"a": 1}, protocol=2) + p),
    "legacy_after_blocks": ("x.pt", lambda p: stream(pickle.dumps({}, protocol=2), [], [], tail=p)),
    "torch_zip_after_stop": ("x.pt", lambda p: torch_zip(_torch_state_pkl() + p)),
    "numpy_object_array": ("x.npy", npy_object),
    # regions torch skips but another reader would parse (issue 18): appended, prepended,
    # gaps, unreferenced/refused/shadowed entries, generic zip, npz and tar members, zips
    # inside regions (tests/builders/carriers.py)
    **{f"region_{name}": ("x.pt", build) for name, (build, _kind) in CARRIERS.items()},
}


@pytest.mark.torch
def test_payloads_are_armed(tmp_path: Path) -> None:
    """Control: real unpickling of each payload creates its marker (in a child process)."""
    script = ["import pickle, sys"]
    markers = []
    for name, make in PAYLOADS.items():
        marker = tmp_path / f"armed-{name}"
        blob = tmp_path / f"{name}.pkl"
        blob.write_bytes(make(marker))
        script.append(f"pickle.loads(open({str(blob)!r}, 'rb').read())")
        markers.append(marker)
    subprocess.run([sys.executable, "-c", "\n".join(script)], check=True, cwd=tmp_path,
                   capture_output=True, timeout=120)
    assert [m.name for m in markers if not m.exists()] == []


@pytest.mark.torch
@pytest.mark.parametrize("container", list(CONTAINERS))
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_scan_never_executes(payload: str, container: str, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    filename, wrap = CONTAINERS[container]
    path = tmp_path / filename
    path.write_bytes(wrap(PAYLOADS[payload](marker)))
    report = scan_path(path)
    assert not marker.exists(), "the scanner executed the payload"
    assert report.verdict == "unsafe", (report.format, [(f.code, f.message) for f in report.findings])
