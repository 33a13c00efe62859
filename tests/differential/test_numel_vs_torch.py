"""A view's element count as torch computes it (TensorImpl::compute_numel: a running uint64
product that sticks at its first overflow, then no more than int64): (2**32, 2**32, 0)
is refused, (2**31 - 1, 2**32, 0) is an empty tensor torch loads. Every engine, the column
lane on a file included, against torch.load on sizes around those bounds (strides 0, so
every view fits its one-element storage)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from tests.agreement import ENGINES, assert_agree, scan_with
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _sizes() -> list[tuple[int, ...]]:
    fixed = [(2**31 - 1, 2**32, 0), (2**32, 2**32, 0), (2**62 - 1, 4, 0), (2**62, 4, 0),
             (0, 2**40, 2**40), (3, 2**61, 2, 0), (2**27, 2**27, 2**27), (2**27, 2**27, 2**27, 0),
             (2**20, 2**20, 2**20, 0, 5), (2**21, 2**21, 2**21), (2**31, 2**32), (7, 5, 3)]
    rng = random.Random(11)
    drawn = [tuple(rng.choice([0, 1, 2, 3, 2**rng.randrange(8, 40), 2**rng.randrange(20, 34) - 1])
                   for _ in range(rng.randrange(2, 6))) for _ in range(30)]
    return fixed + drawn


@pytest.mark.parametrize("size", _sizes(), ids=str)
def test_element_counts_are_torchs(size: tuple[int, ...], tmp_path: Path) -> None:
    pkl = asm(("PROTO", 2), "EMPTY_DICT", ("BINUNICODE", "w"),
              *v2("0", size=size, stride=(0,) * len(size)), "SETITEM", "STOP")
    data = torch_layout("archive", pkl, [("0", b"\0" * 8)])
    try:
        torch.load(io.BytesIO(data), weights_only=True)
        loads = True
    except RuntimeError as exc:
        assert "numel: integer multiplication overflow" in str(exc)
        loads = False
    path = tmp_path / "x.pt"
    path.write_bytes(data)
    for engine in ENGINES:
        for target in (data, path):   # bytes: the general fast path; a file: the column lane
            report = scan_with(target, engine)
            assert report.weights_only.loadable == loads, (engine, type(target), report.weights_only)
            assert (report.verdict == "safe") == loads, (engine, report.findings)


@pytest.mark.parametrize("size", [(2**31, 2**31), (3, 2**61), (2**61, 3, 0), (2**31 - 1, 2**32, 0)], ids=str)
def test_engines_agree_near_int64(size: tuple[int, ...], tmp_path: Path) -> None:
    """From 2**62 elements on the exact path does not model a view (Unmodelled); the general
    fast path and the lane decline there too, so every engine gives its answer (a review:
    stride-0 views of (2**31, 2**31), which torch loads, were `safe` on the general path)."""
    view = torch.empty(0).set_(torch.zeros(1).untyped_storage(), 0, size, (0,) * len(size))
    buf = io.BytesIO()
    torch.save({"t": view}, buf)
    assert_agree(buf.getvalue(), label=str(size))
    path = tmp_path / "x.pt"   # a file: the column lane's
    path.write_bytes(buf.getvalue())
    assert_agree(path, label=str(size))
