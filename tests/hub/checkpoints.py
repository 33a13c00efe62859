"""A hub repository of real torch checkpoints at two revisions (built with torch, tests only).

Revision A: a benign torch zip mislabelled `pytorch_model.bin`, a torch zip whose data.pkl
was replaced by a hand-made pickle calling os.system, a `.bin` that is really a raw
pickle (os.system), a legacy torch file, safetensors in a sub-directory, a NumPy file,
text files (README.md, config.json, a text file that starts like a protocol-0 pickle)
and a 3-byte file. Revision B changes the benign checkpoint and removes the malicious ones.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from tests.builders.pickle_asm import asm

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

REV_A = "a1" * 20
REV_B = "b2" * 20
REPO = "acme/tiny-model"

# Expected per-file outcome: (state, verdict)
EXPECTED_A = {
    "pytorch_model.bin": ("done", "safe"),
    "evil.pt": ("done", "unsafe"),
    "optimizer.bin": ("done", "unsafe"),
    "legacy.bin": ("done", "safe"),
    "weights/model.safetensors": ("done", "safe"),
    "stats.npy": ("done", "safe"),
    "README.md": ("skipped", None),
    "config.json": ("skipped", None),
    "notes.txt": ("skipped", None),
    "x.txt": ("skipped", None),
}


def save(obj: object, **kw: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def with_data_pkl(checkpoint: bytes, pickle_bytes: bytes) -> bytes:
    """The same torch zip with `*/data.pkl` replaced (entries and order kept)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(checkpoint)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = pickle_bytes if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info, data)
    return out.getvalue()


EVIL_PICKLE = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo pwned"),
                  "TUPLE1", "REDUCE", "STOP")


def revision_a() -> dict[str, bytes]:
    benign = save({"w": torch.arange(12.0).view(3, 4), "b": torch.zeros(4)})
    st = safetensors_torch.save({"emb": torch.ones(2, 3)})
    npy = io.BytesIO()
    np.save(npy, np.arange(10, dtype=np.float32))
    return {
        "pytorch_model.bin": benign,
        "evil.pt": with_data_pkl(save({"x": torch.ones(2)}), EVIL_PICKLE),
        "optimizer.bin": EVIL_PICKLE,
        "legacy.bin": save({"w": torch.ones(3)}, _use_new_zipfile_serialization=False),
        "weights/model.safetensors": st,
        "stats.npy": npy.getvalue(),
        "README.md": b"# tiny-model\n\nA test repository.\n",
        "config.json": b'{"hidden_size": 4}\n',
        "notes.txt": b"Some notes: trained for 3 epochs.\n",
        "x.txt": b"hi\n",
    }


def revision_b(a: dict[str, bytes]) -> dict[str, bytes]:
    files = {k: v for k, v in a.items() if k not in ("evil.pt", "optimizer.bin")}
    files["pytorch_model.bin"] = save({"w": torch.arange(20.0)})
    return files
