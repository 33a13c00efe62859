"""Legacy torch streams: real ones from torch.save, and builders for hand-made hostile ones."""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest

MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
PROTOCOL = pickle.dumps(1001, protocol=2)
SYS_INFO = pickle.dumps({"protocol_version": 1001, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)


def legacy_bytes(obj: object) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def stream(main: bytes, keys: list[str], blocks: list[tuple[int, bytes]], *,
           magic: bytes = MAGIC, protocol: bytes = PROTOCOL, sys_info: bytes = SYS_INFO,
           tail: bytes = b"") -> bytes:
    """magic + protocol + sys_info + main + pickled keys + (i64 count + data) per block."""
    out = magic + protocol + sys_info + main + pickle.dumps(keys, protocol=2)
    for count, data in blocks:
        out += struct.pack("<q", count) + data
    return out + tail


def torch_outcome(path: Path) -> tuple[bool, str, str]:
    """(loadable, exception type, str(exception)) of torch.load(weights_only=True)."""
    import torch

    try:
        torch.load(path, weights_only=True)
    except Exception as exc:
        return False, type(exc).__name__, str(exc)
    return True, "", ""


def assert_same_outcome(report: Any, path: Path) -> None:
    """Our weights_only verdict and message == torch's (first line; UnpicklingError wrapped)."""
    ok, etype, message = torch_outcome(path)
    wo = report.weights_only
    assert wo.loadable == ok, (wo, etype, message)
    if not ok:
        assert wo.error_type == etype
        if etype == "UnpicklingError":
            assert wo.error and wo.error in message
        else:
            assert wo.error == (message.splitlines() or [""])[0]


@pytest.fixture
def write(tmp_path: Path) -> Any:
    counter = iter(range(10**6))

    def run(data: bytes, name: str = "ckpt.pt") -> Path:
        path = tmp_path / f"{next(counter)}-{name}"
        path.write_bytes(data)
        return path

    return run
