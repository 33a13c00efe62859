"""Every engine gives one report on every generated corpus (tests/agreement).

The corpora: every case tests.fixtures.generate writes with real torch (dtypes, views,
sharing, containers, legacy and zip, the writer's knobs, files weights_only refuses), the
hand-built archives the lane takes or declines (tests/core/lane), and the pickles the
fast paths must refuse (tests/regressions). The lane and the fast path must also really
run on the plain cases, so agreement cannot come from every fast path declining.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptguard.core.io.source import BytesSource
from ckptguard.core.lane.torch_zip import try_torch_zip
from ckptguard.core.state import Analysis
from tests.agreement import ENGINES, assert_agree
from tests.builders.torchlayout import torch_layout
from tests.core.lane.test_fastlane import TAKEN, _declined
from tests.regressions.test_polyglots_and_fast_paths import FAST_PATH_CASES


def test_engines_agree_on_the_torch_corpus(torch_corpus: dict[str, object]) -> None:
    for case_id, case in sorted(torch_corpus.items()):
        assert_agree(case.path, label=case_id)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_engines_agree_on_archives_the_lane_takes(case: str) -> None:
    data = TAKEN[case]()
    report = assert_agree(data, label=case)
    assert report["verdict"] == "safe" and report["tensors"]


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_the_lane_really_takes_them(case: str) -> None:
    assert try_torch_zip(BytesSource(TAKEN[case]()), Analysis())


@pytest.mark.parametrize("case", sorted(_declined()))
def test_engines_agree_on_archives_the_lane_declines(case: str) -> None:
    assert_agree(_declined()[case], label=case)


@pytest.mark.parametrize("case", sorted(FAST_PATH_CASES))
@pytest.mark.parametrize("container", ["pickle", "torch-zip"])
def test_engines_agree_on_pickles_the_fast_paths_refuse(case: str, container: str,
                                                        tmp_path: Path) -> None:
    pkl = FAST_PATH_CASES[case]
    path = tmp_path / "case.pt"
    path.write_bytes(pkl if container == "pickle" else torch_layout("archive", pkl))
    report = assert_agree(path, label=case)
    assert report["verdict"] != "safe"


def test_engine_names_are_the_options_values() -> None:
    from typing import Literal, get_args

    from ckptguard.core.state import Engine  # a string at run time (core/typenames.py)
    assert set(get_args(eval(Engine, {"Literal": Literal}))) == set(ENGINES)
