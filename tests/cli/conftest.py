"""A model folder as users have them: checkpoints, a malicious pickle, text, a malformed zip,
a Hugging Face cache snapshot of links into ../../blobs/, and links that must not be followed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders.pickle_asm import asm

CKPTGUARD = str(Path(sys.executable).with_name("ckptguard"))   # the installed console script

EVIL = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo pwned"),
           "TUPLE1", "REDUCE", "STOP")
UNKNOWN_GLOBAL = asm(("PROTO", 2), ("GLOBAL", "mymodule", "Config"), "EMPTY_TUPLE", "REDUCE", "STOP")


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CKPTGUARD, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("models")
    tree = root / "tree"
    (tree / "nested").mkdir(parents=True)
    torch.save({"w": torch.ones(3), "b": torch.zeros(2)}, tree / "good.pt")
    torch.save({"w": torch.ones(1)}, tree / "pytorch_model")            # no extension
    (tree / "nested" / "evil.bin").write_bytes(EVIL)                     # a pickle named .bin
    (tree / "README.md").write_text("# a model\n")
    (tree / "config.json").write_text('{"hidden": 4}\n')
    (tree / "broken.zip").write_bytes(b"PK\x03\x04" + b"\x00" * 200)      # malformed zip
    # HF cache layout: snapshots/<rev>/<name> -> ../../blobs/<sha>
    blobs, snap = tree / "hub" / "blobs", tree / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    torch.save({"emb": torch.ones(2, 2)}, blobs / "9f86d081884c7d65")
    os.symlink("../../blobs/9f86d081884c7d65", snap / "model.safetensors.bin")
    os.symlink("../../blobs/missing", snap / "dangling.bin")             # an incomplete download
    os.symlink("..", tree / "nested" / "loop")                          # a loop: never entered
    outside = root / "outside"
    outside.mkdir()
    (outside / "not-in-tree.pkl").write_bytes(EVIL)
    os.symlink(outside, tree / "elsewhere")                             # leaves the tree: not followed
    return tree
