"""core.zip.offsets: the calculate_storage_offsets chain, differential against torch 2.13."""

from __future__ import annotations

import io
import os
import random
import struct
import zipfile
from pathlib import Path

import pytest

from ckptguard.core.errors import Code, FormatError
from ckptguard.core.io.source import FileSource
from ckptguard.core.state import Analysis
from ckptguard.core.zip.checks import check_archive
from ckptguard.core.zip.directory import read_directory, read_local_headers
from ckptguard.core.zip.offsets import (
    ChainedOffset,
    chain_storage_offsets,
    descriptor_size,
    record_data_offset,
    verify_chain,
)
from tests.core.zip.conftest import TorchFile
from tests.core.zip.zipbuild import write_torch_like

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _chain_for(path: Path, storages: list[tuple[str, int]], alignment: int) -> list[ChainedOffset]:
    src = FileSource(path)
    d = read_directory(src)
    first = d.find(f"{d.prefix()}/data/0")
    assert first is not None
    local = read_local_headers(src, [first])[first.index]
    return chain_storage_offsets(d.prefix(), local.data_offset, storages, alignment,
                                 first_header_offset=local.offset)


def test_chain_equals_torch_get_record_offset_for_every_storage(torch_files: list[TorchFile]) -> None:
    assert len(torch_files) >= 30
    checked = 0
    for tf in torch_files:
        storages = tf.storages()
        if not storages:
            continue
        chain = _chain_for(tf.path, storages, tf.alignment)
        reader = torch._C.PyTorchFileReader(str(tf.path))
        for c in chain:
            assert c.data_offset == reader.get_record_offset(f"data/{c.key}"), (tf.path.name, c)
            assert c.header_offset == reader.get_record_header_offset(f"data/{c.key}")
            if tf.alignment > 1:
                assert c.data_offset % tf.alignment == 0
            checked += 1
        d = read_directory(FileSource(tf.path))
        an = Analysis()
        assert all(verify_chain(chain, d, read_local_headers(FileSource(tf.path), d.entries), an).values())
        assert an.findings == []
    assert checked > 4 * 120   # the 120-storage files at every alignment are in


TABLE_1_4 = {  # FORMATS.md §1.4 -- record: (h, L, P, D, S, next)
    "data.pkl": (0, 12, 18, 64, 509, 589),
    ".format_version": (589, 19, 62, 704, 1, 721),
    ".storage_alignment": (721, 22, 55, 832, 2, 850),
    "byteorder": (850, 13, 63, 960, 6, 982),
    "data/0": (982, 10, 62, 1088, 24, 1128),
    "data/1": (1128, 10, 44, 1216, 10, 1242),
    "data/2": (1242, 10, 58, 1344, 0, 1344),
    "data/3": (1344, 10, 20, 1408, 6, 1430),
    "version": (1430, 11, 61, 1536, 2, 1554),
    ".data/serialization_id": (1554, 26, 50, 1664, 40, 1720),
}


def _layout(path: Path) -> dict[str, tuple[int, int, int, int, int, int]]:
    """(h, L, P, D, S, next) per record, from our reader: the §1.4 table of any torch file."""
    src = FileSource(path)
    d = read_directory(src)
    locs = read_local_headers(src, d.entries)
    out = {}
    for e in d.entries:
        loc = locs[e.index]
        assert loc.extra[:2] == b"FB" and set(loc.extra[4:]) <= {0x5A}
        pad = int.from_bytes(loc.extra[2:4], "little")
        size = e.uncompressed_size
        out[e.name.split("/", 1)[1]] = (e.header_offset, len(e.name_bytes), pad, loc.data_offset, size,
                                        loc.data_offset + size + descriptor_size(e.header_offset, size))
    return out


def test_formats_1_4_worked_example_exactly(ex1: Path, tmp_path: Path) -> None:
    """The §1.4 table, byte for byte; then the same rules on torch 2.13's own ex1.pt.

    torch 2.13 here pickles that state dict in 506 bytes, not the table's 509, so the real
    file's offsets are those of the table shifted; the table itself is rebuilt with a
    509-byte data.pkl (the real pickle + 3 bytes after STOP, which torch ignores).
    """
    with zipfile.ZipFile(ex1) as z:
        recs = {i.filename.split("/", 1)[1]: z.read(i) for i in z.infolist()}
    recs["data.pkl"] += b"\0" * (509 - len(recs["data.pkl"]))
    recs[".data/serialization_id"] = b"0" * 40
    path = tmp_path / "ex1.pt"
    with open(path, "wb") as f:
        write_torch_like(f, "ex1", [(r, recs[r]) for r in TABLE_1_4])
    assert path.stat().st_size == 2421
    assert _layout(path) == TABLE_1_4
    d = read_directory(FileSource(path))
    assert (d.cd_offset, d.cd_size, d.zip64_eocd_offset, d.eocd_offset) == (1720, 603, 2323, 2399)
    for _rec, (h, name_len, _, data_off, size, _) in TABLE_1_4.items():
        assert record_data_offset(h, name_len, size, 64) == data_off
    reader = torch._C.PyTorchFileReader(str(path))
    assert {r: reader.get_record_offset(r) for r in TABLE_1_4} == {r: v[3] for r, v in TABLE_1_4.items()}
    loaded = torch.load(path)
    assert loaded["c"].tolist() == [3.0, 4.0, 5.0]
    chain = chain_storage_offsets("ex1", 1088, [("0", 24), ("1", 10), ("0", 24), ("2", 0), ("3", 6)], 64,
                                  first_header_offset=982)
    assert [(c.key, c.header_offset, c.data_offset) for c in chain] == [
        ("0", 982, 1088), ("1", 1128, 1216), ("2", 1242, 1344), ("3", 1344, 1408)]
    # manifest example: c = a[1] -> storage 0, storage_offset 3 (float32) -> [1100, 1112)
    assert chain[0].data_offset + 3 * 4 == 1100

    # torch's own file: same records, same rules, and the arithmetic still holds
    real = _layout(ex1)
    assert list(real) == list(TABLE_1_4)
    for h, name_len, pad, data_off, size, _ in real.values():
        assert data_off == record_data_offset(h, name_len, size, 64) == h + 30 + name_len + 4 + pad
    hs = [v[0] for v in real.values()] + [read_directory(FileSource(ex1)).cd_offset]
    assert [v[5] for v in real.values()] == hs[1:]


def test_record_data_offset_equals_torch_no_read_arithmetic(ex1: Path) -> None:
    """C++ getOffset via get_record_offset_no_read: an oracle free of I/O, incl. > 4 GiB."""
    reader = torch._C.PyTorchFileReader(str(ex1))
    rng = random.Random(7)
    edges = [0, 1, 0xFFFFFFFE, 0xFFFFFFFF, 0x100000000, 2**40]
    for _ in range(400):
        h = rng.choice([*edges, rng.randrange(2 ** 34)]) + rng.randint(0, 3)
        size = rng.choice([*edges, rng.randrange(2 ** 34)])
        alignment = rng.choice([1, 2, 16, 64, 4096])
        key = str(rng.randrange(10**rng.randint(1, 6)))
        expected = reader.get_record_offset_no_read(h, f"data/{key}", size, alignment)
        assert record_data_offset(h, len(f"ex1/data/{key}"), size, alignment) == expected


def test_descriptor_size_rule() -> None:
    assert descriptor_size(0, 0) == 0
    assert descriptor_size(2**40, 0) == 0
    assert descriptor_size(10, 1) == 16
    assert descriptor_size(0xFFFFFFFF, 1) == 24
    assert descriptor_size(10, 0xFFFFFFFF) == 24


def test_first_key_must_be_zero_with_torchs_message() -> None:
    with pytest.raises(FormatError) as exc:
        chain_storage_offsets("ex", 64, [("5", 4), ("0", 4)], 64)
    assert exc.value.code is Code.TORCH_STORAGE_ORDER
    assert exc.value.message == "expected key '0', got '5'"


def test_torch_raises_the_same_order_message(tmp_path: Path) -> None:
    """Reorder data/* keys so the pickle meets '1' first: torch's mmap path asserts."""
    path = tmp_path / "o.pt"
    torch.save({"a": torch.ones(2), "b": torch.zeros(3)}, path)
    raw = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        recs = [(i.filename.split("/", 1)[1], z.read(i)) for i in z.infolist()]
    pkl = dict(recs)["data.pkl"]
    # swap the keys in the pickle (BINUNICODE '0' <-> '1') and the record names
    pkl = pkl.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x00#").replace(
        b"X\x01\x00\x00\x001", b"X\x01\x00\x00\x000").replace(b"X\x01\x00\x00\x00#", b"X\x01\x00\x00\x001")
    swapped = {"data/0": "data/1", "data/1": "data/0"}
    recs = [(swapped.get(n, n), pkl if n == "data.pkl" else d) for n, d in recs]
    with open(path, "wb") as f:
        write_torch_like(f, "o", recs)
    from torch.utils.serialization import config

    old = config.load.calculate_storage_offsets
    config.load.calculate_storage_offsets = True
    try:
        with pytest.raises(AssertionError, match="expected key '0', got '1'"):
            torch.load(path, mmap=True)
    finally:
        config.load.calculate_storage_offsets = old
    with pytest.raises(FormatError, match="expected key '0', got '1'"):
        chain_storage_offsets("o", 0, [("1", 8), ("0", 12)], 64)


def test_repeats_reuse_the_first_result() -> None:
    chain = chain_storage_offsets("p", 128, [("0", 8), ("1", 0), ("0", 8), ("1", 0), ("2", 4)], 64)
    assert [c.key for c in chain] == ["0", "1", "2"]
    # data/1 (empty) adds no descriptor: data/2's header sits where data/1's bytes start
    assert chain[2].header_offset == chain[1].data_offset


def test_verify_chain_mismatch_matches_torch_debug_message(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A gap before data/1 breaks the chain; torch's TORCH_SERIALIZATION_DEBUG says the same."""
    orig = tmp_path / "g.pt"
    torch.save({"a": torch.ones(2), "b": torch.zeros(3)}, orig)
    with zipfile.ZipFile(orig) as z:
        recs = [(i.filename.split("/", 1)[1], z.read(i)) for i in z.infolist()]
    path = tmp_path / "gap.pt"
    with open(path, "wb") as f:
        write_torch_like(f, "gap", recs, gaps={"data/1": b"\0" * 100})
    src = FileSource(path)
    d = read_directory(src)
    locs = read_local_headers(src, d.entries)
    first = locs[d.by_name["gap/data/0"].index]
    chain = chain_storage_offsets("gap", first.data_offset, [("0", 8), ("1", 12)], 64,
                                  first_header_offset=first.offset)
    an = Analysis()
    assert verify_chain(chain, d, locs, an) == {"0": True, "1": False}
    [finding] = an.findings
    assert finding.code is Code.TORCH_OFFSET_MISMATCH and finding.record == "gap/data/1"
    monkeypatch.setenv("TORCH_SERIALIZATION_DEBUG", "1")
    with pytest.raises(RuntimeError) as exc:
        torch.load(path)
    torch_words = str(exc.value).split(": ", 1)[1]   # "Incorrect offset for data/1, got ..."
    assert finding.message.endswith(torch_words)
    # without local headers the central header offset is compared instead
    an2 = Analysis()
    assert verify_chain(chain, d, {}, an2) == {"0": True, "1": False}
    assert "header offset" in an2.findings[0].message
    # a storage whose record is absent: unverified, no finding here
    an3 = Analysis()
    assert verify_chain([ChainedOffset("9", 0, 0, 0)], d, locs, an3) == {"9": False}
    assert an3.findings == []
    assert os.environ["TORCH_SERIALIZATION_DEBUG"] == "1"


def test_chain_bad_nbytes() -> None:
    with pytest.raises(FormatError):
        chain_storage_offsets("p", 0, [("0", -1)], 64)


@pytest.mark.slow
def test_zip64_sparse_archive_chain_equals_torch(tmp_path: Path) -> None:
    """FORMATS.md §1.4 big.pt: a 4 GiB + 16 storage, then 16, 0, 24 bytes (sparse file).

    With a 381-byte data.pkl the records land exactly where §1.4 says (data/0 at 854).
    """
    path = tmp_path / "big.pt"
    storages = [("0", 4_294_967_312), ("1", 16), ("2", 0), ("3", 24)]
    recs: list[tuple[str, bytes | int]] = [("data.pkl", b"\x80\x02N." + b"\0" * 377),
                                           (".format_version", b"1"), (".storage_alignment", b"64"),
                                           ("byteorder", b"little")]
    recs += [(f"data/{k}", n if n > 1000 else b"\x01" * n) for k, n in storages]
    recs += [("version", b"3\n")]
    with open(path, "wb") as f:
        write_torch_like(f, "big", recs)
    assert path.stat().st_blocks * 512 < 10 * 2**20     # sparse: a few blocks on disk
    src = FileSource(path)
    d = read_directory(src)
    assert d.zip64
    with zipfile.ZipFile(path) as z:
        assert [(i.filename, i.header_offset, i.file_size) for i in z.infolist()] == [
            (e.name, e.header_offset, e.uncompressed_size) for e in d.entries]
    locs = read_local_headers(src, d.entries)
    # §1.4: (h, zip64 extra body bytes, FB pad, D) per storage record
    expect = {"0": (854, 16, 42, 960), "1": (4_294_968_296, 8, 32, 4_294_968_384),
              "2": (4_294_968_424, 8, 32, 4_294_968_512), "3": (4_294_968_512, 8, 8, 4_294_968_576)}
    for key, (h, z64, pad, data_off) in expect.items():
        e = d.by_name[f"big/data/{key}"]
        loc = locs[e.index]
        assert (e.header_offset, loc.data_offset) == (h, data_off)
        assert loc.extra[:4] == struct.pack("<HH", 1, z64)
        assert loc.extra[4 + z64:] == b"FB" + struct.pack("<H", pad) + b"Z" * pad
    chain = _chain_for(path, storages, 64)
    assert [(c.header_offset, c.data_offset) for c in chain] == [(v[0], v[3]) for v in expect.values()]
    reader = torch._C.PyTorchFileReader(str(path))
    for c in chain:
        assert c.data_offset == reader.get_record_offset(f"data/{c.key}")
        assert c.header_offset == reader.get_record_header_offset(f"data/{c.key}")
    an = Analysis()
    assert all(verify_chain(chain, d, locs, an).values())
    assert an.findings == []
    check_archive(d, locs, an)
    assert an.findings == []
