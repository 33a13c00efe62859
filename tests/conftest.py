"""Fixtures and guards for the whole suite.

One name per module: installed, the engine and the service are `ckptguard.core` and
`ckptguard.app`. The repository root is on sys.path (tests import `tests.*`), where the
folders `core/` and `app/` would also import as top-level `core` and `app`, a second copy
of every module with its own classes and caches. The guard below refuses those names, so a
test (or a module) that spells one fails at once instead of testing a twin.

The folders under tests/core mirror core's packages, except three renamed so that no test
folder shadows a module the suite imports: sources (core/io), pickles (core/pickle) and
torch_rules (core/torch).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fixtures.generate import Case


class _OneNamePerModule(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in ("core", "app"):
            raise ImportError(f"'{fullname}' is ckptguard.{fullname} installed: import it by that name")
        return None


sys.meta_path.insert(0, _OneNamePerModule())


@pytest.fixture(scope="session")
def torch_corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """Every tests.fixtures.generate case, written by real torch into a session temp dir."""
    pytest.importorskip("torch")
    from tests.fixtures.generate import generate

    out: Path = tmp_path_factory.mktemp("torch_corpus")
    return {case.id: case for case in generate(out)}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under CI=true the oracle must be present: the README's install brings torch, and a
    suite that skipped every differential test for want of it would pass for nothing."""
    from tests.components import in_ci

    if in_ci():
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(f"CI=true but torch (the test oracle) does not import: {exc}") from exc
