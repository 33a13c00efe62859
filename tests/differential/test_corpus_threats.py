"""The benign torch corpus against the knowledge base (issue 18, items 3-4): no checkpoint
torch writes computes an import, frames a pickle so readers disagree, or names a global
the deny table calls dangerous; so none of them is `unsafe`. A deny entry that catches a
global real checkpoints use fails here first."""

from __future__ import annotations

from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from tests.fixtures.generate import Case

_EVASION = {Code.PICKLE_COMPUTED_IMPORT, Code.PICKLE_COMPUTED_GLOBAL, Code.PICKLE_FRAME_DIVERGENCE}


def test_no_benign_checkpoint_computes_globals_or_names_a_dangerous_one(
        torch_corpus: dict[str, Case]) -> None:
    assert torch_corpus
    for case_id, case in sorted(torch_corpus.items()):
        report = scan_path(case.path, options=ScanOptions(engine="exact"))
        codes = {f.code for f in report.findings}
        assert not codes & _EVASION, (case_id, codes & _EVASION)
        dangerous = [g for g in report.globals if g.status == "dangerous"]
        assert not dangerous, (case_id, dangerous)
        assert report.verdict != "unsafe", (case_id, [f.message for f in report.findings])
