"""A corrupt local header in front of an empty record (found by a red-team round).

miniz's extract returns before it reads the local header when the central directory
gives the entry a compressed size of 0 ("Empty file, or a directory"), so torch.load of
a checkpoint whose empty storage record `data/0` has a bad local signature or a name
length past the end of the file succeeds. ckptguard validates every local header the
same way and reported "failed reading file data/0: invalid header or archive is corrupted",
not loadable. Now `weights_only` is torch's answer (loadable); the header stays a finding of
its own (zipfile, unzip and streaming readers fail on that member), so the verdict follows
that finding, not torch."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.differential.torch_answer import torch_answer


def empty_storage_with(patch: Callable[[bytearray, int], None]) -> bytes:
    data = bytearray(torch_layout("archive", state_dict(("w", v2("0", numel=0, size=(0,)))),
                                  [("0", b"")]))
    header = data.find(b"archive/data/0") - 30
    assert data[header:header + 4] == b"PK\x03\x04"
    patch(data, header)
    return bytes(data)


PATCHES: dict[str, Callable[[bytearray, int], None]] = {
    "bad_signature": lambda d, h: d.__setitem__(slice(h, h + 4), b"XXXX"),
    "name_length_past_eof": lambda d, h: struct.pack_into("<H", d, h + 26, 40000),
}


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(PATCHES))
def test_empty_record_local_header_is_not_read(tmp_path: Path, case: str) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "empty.pt"
    path.write_bytes(empty_storage_with(PATCHES[case]))
    loadable, _, _ = torch_answer(path)
    assert loadable
    report = scan_path(path)
    assert report.weights_only is not None
    assert (report.weights_only.loadable, report.weights_only.error) == (True, None)
    assert report.verdict != "safe"   # other readers fail on the damaged header
