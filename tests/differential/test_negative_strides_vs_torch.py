"""Negative strides in `_rebuild_tensor_v2` against torch.load(weights_only=True) itself.

ATen's computeStorageNbytes multiplies each stride by its size - 1 as unsigned 64-bit
numbers: a negative stride overflows only where that size is above 1, so a dimension of
size 1 (or any size-0 dimension) takes any stride and torch loads the file. Found by the
helper hunt on the fast-path walk: the model called every negative stride an overflow
(weights_only loadable False, verdict suspicious) where torch loads the tensor.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2
from tests.differential.torch_answer import torch_answer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

_NUMEL = 8   # float32 elements of the one storage record

# every shape of 1 or 2 dims over sizes 0-2, with a stride of -2..1 per dim, one negative at least
_CASES = [(size, stride)
          for dims in (1, 2)
          for size in itertools.product((0, 1, 2), repeat=dims)
          for stride in itertools.product((-2, -1, 0, 1), repeat=dims)
          if min(stride) < 0]


def _file(size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    pkl = asm(("PROTO", 2), "EMPTY_DICT", ("BINUNICODE", "x"),
              *v2("0", numel=_NUMEL, size=size, stride=stride), "SETITEM", "STOP")
    return torch_layout("archive", pkl, [("0", bytes(4 * _NUMEL))])


def test_negative_strides_load_as_torch_loads_them(tmp_path: Path) -> None:
    wrong, torch_loads = [], set()
    for size, stride in _CASES:
        path = tmp_path / "case.pt"
        path.write_bytes(_file(size, stride))
        loadable, error_type, first_line = torch_answer(path)
        torch_loads.add(loadable)
        wo = scan_path(path).weights_only
        if (wo.loadable, wo.error_type, wo.error) != (loadable, error_type, first_line):
            wrong.append((size, stride, loadable, wo.error))
    assert torch_loads == {True, False}   # the cases hold both answers
    assert wrong == []
