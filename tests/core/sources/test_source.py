from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import SourceError
from ckptguard.core.io.source import BytesSource, FileSource, ReadOnce, coalesce, read_coalesced


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


_SPANS = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 300)), max_size=40)


def _union(spans: list[tuple[int, int]]) -> set[int]:
    return {b for off, n in spans for b in range(off, off + n)}


@settings(max_examples=200, deadline=None)
@given(kept=_SPANS, spans=_SPANS, in_order=st.booleans())
def test_local_reads_return_every_span_and_read_no_byte_twice(
        tmp_path_factory: pytest.TempPathFactory, kept: list[tuple[int, int]],
        spans: list[tuple[int, int]], in_order: bool) -> None:
    """FileSource.read_many (a pread a span in C loops when the spans are in file order,
    else joined where they touch) and ReadOnce (what it kept is not read again), against
    plain slices and the byte sets read."""
    if in_order:
        spans = sorted(spans)
    path = tmp_path_factory.mktemp("reads") / "f.bin"
    data = bytes(i % 251 for i in range(3400))
    path.write_bytes(data)
    with FileSource(path) as src:
        assert src.read_many(spans) == [data[o:o + n] for o, n in spans]
        assert src.stats.bytes_read == len(_union(spans))
    with FileSource(path) as src:
        once = ReadOnce(src)
        once.read_many(kept)
        before = src.stats.bytes_read
        assert once.read_many(spans) == [data[o:o + n] for o, n in spans]
        kept_bytes = _union([(o, n) for o, n in kept if 0 < n <= (1 << 20)][:64])
        assert src.stats.bytes_read - before == len(_union(spans) - kept_bytes)


def test_local_reads_out_of_bounds_fail(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(100))
    with FileSource(path) as src:
        for spans in ([(0, 4), (98, 4)], [(-1, 2)], [(10, -1)], [(50, 4), (0, 200)]):
            with pytest.raises(SourceError):
                src.read_many(spans)


def test_coalesce_keeps_far_spans_apart() -> None:
    assert coalesce([(0, 4), (10**9, 4)]) == [(0, 4, [0]), (10**9, 4, [1])]
