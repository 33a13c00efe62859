"""The fast lane (core.lane.torch_zip) gives exactly the general path's report, or declines.

Every torch-written checkpoint of the corpus is scanned twice: as shipped (the lane takes
what it can prove clean) and with the lane switched off. The reports must be equal in
everything but timings and I/O counts. The lane must also actually take the plain cases,
so this test cannot pass by the lane declining everything.
"""

from __future__ import annotations

from typing import Any

import pytest

from ckptguard.core.io.source import FileSource
from ckptguard.core.lane import torch_zip as fastlane
from ckptguard.core.scan import scan_path
from ckptguard.core.state import Analysis
from tests.engine import needs_sound_re
from tests.fixtures.generate import Case

# Corpus cases that are a plain torch.save zip the lane is built for (by construction of
# tests.fixtures.generate); the lane must take each of them.
MUST_TAKE = ("dtype-", "v3-", "view-", "container-", "param-", "state-dict-", "many-storages",
             "align-")


def comparable(path: Any) -> dict[str, Any]:
    report = scan_path(path)
    out = report.to_json()
    out.pop("timings_ms")
    out.pop("io")
    # the Python objects too, not only their JSON: a tuple where the other path has a list
    # is a different API for library users
    out["tensor_rows"] = [t._asdict() for t in report.tensors]
    out["storage_rows"] = [s._asdict() for s in report.storages]
    return out


def general(path: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setattr(fastlane, "try_torch_zip", lambda source, an: False)
        return comparable(path)


def lane_takes(path: Any) -> bool:
    with FileSource(path) as src:
        return fastlane.try_torch_zip(src, Analysis())


def test_lane_report_equals_general_report(torch_corpus: dict[str, Case],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for case_id, case in sorted(torch_corpus.items()):
        fast = comparable(case.path)
        slow = general(case.path, monkeypatch)
        assert fast == slow, case_id


@needs_sound_re
def test_lane_takes_the_plain_families(torch_corpus: dict[str, Case]) -> None:
    taken = [case_id for case_id, case in sorted(torch_corpus.items()) if lane_takes(case.path)]
    assert len(taken) >= 40, taken
    for prefix in MUST_TAKE:
        assert any(t.startswith(prefix) for t in taken), (prefix, taken)
