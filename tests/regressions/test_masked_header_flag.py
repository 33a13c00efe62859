"""(Found by a red-team round.) central-directory flag 0x2000 ("local header masked") on any entry.

miniz refuses the whole archive when it reads the central directory (torch.load:
"PytorchStreamReader failed reading zip archive: unsupported encryption"), before any
record is read. ckptguard flags ZIP_ENCRYPTED_ENTRY, but only refuses the load when it
reads the flagged record itself: on a storage record (never read) the report says
loadable, and on a metadata record it words another failure."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.differential.torch_answer import torch_answer

FLAG_MASKED_HEADER = 0x2000


def with_central_flag(data: bytes, suffix: str, flag: int) -> bytes:
    out = bytearray(data)
    pos = out.find(b"PK\x01\x02")
    while pos >= 0:
        name_len = struct.unpack_from("<H", out, pos + 28)[0]
        if bytes(out[pos + 46:pos + 46 + name_len]).endswith(suffix.encode()):
            flags = struct.unpack_from("<H", out, pos + 8)[0]
            struct.pack_into("<H", out, pos + 8, flags | flag)
        pos = out.find(b"PK\x01\x02", pos + 4)
    return bytes(out)


@pytest.mark.torch
@pytest.mark.parametrize("record", ["data/0", "version", ".data/serialization_id"])
def test_masked_header_flag_fails_the_whole_load(tmp_path: Path, record: str) -> None:
    pytest.importorskip("torch")
    plain = torch_layout("archive", state_dict(("w", v2("0"))), [("0", b"\x00" * 8)])
    path = tmp_path / "masked.pt"
    path.write_bytes(with_central_flag(plain, record, FLAG_MASKED_HEADER))
    loadable, error_type, first_line = torch_answer(path)
    assert not loadable and first_line is not None and "unsupported encryption" in first_line
    wo = scan_path(path).weights_only
    assert wo is not None
    assert (wo.loadable, wo.error_type, (wo.error or "").split("\n")[0]) == \
        (loadable, error_type, first_line)
