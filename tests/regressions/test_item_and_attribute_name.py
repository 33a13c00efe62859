"""A dict item and a BUILD attribute of one name (found by a red-team round).

A state_dict (`OrderedDict`) holds item `w` (float32[4]), and BUILD gives the same object an
attribute `w` (int64[2], another storage). torch returns both (`sd["w"]`, `sd.w`). The
README's naming rule (SETITEM keys, then BUILD attribute names) gives both the path `["w"]`:
the manifest lists the two tensors as torch builds them, every engine alike, and the reader
refuses the name, as for keys that print alike, instead of reading one of the two."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ckptguard.core.loader import open_checkpoint
from ckptguard.core.scan import scan_path
from ckptguard.core.state import Engine, ScanOptions
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import torch_layout, v2


def _item_and_attribute() -> bytes:
    pkl = asm(("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
              "MARK", ("BINUNICODE", "w"), *cast(list[Any], v2("0", numel=4, size=(4,))), "SETITEMS",
              "EMPTY_DICT", ("BINUNICODE", "w"),
              *cast(list[Any], v2("1", numel=2, size=(2,), storage="LongStorage")),
              "SETITEM", "BUILD", "STOP")
    return torch_layout("archive", pkl, [("0", bytes(16)), ("1", bytes(range(16)))])


@pytest.fixture
def both(tmp_path: Path) -> Path:
    path = tmp_path / "both.pt"
    path.write_bytes(_item_and_attribute())
    return path


@pytest.mark.torch
def test_torch_builds_an_item_and_an_attribute(both: Path) -> None:
    torch = pytest.importorskip("torch")
    loaded = torch.load(both, weights_only=True)
    assert loaded["w"].dtype == torch.float32 and loaded.w.dtype == torch.int64


@pytest.mark.parametrize("engine", ["auto", "general", "exact"])
def test_the_manifest_lists_both_and_the_reader_refuses_the_name(both: Path, engine: Engine) -> None:
    report = scan_path(both, options=ScanOptions(engine=engine))
    assert report.weights_only.loadable
    assert sorted((t.name, t.dtype, tuple(t.shape)) for t in report.tensors) == [
        ("w", "float32", (4,)), ("w", "int64", (2,))]
    with open_checkpoint(str(both), options=ScanOptions(engine=engine)) as ckpt:
        with pytest.raises(KeyError, match="2 tensors are named 'w'"):
            ckpt.read_tensor("w")
