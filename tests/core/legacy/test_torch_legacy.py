"""core.formats.torch_legacy: differential against torch 2.13 on legacy streams."""

from __future__ import annotations

import collections
import itertools
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code
from ckptguard.core.io.source import BytesSource
from ckptguard.core.scan import scan_path, scan_source
from tests.builders.pickle_asm import asm
from tests.core.legacy.conftest import assert_same_outcome, legacy_bytes, stream
from tests.core.test_regions import _assert_tiles

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def codes(report: Any) -> set[Code]:
    return {f.code for f in report.findings}


def _objects() -> dict[str, Any]:
    import torch

    a = torch.arange(12, dtype=torch.float32).view(3, 4)
    lin = torch.nn.Linear(3, 2)
    return {
        "views": {"a": a, "row": a[1], "col": a[:, 2], "t": a.t()},
        "dtypes": {str(d): torch.ones(3, dtype=d) for d in (
            torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
            torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)},
        "state_dict": torch.nn.Sequential(lin, torch.nn.BatchNorm1d(2)).state_dict(),
        "param": {"p": torch.nn.Parameter(torch.randn(4)), "n": 3, "s": "x"},
        "empty": {"e": torch.empty(0), "scalar": torch.tensor(2.5)},
        "nested": [torch.zeros(2, 2), (torch.ones(1), {"k": torch.full((2,), 7)})],
        "uint16_bug": {"u": torch.ones(2, dtype=torch.uint16)},   # UntypedStorage pid: torch fails
        "ordered": collections.OrderedDict(x=torch.ones(2)),
        "model": lin,                                              # whole module: unknown globals
    }


@pytest.mark.torch
@pytest.mark.parametrize("case", list(_objects()))
def test_weights_only_outcome_matches_torch(case: str, write: Any) -> None:
    path = write(legacy_bytes(_objects()[case]))
    report = scan_path(path)
    assert report.format == "torch-legacy"
    assert_same_outcome(report, path)


@pytest.mark.torch
@pytest.mark.parametrize("case", ["views", "dtypes", "state_dict", "param", "empty", "nested", "ordered"])
def test_manifest_bytes_match_torch(case: str, write: Any) -> None:
    """Every tensor's bytes at (data_offset, nbytes) are the tensor torch loads."""
    import torch

    path = write(legacy_bytes(_objects()[case]))
    report = scan_path(path)
    assert report.verdict == "safe", report.findings
    loaded = torch.load(path, weights_only=True)
    raw = path.read_bytes()
    assert report.tensors
    for t in report.tensors:
        value: Any = loaded
        for seg in t.path:
            value = value[seg]
        assert list(value.shape) == t.shape and str(value.dtype).removeprefix("torch.") == t.dtype
        if value.numel() == 0:
            continue
        assert t.data_offset is not None
        first = torch.empty(1, dtype=value.dtype).copy_(value.reshape(-1)[:1]).view(torch.uint8)
        first = first.numpy().tobytes()
        assert raw[t.data_offset:t.data_offset + len(first)] == first
        storage = value.untyped_storage()
        assert t.data_offset + t.nbytes <= next(s for s in report.storages if s.key == t.storage).nbytes \
            + next(s for s in report.storages if s.key == t.storage).data_offset
        assert storage.nbytes() >= t.nbytes


@pytest.mark.torch
def test_blocks_located_without_reading_data(write: Any) -> None:
    """A 4 MiB legacy file is judged from its pickles and 8-byte counts only."""
    import torch

    path = write(legacy_bytes({f"w{i}": torch.zeros(1 << 18) for i in range(4)}))
    report = scan_path(path)
    assert report.verdict == "safe" and len(report.tensors) == 4
    assert report.io["bytes_read"] < 200_000
    offsets = sorted(s.data_offset for s in report.storages)
    assert [b - a for a, b in itertools.pairwise(offsets)] == [(1 << 20) + 8] * 3


@pytest.mark.torch
@pytest.mark.parametrize("mutate", ["count", "truncate_data", "truncate_count", "no_blocks",
                                    "trailing", "bad_protocol", "unknown_key"])
def test_corruptions_match_torch(mutate: str, write: Any) -> None:
    import torch

    data = bytearray(legacy_bytes({"a": torch.arange(6.0), "b": torch.ones(5, dtype=torch.half)}))
    keys_end = len(data) - (8 + 10) - (8 + 24)      # two blocks follow the key list
    if mutate == "count":
        data[keys_end:keys_end + 8] = struct.pack("<q", 7)
    elif mutate == "truncate_data":
        del data[-3:]
    elif mutate == "truncate_count":
        del data[keys_end + 4:]
    elif mutate == "no_blocks":
        del data[keys_end:]
    elif mutate == "trailing":
        data += b"junk"
    elif mutate == "bad_protocol":
        data[15:21] = asm(("PROTO", 2), ("BININT2", 1000), "STOP")
    elif mutate == "unknown_key":
        pos = data.rindex(b"X", 0, keys_end)     # last BINUNICODE of the key list
        data[pos + 5] = ord("0") if data[pos + 5] != ord("0") else ord("1")
    path = write(bytes(data))
    report = scan_path(path)
    assert_same_outcome(report, path)
    assert report.verdict != "safe"


def test_hostile_main_pickle_is_unsafe(write: Any) -> None:
    main = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "true"), "TUPLE1", "REDUCE",
               "STOP")
    path = write(stream(main, [], []))
    report = scan_path(path)
    assert report.verdict == "unsafe" and Code.PICKLE_DANGEROUS_CALL in codes(report)
    assert_same_outcome(report, path)


@pytest.mark.parametrize("slot", ["magic", "protocol", "sys_info", "keys"])
def test_hostile_side_pickles_are_scanned(slot: str, write: Any) -> None:
    """The four small pickles run through the same unpickler: each is an attack surface."""
    evil = asm(("PROTO", 2), ("GLOBAL", "subprocess", "getoutput"), ("BINUNICODE", "true"),
               "TUPLE1", "REDUCE", "STOP")
    main = asm(("PROTO", 2), "EMPTY_DICT", "STOP")
    data = stream(main, [], [], **{slot: evil}) if slot != "keys" else (
        stream(main, [], [])[: -len(asm(("PROTO", 2), "EMPTY_LIST", "STOP"))] + evil)
    path = write(data)
    report = scan_path(path)
    assert report.verdict == "unsafe"
    assert report.globals and report.globals[0].full == "subprocess.getoutput"
    assert_same_outcome(report, path)


def _duplicate_key_stream() -> bytes:
    """A tensor of storage "1" whose key list names "1" twice: two blocks, ab then cd."""
    main = asm(("PROTO", 2), ("GLOBAL", "torch._utils", "_rebuild_tensor_v2"), "MARK", "MARK",
               ("BINUNICODE", "storage"), ("GLOBAL", "torch", "ByteStorage"), ("BINUNICODE", "1"),
               ("BINUNICODE", "cpu"), ("BININT1", 2), "NONE", "TUPLE", "BINPERSID", ("BININT1", 0),
               ("BININT1", 2), "TUPLE1", ("BININT1", 1), "TUPLE1", "NEWFALSE",
               ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE", "TUPLE", "REDUCE",
               "STOP")
    return stream(main, ["1", "1"], [(2, b"ab"), (2, b"cd")])


def test_duplicate_key_hides_a_block(write: Any) -> None:
    path = write(_duplicate_key_stream())
    report = scan_path(path)
    assert Code.TORCH_UNREFERENCED_RECORD in codes(report)
    assert report.tensors[0].data_offset == path.stat().st_size - 2
    assert_same_outcome(report, path)


@pytest.mark.torch
@pytest.mark.parametrize("case", ["views", "dtypes", "state_dict", "empty", "nested"])
def test_regions_tile_a_legacy_stream(case: str) -> None:
    """The map of a torch.save stream: the five pickles, and per storage its element
    count and its bytes, from byte 0 to the last."""
    data = legacy_bytes(_objects()[case])
    report = scan_source(BytesSource(data, name="case")).to_json()
    _assert_tiles(report["regions"], len(data))
    counts = [r for r in report["regions"] if r["kind"] == "header"]
    assert len(counts) == len(report["storages"]) and {r["length"] for r in counts} == {8}


def test_an_overwritten_block_is_a_region() -> None:
    data = _duplicate_key_stream()
    report = scan_source(BytesSource(data, name="case")).to_json()
    _assert_tiles(report["regions"], len(data))
    hidden = [r for r in report["regions"] if r["kind"] == "unreferenced_record"]
    assert [data[r["offset"]:r["offset"] + r["length"]] for r in hidden] == [b"ab"]


@pytest.mark.torch
@pytest.mark.parametrize("damage", ["count-cut-short", "key-list-not-a-list"])
def test_bytes_the_blocks_cannot_be_read_from_are_a_region(damage: str) -> None:
    """A stream whose blocks cannot be placed (its key list is no list, or it ends inside
    an element count): the bytes after the pickles are still one region of the map."""
    import torch

    data = legacy_bytes({"a": torch.ones(2)})   # ... key list, i64 count, 8 bytes of data
    if damage == "count-cut-short":
        data = data[:-13]
    else:
        [key] = [s.key for s in scan_source(BytesSource(data, name="case")).storages]
        keys_at = data.rindex(pickle.dumps([key], protocol=2))
        data = data[:keys_at] + pickle.dumps(7, protocol=2) + data[-16:]
    report = scan_source(BytesSource(data, name="case")).to_json()
    assert report["weights_only"]["loadable"] is False
    _assert_tiles(report["regions"], len(data))
    assert report["regions"][-1]["kind"] == "unreferenced_data"


@pytest.mark.torch
def test_bad_magic_number_matches_torch(write: Any) -> None:
    """A corrupt magic is no longer sniffed as legacy; the legacy reader still says what torch says."""
    from ckptguard.core.formats import torch_legacy
    from ckptguard.core.state import Analysis
    from tests.core.legacy.conftest import torch_outcome

    magic = asm(("PROTO", 2), ("LONG1", 0x1950A86A20F9469CFC6D), "STOP")
    path = write(stream(asm(("PROTO", 2), "EMPTY_DICT", "STOP"), [], [], magic=magic))
    an = Analysis()
    torch_legacy.analyze(BytesSource(path.read_bytes()), an)
    assert an.weights_only is not None and not an.weights_only.loadable
    assert (an.weights_only.error_type, an.weights_only.error) == torch_outcome(path)[1:]
    assert Code.TORCH_BAD_LEGACY_STREAM in {f.code for f in an.findings}


def test_storage_without_block(write: Any) -> None:
    main = asm(("PROTO", 2), "MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", "FloatStorage"),
               ("BINUNICODE", "9"), ("BINUNICODE", "cpu"), ("BININT1", 1), "NONE", "TUPLE",
               "BINPERSID", "STOP")
    path = write(stream(main, [], []))
    report = scan_path(path)
    assert Code.TORCH_MISSING_RECORD in codes(report)
    assert_same_outcome(report, path)


@pytest.mark.torch
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_streams_never_crash(data: st.DataObject) -> None:
    import torch

    base = bytearray(_mutation_base())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(base) - 1))
        base[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(16, len(base)))
    report = scan_source(BytesSource(bytes(base[:cut])))
    assert report.verdict in ("safe", "suspicious", "unsafe", "invalid")
    assert not any(f.code == Code.INTERNAL_ERROR for f in report.findings), report.findings
    del torch


_BASE: list[bytes] = []


def _mutation_base() -> bytes:
    if not _BASE:
        import torch

        _BASE.append(legacy_bytes({"a": torch.arange(4.0), "b": [torch.ones(2, dtype=torch.int16)]}))
    return _BASE[0]


@pytest.mark.torch
def test_numpy_view_of_manifest_reads_real_values(write: Any) -> None:
    import torch

    t = torch.linspace(0, 1, 10)
    path = write(legacy_bytes({"t": t}))
    entry = scan_path(path).tensors[0]
    raw = Path(path).read_bytes()[entry.data_offset:entry.data_offset + entry.nbytes]
    assert np.array_equal(np.frombuffer(raw, "<f4"), t.numpy())


def _one_storage_main(key: str = "7", numel: int = 2, st: str = "FloatStorage",
                      view: tuple[object, ...] | None = None) -> bytes:
    """A main pickle holding one bare typed storage pid (a 6-tuple, as legacy torch writes)."""
    view_ops: list[object] = ["NONE"] if view is None else [
        "MARK", ("BINUNICODE", str(view[0])), ("BININT1", view[1]), ("BININT1", view[2]), "TUPLE"]
    return asm(("PROTO", 2), "MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", st),
               ("BINUNICODE", key), ("BINUNICODE", "cpu"), ("BININT1", numel), *view_ops,  # type: ignore[arg-type]
               "TUPLE", "BINPERSID", "STOP")


@pytest.mark.torch
@pytest.mark.parametrize("case", [
    "protocol4_main", "blocked_sys_info", "keys_str", "keys_dict", "keys_int", "keys_unknown",
    "negative_count", "huge_count", "wrapping_count", "untyped", "view", "unsupported_in_keys",
    "ok_bare_storage"])
def test_handmade_streams_match_torch(case: str, write: Any) -> None:
    import pickle

    main = _one_storage_main()
    keys: Any = ["7"]
    blocks = [(2, b"\0" * 8)]
    kw: dict[str, Any] = {}
    if case == "protocol4_main":
        main = pickle.dumps({"a": 1}, protocol=4)
        keys, blocks = [], []
    elif case == "blocked_sys_info":
        kw["sys_info"] = asm(("PROTO", 2), ("GLOBAL", "posix", "getcwd"), "STOP")
    elif case == "negative_count":
        blocks = [(-1, b"")]
    elif case == "huge_count":
        blocks = [(1 << 40, b"")]
    elif case == "wrapping_count":     # (2**62 + 2) * 4 == 8 mod 2**64: torch accepts it
        blocks = [((1 << 62) + 2, b"\0" * 8)]
    elif case == "untyped":
        main = _one_storage_main(st="UntypedStorage")
    elif case == "view":
        main = _one_storage_main(numel=4, view=("8", 1, 2))
        blocks = [(4, b"\0" * 16)]
    data = stream(main, keys, blocks, **kw)
    if case.startswith("keys_") or case == "unsupported_in_keys":
        prefix = stream(main, [], [], **kw)[: -len(pickle.dumps([], protocol=2))]
        keys_pkl = {"keys_str": pickle.dumps("7", protocol=2),
                    "keys_dict": pickle.dumps({"7": 1}, protocol=2),
                    "keys_int": pickle.dumps(7, protocol=2),
                    "keys_unknown": pickle.dumps(["7", "9"], protocol=2),
                    "unsupported_in_keys": pickle.dumps(["7"], protocol=4)}[case]
        data = prefix + keys_pkl + struct.pack("<q", 2) + b"\0" * 8
    path = write(data)
    report = scan_path(path)
    assert_same_outcome(report, path)
    if case == "ok_bare_storage":
        assert report.verdict == "safe" and report.storages[0].data_offset == len(data) - 8
    if case == "wrapping_count":
        assert report.weights_only.loadable and report.verdict == "suspicious"
        assert Code.TORCH_RECORD_SIZE_MISMATCH in codes(report)


@pytest.mark.torch
def test_zip_magic_where_tar_attempt_stops(write: Any) -> None:
    """torch checks for `PK\\x03\\x04` at offset 512 after the failed tar attempt."""
    import pickle

    from tests.core.legacy.conftest import torch_outcome

    def build(n: int) -> bytes:
        text = "A" * n + "PK\x03\x04" + "B" * 10
        return stream(pickle.dumps({}, protocol=2), [], [],
                      sys_info=asm(("PROTO", 2), ("BINUNICODE", text), "STOP"))

    data = build(400 + 512 - build(400).index(b"PK\x03\x04"))
    assert data.index(b"PK\x03\x04") == 512
    path = write(data)
    report = scan_path(path)
    ok, etype, message = torch_outcome(path)
    assert not ok and not report.weights_only.loadable
    assert report.weights_only.error_type == etype == "RuntimeError"
    assert message.endswith(report.weights_only.error or "-")
    moved = write(build(401))        # one byte later: torch loads it
    assert torch_outcome(moved)[0] and scan_path(moved).weights_only.loadable


def test_pickle_hidden_after_last_block(write: Any) -> None:
    evil = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "true"), "TUPLE1", "REDUCE",
               "STOP")
    main = _one_storage_main()
    path = write(stream(main, ["7"], [(2, b"\0" * 8)], tail=evil))
    report = scan_path(path)
    found = {f.code for f in report.findings}
    assert {Code.PICKLE_TRAILING_DATA, Code.PICKLE_SECOND_PICKLE, Code.PICKLE_DANGEROUS_CALL} <= found
    assert report.verdict == "unsafe" and report.weights_only.loadable   # torch ignores the tail
    assert_same_outcome(report, path)
