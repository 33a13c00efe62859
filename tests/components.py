"""Tests that need a system component (PostgreSQL, podman, Chromium, ...) call `missing`.

On a developer's machine a missing component skips the test with the reason; under
`CI=true` it fails it, so a failed install in `.ci/run` cannot turn CI green.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str) -> NoReturn:
    """Skip (developer machine) or fail (CI=true): a component this test needs is absent."""
    if in_ci():
        pytest.fail(f"CI=true and a required component is missing: {reason}", pytrace=False)
    pytest.skip(reason)
