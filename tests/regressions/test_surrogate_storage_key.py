"""A storage key holding a lone surrogate (found by a red-team round).

BINUNICODE decodes with surrogatepass (torch and the C unpickler alike), so a storage key
can be "\\ud800". torch refuses the load (pybind cannot pass the key to
get_storage_from_record: TypeError). ckptguard's record lookup
(core.zip.directory.ZipDirectory.find) encodes the name with "surrogateescape", which
only maps \\udc80-\\udcff: UnicodeEncodeError escapes the scan, the report is `invalid`
with INTERNAL_ERROR and "not a torch checkpoint", in every engine. Now the lookup finds
no record and the emulation gives torch's TypeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.differential.torch_answer import torch_answer


@pytest.mark.torch
def test_surrogate_storage_key_is_reported_as_torch_refuses_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "surrogate.pt"
    path.write_bytes(torch_layout("archive", state_dict(("w", v2("\ud800"))), [("0", bytes(8))]))
    loadable, error_type, first_line = torch_answer(path)
    assert not loadable and error_type == "TypeError"
    report = scan_path(path)
    assert "INTERNAL_ERROR" not in {f.code for f in report.findings}
    assert report.weights_only is not None
    assert (report.weights_only.loadable, report.weights_only.error_type,
            report.weights_only.error) == (loadable, error_type, first_line)
