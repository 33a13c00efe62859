"""core.gcpause: the collector is off inside the block and as it was after it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ckptguard.core.gcpause import collector_paused


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled_before", [True, False])
def test_off_inside_and_as_before_after(enabled_before: bool) -> None:
    gc.enable() if enabled_before else gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is enabled_before


def test_restored_when_the_block_raises() -> None:
    gc.enable()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_nested_block_leaves_it_to_the_outermost() -> None:
    gc.enable()
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_scan_leaves_the_collector_as_it_found_it() -> None:
    from ckptguard.core.scan import scan_bytes

    gc.enable()
    assert scan_bytes(b"\x80\x02}q\x00.").verdict == "safe"
    assert gc.isenabled()
    gc.disable()
    scan_bytes(b"cos\nsystem\n(S'echo'\ntR.")
    assert not gc.isenabled()
