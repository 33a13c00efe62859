"""Session fixtures for differential tests: the torch-written corpus, generated once."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.fixtures.generate import Case, generate  # noqa: E402


@pytest.fixture(scope="session")
def torch_corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """Every tests.fixtures.generate case, written by real torch into a session temp dir."""
    out: Path = tmp_path_factory.mktemp("torch_corpus")
    return {case.id: case for case in generate(out)}
