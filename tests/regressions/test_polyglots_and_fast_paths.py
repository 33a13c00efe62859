"""Red-team findings, round 2: files that read as a pickle from byte 0 behind another format,
pickles that start with an opcode the sniffer did not know, and pickles the C-speed fast
paths accepted where torch's unpickler (and the exact interpreters) refuse.

Each polyglot is proven real first: `pickle.load` in a subprocess creates the canary file.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import fastlane, fastload, fastpath, pickle_scan
from core.pickletoken import Decline
from core.report import Report
from core.scan import scan_path, scan_source
from core.source import BytesSource
from tests.core.fastlane.torchlayout import torch_layout

# a short relative canary: a tar name field holds 100 bytes, and a scan runs in another cwd
CANARY = "pwned"
PAYLOAD = f"cos\nsystem\n(S'touch {CANARY}'\ntR.".encode()


def _pickle_load_runs(path: Path) -> bool:
    """Does `pickle.load` run the payload (in path's directory)?"""
    subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))",
                    path.name], cwd=path.parent, capture_output=True, check=False, timeout=60)
    return (path.parent / CANARY).exists()


def _safetensors_polyglot(payload: bytes) -> bytes:
    """A valid safetensors file whose length field starts with UNICODE ('V', text to the next
    newline): the header ends in a newline (JSON whitespace), then the data area is the
    payload pickle, covered by a U8 tensor."""
    n = 0x0156   # little-endian: 'V', 0x01, then zeros
    header = json.dumps({"t": {"dtype": "U8", "shape": [len(payload)],
                               "data_offsets": [0, len(payload)]}}).encode()
    header += b" " * (n - len(header) - 1) + b"\n"
    return struct.pack("<Q", n) + header + payload


def _tar_polyglot(payload: bytes) -> bytes:
    """A tar archive whose first member's name (byte 0 of the file) is the payload pickle."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(payload.decode("latin-1"))
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


POLYGLOTS = {"safetensors": _safetensors_polyglot, "tar": _tar_polyglot,
             # no PROTO: SHORT_BINBYTES / BINBYTES first, then the payload
             "starts-with-C": lambda p: b"C\x01x0" + p, "starts-with-B": lambda p: b"B\x01\x00\x00\x00x0" + p}


@pytest.mark.parametrize("kind", list(POLYGLOTS))
def test_polyglot_pickles_are_unsafe(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(POLYGLOTS[kind](PAYLOAD))
    report = scan_path(path)
    assert not (tmp_path / CANARY).exists() and not Path(CANARY).exists()
    assert report.verdict == "unsafe", (kind, report.format, [f.code for f in report.findings])
    assert "os.system" in {g.full for g in report.globals if g.status == "dangerous"}
    assert _pickle_load_runs(path), "the polyglot must really run under pickle.load"


def test_a_polyglot_hidden_behind_the_scanners_limits_is_unsafe(tmp_path: Path) -> None:
    """10,001 MARKs before the payload: our interpreter stops at its depth limit, CPython's
    has none and runs it. A real safetensors file never runs into a limit."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(_safetensors_polyglot(b"(" * 10_001 + PAYLOAD))
    report = scan_path(path)
    assert report.verdict == "unsafe" and "PICKLE_POLYGLOT" in {f.code for f in report.findings}
    assert _pickle_load_runs(path)


def test_a_tuple_dag_key_is_judged_in_linear_time() -> None:
    """((x, x), (x, x)) ... 60 levels through the memo: 2**60 paths, 60 distinct tuples.
    The exact interpreter's hashability check walks each tuple once (run in a subprocess so
    a regression fails on the timeout instead of hanging the suite)."""
    code = ("from core.torch_rebuild import hash_error\n"
            "t = (1,)\nfor _ in range(60): t = (t, t)\nprint(hash_error(t, None))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "None"


def _dag_key(depth: int) -> bytes:
    """t0 = (1,); t(k+1) = (tk, tk) through the memo: `depth` levels, 2**depth paths."""
    out = b"K\x01\x85r\x00\x00\x01\x00"
    for k in range(depth):
        out += b"j" + struct.pack("<I", 0x10000 + k) + b"\x86r" + struct.pack("<I", 0x10001 + k)
    return out


# the same key as a dict key in each way torch's unpickler fills a dict
_DAG_HOLDERS = {
    "SETITEM on the root dict": lambda key: b"\x80\x02}" + key + b"K\x00s.",
    "SETITEMS on the root dict": lambda key: b"\x80\x02}(" + key + b"K\x00u.",
    "an OrderedDict": lambda key: (b"\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00a"
                                   b"K\x01" + key + b"K\x00u."),
    "a nested dict": lambda key: b"\x80\x02}X\x01\x00\x00\x00a}" + key + b"K\x00ss.",
    "a BUILD state": lambda key: (b"\x80\x02ccollections\nOrderedDict\n)R}" + key
                                  + b"K\x00sb."),
}


@pytest.mark.parametrize("holder", sorted(_DAG_HOLDERS))
def test_a_tuple_dag_dict_key_is_judged_without_hashing_it(holder: str, tmp_path: Path) -> None:
    """A 60-level tuple DAG as a dict key: CPython's hash visits 2**60 tuples, in C, so
    torch.load (and pickle.load) never return. Every path of the scanner must answer
    without hashing it: the C-speed paths decline tuple keys, the exact interpreter counts
    the visits first. In a subprocess, so a regression fails on the timeout."""
    path = tmp_path / "dag.pkl"
    path.write_bytes(_DAG_HOLDERS[holder](_dag_key(60)))
    code = ("import sys\nfrom core.scan import scan_path\nr = scan_path(sys.argv[1])\n"
            "print(r.verdict, r.weights_only.error)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(__file__).resolve().parents[2])
    verdict, error = out.stdout.strip().split(" ", 1)
    assert verdict == "suspicious", out.stdout
    assert "torch.load would hang" in error


@pytest.mark.parametrize("holder", sorted(_DAG_HOLDERS))
def test_the_c_speed_paths_decline_tuple_dict_keys(holder: str) -> None:
    """The C unpickler would hash the key before any check of ours could run."""
    data = _DAG_HOLDERS[holder](_dag_key(2))
    allowed = pickle_scan.allowed_checker(frozenset())
    with pytest.raises(Decline, match="tuple dict key"):
        fastload.load(data, allowed)
    with pytest.raises(Decline, match="tuple dict key"):
        fastpath.fast_load(data, allowed=allowed, check_pid=lambda pid: None)


# (a BUILD state with a non-str key stays unmodelled: README, Limitations)
@pytest.mark.parametrize("holder", sorted(set(_DAG_HOLDERS) - {"a BUILD state"}))
def test_a_small_tuple_dag_key_loads_as_in_torch(holder: str) -> None:
    """12 levels (4,096 paths) hash in microseconds: torch loads it and so do we."""
    wou = pytest.importorskip("torch._weights_only_unpickler")
    data = _DAG_HOLDERS[holder](_dag_key(12))
    wou.Unpickler(io.BytesIO(data), encoding="utf-8").load()   # the oracle: raises if torch refuses
    report = scan_source(BytesSource(data))
    assert report.weights_only.loadable, report.weights_only.error
    assert report.verdict == "safe"


def test_the_safetensors_polyglot_is_a_real_safetensors_file() -> None:
    data = _safetensors_polyglot(PAYLOAD)
    report = scan_source(BytesSource(data))
    assert report.format == "safetensors"
    assert "PICKLE_POLYGLOT" in {f.code for f in report.findings}
    assert [t.name for t in report.tensors] == ["t"]


@settings(max_examples=60, deadline=None)
@given(length=st.sampled_from([0x63, 0x69, 0x28, 0x56, 0x50, 0x8C, 0x80, 0x95]),
       data=st.binary(min_size=0, max_size=300))
def test_real_safetensors_files_are_not_polyglots(length: int, data: bytes) -> None:
    """Header lengths whose first byte is GLOBAL/INST/MARK/UNICODE/PERSID/... and tensor
    bytes full of newlines: the first bytes stop any pickle before an importable name."""
    header = json.dumps({"t": {"dtype": "U8", "shape": [len(data)],
                               "data_offsets": [0, len(data)]}}).encode()
    if len(header) > length:
        header = json.dumps({}).encode()
    header += b" " * (length - len(header))
    report = scan_source(BytesSource(struct.pack("<Q", length) + header + data))
    assert "PICKLE_POLYGLOT" not in {f.code for f in report.findings}


# ---- the C-speed paths must agree with the exact interpreters ----------------------------

FAST_PATH_CASES = {
    # an empty batch of APPENDS/SETITEMS on an object that is not a list/dict
    "appends-empty-on-dict": b"\x80\x02}(e.",
    "appends-empty-on-tuple": b"\x80\x02)(e.",
    "setitems-empty-on-tuple": b"\x80\x02)(u.",
    # BUILD with None (the C unpickler does nothing) or a slot state (it sets attributes)
    "build-none-on-dict": b"\x80\x02}Nb.",
    "build-dict-on-list": b"\x80\x02]}b.",
    "build-none-on-global": b"\x80\x02ctorch\nfloat32\nNb.",
    "build-slots-on-counter": (b"\x80\x02ccollections\nCounter\nN}X\x0b\x00\x00\x00most_common"
                               b"c_codecs\nencode\ns\x86b."),
    # BUILD on an OrderedDict that plants __setstate__
    "build-plants-setstate": (b"\x80\x02ccollections\nOrderedDict\n)R}X\x0c\x00\x00\x00__setstate__"
                              b"c_codecs\nencode\nsb."),
}


def _exact(path: Path, monkeypatch: pytest.MonkeyPatch) -> Report:
    with monkeypatch.context() as m:
        m.setattr(fastlane, "try_torch_zip", lambda source, an: False)
        m.setattr(pickle_scan, "_try_fast", lambda *args, **kw: None)
        return scan_path(path)


def _comparable(report: Report) -> dict[str, object]:
    out = report.to_json()
    out.pop("timings_ms")
    out.pop("io")
    return out


@pytest.mark.parametrize("case", list(FAST_PATH_CASES))
@pytest.mark.parametrize("container", ["pickle", "torch-zip"])
def test_fast_paths_agree_with_the_exact_interpreters(tmp_path: Path, case: str, container: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pkl = FAST_PATH_CASES[case]
    path = tmp_path / "case.pt"
    path.write_bytes(pkl if container == "pickle" else torch_layout("archive", pkl))
    fast, exact = scan_path(path), _exact(path, monkeypatch)
    assert _comparable(fast) == _comparable(exact), case
    assert not fast.weights_only.loadable or case == "build-plants-setstate"
    assert fast.verdict != "safe", (case, fast.verdict)
