from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import SourceError
from ckptguard.core.io.source import BytesSource, FileSource, coalesce, read_coalesced


def test_file_source_reads_exact_ranges_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with FileSource(path) as src:
        assert src.size == 1024
        assert src.read_at(10, 3) == bytes([10, 11, 12])
        assert (src.stats.bytes_read, src.stats.requests) == (3, 1)
        with pytest.raises(SourceError):
            src.read_at(1020, 10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 300)), max_size=40))
def test_read_many_equals_single_reads_whatever_the_grouping(spans: list[tuple[int, int]]) -> None:
    data = bytes(i % 251 for i in range(6000))
    src = BytesSource(data)
    expected = [data[o:o + n] for o, n in spans]
    assert read_coalesced(src.read_at, spans) == expected


def test_file_read_many_reads_only_the_spans(tmp_path: Path) -> None:
    """Locally a pread is cheap: nearby spans are read one by one, never the bytes between
    them (issue 14: a checkpoint of many small tensors was read whole); spans that touch or
    overlap share one read, so no byte is read twice."""
    path = tmp_path / "f.bin"
    data = bytes(i % 251 for i in range(10**6))
    path.write_bytes(data)
    spans = [(i * 200, 30) for i in range(1000)] + [(900_000, 8)]
    with FileSource(path) as src:
        assert src.read_many(spans) == [data[o:o + n] for o, n in spans]
        assert src.stats.bytes_read == 30 * 1000 + 8
        touching = [(0, 10), (10, 5), (12, 8), (500, 4)]
        assert src.read_many(touching) == [data[o:o + n] for o, n in touching]
        assert src.stats.bytes_read == 30 * 1000 + 8 + 20 + 4


def test_coalesce_keeps_far_spans_apart() -> None:
    assert coalesce([(0, 4), (10**9, 4)]) == [(0, 4, [0]), (10**9, 4, [1])]
