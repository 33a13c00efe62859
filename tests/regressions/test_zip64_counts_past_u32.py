"""(Found by a red-team round.) a zip64 end record whose entry counts exceed 2**32 - 1.

miniz checks each zip64 count against MZ_UINT32_MAX ("too many files") before it
compares the counts with each other ("unsupported multidisk archive"); ckptguard words
the multidisk failure, or "not modelled" when both counts are large, where torch.load
fails with "too many files"."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.differential.torch_answer import torch_answer


def with_zip64_field(offset: int, fmt: str, *values: int) -> bytes:
    """A torch checkpoint whose zip64 end record has `values` at `offset` (24: the two entry
    counts, 40: the directory size)."""
    out = bytearray(torch_layout("archive", state_dict(("w", v2("0"))), [("0", b"\x00" * 8)]))
    struct.pack_into(fmt, out, out.rfind(b"PK\x06\x06") + offset, *values)
    return bytes(out)


def assert_torchs_words(path: Path, words: str) -> None:
    loadable, error_type, first_line = torch_answer(path)
    assert not loadable and first_line is not None and words in first_line
    wo = scan_path(path).weights_only
    assert wo is not None
    assert (wo.loadable, wo.error_type, (wo.error or "").split("\n")[0]) == \
        (loadable, error_type, first_line)


@pytest.mark.torch
@pytest.mark.parametrize(("on_disk", "total"), [(3, 1 << 32), (1 << 32, 3), (1 << 32, 1 << 32)])
def test_zip64_counts_past_u32(tmp_path: Path, on_disk: int, total: int) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "counts.pt"
    path.write_bytes(with_zip64_field(24, "<QQ", on_disk, total))
    assert_torchs_words(path, "too many files")


@pytest.mark.torch
def test_zip64_central_directory_size_past_u32(tmp_path: Path) -> None:
    """Next among miniz's practical limits: a zip64 directory size past 2**32 - 1."""
    pytest.importorskip("torch")
    path = tmp_path / "cdsize.pt"
    path.write_bytes(with_zip64_field(40, "<Q", 1 << 32))
    assert_torchs_words(path, "unsupported central directory size")
