"""Cold start (issue 14): a scan imports what the file needs. A whole-process scan of a small
pickle loads no module a pickle does not need (numpy, the zip layers, HTTP, the export judge,
hashlib's OpenSSL start-up, typing); a clean torch.save zip, judged by the fast lane, loads none of
the general path's (the emulator, the VM, the manifest builder, the zip forensics) and not
numpy; and import-time tables are not built from pickletools."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest

from ckptguard.core.sniff import _PICKLE_FIRST_OPS

# what a small pickle's scan must not pay for at start-up
# (core.zip.layout, the zip structs, is small: the region judge reads a local header with it)
_NOT_FOR_A_PICKLE = ("numpy", "hashlib", "pickletools", "httpx", "ckptguard.core.zip.directory",
                     "ckptguard.core.zip.columns", "ckptguard.core.zip.checks",
                     "ckptguard.core.io.http", "ckptguard.core.formats.export",
                     "ckptguard.core.lane", "ckptguard.core.manifest", "ckptguard.app.api",
                     # the fast paths' walk (a regex that takes ~11 ms to compile): a small
                     # pickle goes to the exact interpreters; the folder: no computed global
                     "ckptguard.core.pickle.fast.tokenize", "ckptguard.core.pickle.fast.stubs",
                     "ckptguard.core.pickle.fold",
                     # hf:// targets' libraries (urllib.parse loads ipaddress too)
                     "pathlib", "urllib", "ipaddress",
                     # records are not dataclasses (core/records.py): dataclasses loads these
                     "dataclasses", "inspect", "ast", "dis",
                     # the worker pool's logging, an internal error's traceback
                     "logging", "traceback",
                     # typing (~1.6 ms: names for the type checker only, core/typenames.py);
                     # shutil (bz2, lzma: argparse's terminal width, app/cli.py)
                     "typing", "shutil")
ROOT = Path(__file__).resolve().parents[3]


def test_a_small_pickle_scan_imports_only_what_a_pickle_needs(tmp_path: Path) -> None:
    target = tmp_path / "tiny.pkl"
    target.write_bytes(pickle.dumps({"a": [1, 2, 3], "b": "x" * 200}, protocol=2))
    code = ("import json, sys\n"
            "from ckptguard.app.cli import main\n"
            f"status = main(['scan', '-q', {str(target)!r}])\n"
            "print(json.dumps([status, sorted(sys.modules)]))")
    # -S: no site, so an editable install's import finder (which loads pathlib) does not
    # stand in for the scan's imports; the package comes from this repository
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    status, modules = json.loads(out.stdout.splitlines()[-1])
    assert status == 0   # safe: the scan ran
    assert "ckptguard.core.formats.pickle_file" in modules
    loaded = [m for m in modules if any(m == p or m.startswith(p + ".") for p in _NOT_FOR_A_PICKLE)]
    assert loaded == []


# what the fast lane's happy path (a clean torch.save zip) must not pay for at start-up: the
# general path's modules, which it only needs when it declines (core.lane.torch_zip)
_NOT_FOR_A_CLEAN_TORCH_ZIP = ("ckptguard.core.formats", "ckptguard.core.judge",
                              "ckptguard.core.pickle.vm", "ckptguard.core.pickle.frames",
                              "ckptguard.core.torch.weights_only", "ckptguard.core.torch.callables",
                              "ckptguard.core.torch.tensor_build", "ckptguard.core.torch.user_models",
                              "ckptguard.core.manifest.build", "ckptguard.core.zip.directory",
                              "ckptguard.core.pickle.opcodes",
                              "ckptguard.core.zip.checks", "ckptguard.core.regions.judge",
                              "dataclasses", "inspect", "logging", "traceback", "typing", "shutil")
_SCAN_IN_A_FRESH_PROCESS = {
    "scan_path": ("from ckptguard.core.scan import scan_path\n"
                  "report = scan_path({path!r})\n"
                  "outcome = [report.verdict, report.format, len(report.tensors)]\n"),
    "cli": ("from ckptguard.app.cli import main\n"
            "outcome = [main(['scan', {path!r}])]\n"),
}


@pytest.mark.parametrize("entry", sorted(_SCAN_IN_A_FRESH_PROCESS))
def test_a_clean_torch_zip_scan_imports_only_the_fast_lane(tmp_path: Path, entry: str) -> None:
    from tests.builders.torchlayout import state_dict, torch_layout, v2

    target = tmp_path / "clean.pt"
    pickled = state_dict(*((f"layer.{i}.weight", v2(str(i))) for i in range(3)))
    target.write_bytes(torch_layout("clean", pickled, [(str(i), bytes(8)) for i in range(3)]))
    code = ("import json, sys\n" + _SCAN_IN_A_FRESH_PROCESS[entry].format(path=str(target))
            + "print(json.dumps([outcome, sorted(sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    outcome, modules = json.loads(out.stdout.splitlines()[-1])
    assert outcome == ([0] if entry == "cli" else ["safe", "torch-zip", 3])
    assert "ckptguard.core.lane.torch_zip" in modules
    loaded = [m for m in modules
              if any(m == p or m.startswith(p + ".") for p in _NOT_FOR_A_CLEAN_TORCH_ZIP)]
    assert loaded == []


def test_a_cli_scan_of_a_clean_torch_save_zip_does_not_import_numpy(tmp_path: Path) -> None:
    """The fast lane reads its columns into lists: numpy's import (~150 ms, more than the
    lane's whole scan of a 10,000-tensor checkpoint) is not on a clean file's path."""
    torch = pytest.importorskip("torch")
    target = tmp_path / "clean.pt"
    torch.save({f"layer.{i}.weight": torch.zeros(2, 2) for i in range(3)}, target)
    code = ("import json, sys\n"
            "from ckptguard.app.cli import main\n"
            f"status = main(['scan', {str(target)!r}])\n"
            "print(json.dumps([status, sorted(sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    status, modules = json.loads(out.stdout.splitlines()[-1])
    assert status == 0   # safe
    assert "ckptguard.core.lane.torch_zip" in modules   # the lane judged it...
    assert "ckptguard.core.formats.torch_zip" not in modules   # ...and did not decline
    assert [m for m in modules if m == "numpy" or m.startswith("numpy.")] == []


def test_the_first_opcode_table_is_pickletools_own() -> None:
    """core.sniff writes the table out (no pickletools import at start-up): it must be the
    opcodes that take nothing from the stack, plus the few kept so such bytes read as a pickle."""
    built = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes
                      if not op.stack_before) | frozenset(
        b"(.0123IJKLMNFGSTUVXcdehijklnoprqs}])\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f"
        b"\x90\x91\x92\x93\x94\x95\x96\x97\x98")
    assert built == _PICKLE_FIRST_OPS


def test_a_cli_scan_that_needs_numpy_starts_no_blas_threads(tmp_path: Path) -> None:
    """numpy's OpenBLAS starts a thread per core at import (~80 ms of a one-file scan); the
    command line asks for one, so the process stays single-threaded (unless the user's
    environment says otherwise)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: OpenBLAS starts no extra thread anyway")
    np = pytest.importorskip("numpy")

    target = tmp_path / "array.npy"
    np.save(target, np.zeros(200, dtype=np.float32), allow_pickle=False)
    code = ("import json, os, sys\n"
            "from ckptguard.app.cli import main\n"
            f"status = main(['scan', '-q', {str(target)!r}])\n"
            "print(json.dumps([status, 'numpy' in sys.modules, len(os.listdir('/proc/self/task'))]))")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env=env)
    status, numpy_loaded, threads = json.loads(out.stdout.splitlines()[-1])
    assert status == 0 and numpy_loaded   # the .npy reader ran, so numpy (and OpenBLAS) loaded
    assert threads == 1
