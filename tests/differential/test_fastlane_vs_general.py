"""The fast lane (core.lane.torch_zip) really takes the plain torch.save families of the
corpus: tests/agreement proves its reports equal the general and exact engines' on that
corpus, and this test keeps that proof from passing by the lane declining everything.
"""

from __future__ import annotations

from typing import Any

from ckptguard.core.io.source import FileSource
from ckptguard.core.lane import torch_zip as fastlane
from ckptguard.core.state import Analysis
from tests.fixtures.generate import Case

# Corpus cases that are a plain torch.save zip the lane is built for (by construction of
# tests.fixtures.generate); the lane must take each of them.
MUST_TAKE = ("dtype-", "v3-", "view-", "container-", "param-", "state-dict-", "many-storages",
             "align-")


def lane_takes(path: Any) -> bool:
    with FileSource(path) as src:
        return fastlane.try_torch_zip(src, Analysis())


def test_lane_takes_the_plain_families(torch_corpus: dict[str, Case]) -> None:
    taken = [case_id for case_id, case in sorted(torch_corpus.items()) if lane_takes(case.path)]
    assert len(taken) >= 40, taken
    for prefix in MUST_TAKE:
        assert any(t.startswith(prefix) for t in taken), (prefix, taken)
