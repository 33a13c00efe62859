"""Property tests for core.zip.directory / core.zip.checks / core.zip.offsets.

* mutated or truncated real torch zips: the zip layer returns or raises CkptError, never
  anything else, and never hangs (every count is bounded before use);
* offsets == zip: any storage list laid out by torch's writer rule chains to exactly the
  data offsets the local headers give.
"""

from __future__ import annotations

import functools
import io
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import CkptError
from ckptguard.core.io.source import BytesSource
from ckptguard.core.limits import Limits
from ckptguard.core.state import Analysis
from ckptguard.core.zip.checks import check_archive, verify_crcs
from ckptguard.core.zip.directory import read_directory, read_local_headers, read_record
from ckptguard.core.zip.offsets import chain_storage_offsets, record_data_offset, verify_chain
from tests.core.zip.zipbuild import Member, build_zip, write_torch_like

SMALL_LIMITS = Limits(max_zip_entries=10_000, max_central_dir_bytes=1 << 20)


@functools.cache
def seeds() -> tuple[bytes, ...]:
    """Real torch.save zips when torch is there, else torch-like archives from our writer."""
    out: list[bytes] = []
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is in the test extra
        torch = None
    if torch is not None:
        for obj in ({"a": torch.arange(6.0).view(2, 3), "e": torch.empty(0, dtype=torch.int64)},
                    [torch.ones(3, dtype=torch.float16), {"k": torch.zeros(2, 2)}]):
            buf = io.BytesIO()
            torch.save(obj, buf)
            out.append(buf.getvalue())
    recs: list[tuple[str, bytes | int]] = [("data.pkl", b"\x80\x02N."), ("data/0", b"x" * 40),
                                           ("version", b"3\n")]
    buf = io.BytesIO()
    write_torch_like(buf, "w", recs)
    out.append(buf.getvalue())
    out.append(build_zip([Member("p/a", b"hello" * 20, method=8), Member("p/b", b"x")],
                         zip64_eocd=True, comment=b"c"))
    return tuple(out)


def _exercise(data: bytes) -> None:
    src = BytesSource(data)
    try:
        d = read_directory(src, SMALL_LIMITS)
    except CkptError:
        return
    errors: list[CkptError] = []
    locs = read_local_headers(src, d.entries, errors=errors)
    an = Analysis()
    check_archive(d, locs, an)
    verify_crcs(src, d, an, max_nbytes=1 << 20)
    for e in d.entries[:50]:
        try:
            read_record(src, d, e.name, max_nbytes=1 << 20)
        except CkptError:
            pass
    d.prefix()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    base = bytearray(draw(st.sampled_from(seeds())))
    # aim most edits at the tail, where the directory and end records live
    n_edits = draw(st.integers(0, 8))
    for _ in range(n_edits):
        if draw(st.booleans()):
            pos = draw(st.integers(max(0, len(base) - 300), len(base) - 1))
        else:
            pos = draw(st.integers(0, len(base) - 1))
        kind = draw(st.sampled_from(["byte", "ff", "zero", "insert", "delete"]))
        if kind == "byte":
            base[pos] = draw(st.integers(0, 255))
        elif kind == "ff":
            base[pos:pos + 4] = b"\xff\xff\xff\xff"
        elif kind == "zero":
            base[pos:pos + 2] = b"\0\0"
        elif kind == "insert":
            base[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            del base[pos:pos + draw(st.integers(1, 16))]
    cut = draw(st.sampled_from(["none", "head", "tail"]))
    if cut == "head" and base:
        del base[:draw(st.integers(0, len(base)))]
    elif cut == "tail" and base:
        del base[draw(st.integers(0, len(base))):]
    return bytes(base)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_zips_raise_only_ckpterror(data: bytes) -> None:
    _exercise(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400).map(lambda b: b + b"PK\x05\x06" + b"\0" * 18),
       st.binary(max_size=40))
def test_random_bytes_around_an_eocd(data: bytes, tail: bytes) -> None:
    _exercise(data + tail)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
       alignment=st.sampled_from([1, 2, 16, 64, 4096]),
       prefix=st.text("abcXYZ_.-0123456789", min_size=1, max_size=30),
       repeats=st.lists(st.integers(0, 11), max_size=6))
def test_chained_offsets_equal_the_zip(sizes: list[int], alignment: int, prefix: str,
                                       repeats: list[int]) -> None:
    recs: list[tuple[str, bytes | int]] = [("data.pkl", b"\x80\x02N.")]
    recs += [(f"data/{k}", bytes([k % 256]) * n) for k, n in enumerate(sizes)]
    recs += [("version", b"3\n")]
    buf = io.BytesIO()
    write_torch_like(buf, prefix, recs, alignment)
    data = buf.getvalue()
    src = BytesSource(data)
    d = read_directory(src)
    locs = read_local_headers(src, d.entries)
    first = d.by_name[f"{prefix}/data/0"]
    order = [(str(k), n) for k, n in enumerate(sizes)]
    for r in repeats:                      # re-encountered pids do not advance the chain
        if r < len(order):
            order.insert(min(len(order), r + 1), order[r])
    chain = chain_storage_offsets(prefix, locs[first.index].data_offset, order, alignment,
                                  first_header_offset=first.header_offset)
    assert [c.key for c in chain] == [str(k) for k in range(len(sizes))]
    an = Analysis()
    assert all(verify_chain(chain, d, locs, an).values()) and an.findings == []
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for c in chain:
            assert z.getinfo(f"{prefix}/data/{c.key}").header_offset == c.header_offset


@settings(max_examples=300, deadline=None)
@given(h=st.integers(0, 2**40), name_len=st.integers(1, 300), size=st.integers(0, 2**40),
       alignment=st.sampled_from([1, 2, 8, 64, 4096, 65536]))
def test_record_data_offset_is_the_next_aligned_start(h: int, name_len: int, size: int,
                                                      alignment: int) -> None:
    got = record_data_offset(h, name_len, size, alignment)
    start = record_data_offset(h, name_len, size, 1)
    assert got % alignment == 0 and start <= got < start + alignment
    assert start - (h + 30 + name_len + 4) in (0, 4 + 16, 4 + 8, 4 + 24)


def test_seeds_are_clean() -> None:
    for data in seeds()[:-1]:
        src = BytesSource(data)
        d = read_directory(src)
        an = Analysis()
        check_archive(d, read_local_headers(src, d.entries), an)
        assert an.findings == []


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
