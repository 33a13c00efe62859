"""Real checkpoints must never be called `unsafe`: Lightning-style dicts, whole models,
optimizer/scheduler states, NumPy RNG state — zip and legacy streams alike."""

from __future__ import annotations

import argparse
import collections
import datetime
import io
import pathlib
from typing import Any

import numpy as np
import pytest

from ckptguard.core.io.source import BytesSource
from ckptguard.core.scan import scan_source

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def _checkpoints() -> dict[str, Any]:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.BatchNorm1d(2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    return {
        "lightning_like": {
            "state_dict": model.state_dict(), "epoch": 3, "version": torch.__version__,
            "hyper_parameters": argparse.Namespace(lr=0.1, name="x"), "best": np.float64(0.5),
            "arr": np.arange(3), "path": pathlib.PosixPath("/x"),
            "when": datetime.datetime(2024, 1, 1), "counts": collections.defaultdict(int, a=1),
            "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()],
            "rng": np.random.get_state(), "torch_rng": torch.get_rng_state()},
        "whole_model": model,
    }


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("case", ["lightning_like", "whole_model"])
def test_real_checkpoints_are_not_unsafe(case: str, legacy: bool) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(_checkpoints()[case], buf, _use_new_zipfile_serialization=not legacy)
    report = scan_source(BytesSource(buf.getvalue()))
    assert report.verdict == "suspicious", [(f.code, f.message) for f in report.findings]
    outside = {g.full: g.status for g in report.globals if g.status != "allowed"}
    assert outside and set(outside.values()) == {"benign"}, outside
