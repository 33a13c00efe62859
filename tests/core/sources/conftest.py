"""Fixtures for the remote tests: real torch checkpoints and a range server on 127.0.0.1."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

from ckptguard.core.io.urlguard import UrlGuard
from tests.rangeserver import RangeServer

torch = pytest.importorskip("torch")


def save(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def mixed_state() -> dict[str, object]:
    """Every dtype family the loader maps, plus views with offsets and odd strides."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "f16": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "f8e4": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
        "f8e5": torch.randn(4, 2, generator=g).to(torch.float8_e5m2),
        "f64": torch.randn(2, 2, dtype=torch.float64, generator=g),
        "i64": torch.arange(10),
        "i8": torch.arange(-5, 5, dtype=torch.int8),
        "u8": torch.arange(20, dtype=torch.uint8),
        "u16": torch.arange(6).to(torch.uint16),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(3, dtype=torch.complex64, generator=g),
        "base": base,
        "transposed": base.t(),
        "row": base[2],
        "col": base[:, 3],
        "strided": base[1::2, ::2],
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "expanded": torch.randn(1, 3, generator=g).expand(4, 3),
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    }


@pytest.fixture(scope="session")
def small_ckpt() -> bytes:
    return save(mixed_state())


@pytest.fixture(scope="session")
def many_ckpt() -> bytes:
    """A checkpoint whose pickle and central directory both outgrow the 64 KiB head/tail."""
    return save({f"model.layers.{i}.weight": torch.full((2,), float(i)) for i in range(3000)})


@pytest.fixture
def guard() -> UrlGuard:
    return UrlGuard(allowlist=("127.0.0.1",))


@pytest.fixture
def server(small_ckpt: bytes, many_ckpt: bytes) -> Iterator[RangeServer]:
    with RangeServer({"/small.pt": small_ckpt, "/many.pt": many_ckpt, "/empty.bin": b"",
                      "/tiny.bin": b"0123456789"}) as srv:
        yield srv
