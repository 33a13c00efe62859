"""Checkpoints for the service tests: built by hand (pickle_asm) or by torch, with a nonce
so each test run uploads bytes no database has cached before."""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections.abc import Iterator

from tests.builders.pickle_asm import asm, op


def nonce() -> str:
    return os.urandom(8).hex()


def benign_pickle(tag: str) -> bytes:
    """A plain pickle of builtins only: weights-only loadable -> safe."""
    return pickle.dumps({"step": 7, "tag": tag, "lr": [0.1, 0.01]}, protocol=2)


def malicious_pickle(tag: str) -> bytes:
    """The classic: GLOBAL os.system + REDUCE, hand-assembled (never pickled by Python)."""
    return asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", f"echo {tag}"),
               "TUPLE1", "REDUCE", "STOP")


def malformed_pickle(tag: str) -> bytes:
    """A pickle whose string claims 4000 bytes but the file ends first: invalid."""
    return asm(("PROTO", 2), ("BINUNICODE", tag, {"length": 4000}))


def torch_checkpoint(tag: str) -> bytes:
    import torch

    buf = io.BytesIO()
    seed = int(tag[:8], 16) if tag else 0
    g = torch.Generator().manual_seed(seed)
    torch.save({"w": torch.randn(4, 4, generator=g), "b": torch.zeros(4)}, buf)
    return buf.getvalue()


def big_pickle_chunks(nbytes: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """One BINBYTES8 string of `nbytes` (+ STOP), yielded in chunks: a scanner must hold the
    whole pickle to read it; the test never does."""
    yield asm(("PROTO", 4)) + op("BINBYTES8") + struct.pack("<Q", nbytes)
    zeros = b"\0" * chunk
    for start in range(0, nbytes, chunk):
        yield zeros[: min(chunk, nbytes - start)]
    yield op("STOP")
