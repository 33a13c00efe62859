"""An empty APPENDS/SETITEMS batch hidden behind a PROTO opcode (found by a red-team round).

The fast paths' opcode walk (core.pickle.fast.tokenize) stops a run at a MARK directly
followed by APPENDS/SETITEMS, because the C unpickler skips an empty batch on any object
where torch checks the object's type. PROTO pushes nothing and is walked in Python, so
`MARK PROTO 2 APPENDS` still forms an empty batch: the C unpickler skips it, torch refuses
("Can only extend lists, but got <class 'dict'>"). Under engine auto/general the report
said safe and loadable; now the walk declines a PROTO after the first opcode, and every
engine gives the exact engine's (torch's) answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from tests.builders.torchlayout import state_dict, torch_layout, v2
from tests.differential.torch_answer import torch_answer

EMPTY_BATCH = ["MARK", ("PROTO", 2)]

CASES = {
    "appends_on_the_root_dict": state_dict(("w", v2("0")), extra=[*EMPTY_BATCH, "APPENDS"]),
    "setitems_on_a_tensor": state_dict(("w", [*v2("0"), *EMPTY_BATCH, "SETITEMS"])),
    "appends_on_a_tensor": state_dict(("w", [*v2("0"), *EMPTY_BATCH, "APPENDS"])),
}


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_empty_batch_behind_proto(tmp_path: Path, case: str) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "batch.pt"
    path.write_bytes(torch_layout("archive", CASES[case], [("0", b"\x00" * 8)]))
    loadable, error_type, first_line = torch_answer(path)
    assert not loadable and error_type == "UnpicklingError"
    exact = scan_path(path, options=ScanOptions(engine="exact"))
    assert exact.weights_only is not None and exact.weights_only.loadable is False
    assert exact.weights_only.error == first_line   # the exact engine words torch's refusal
    for engine in ("auto", "general"):
        report = scan_path(path, options=ScanOptions(engine=engine))
        assert report.weights_only is not None
        assert (report.verdict, report.weights_only.loadable, report.weights_only.error) == \
            (exact.verdict, exact.weights_only.loadable, exact.weights_only.error), engine
        assert report.verdict != "safe"
