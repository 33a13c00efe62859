"""The map of a file (core/filemap.py): `Report.regions` and `findings[].length`.

Every engine draws the same map (tests/agreement compares whole reports; here with a
small `max_map_regions` too, so the merged runs agree), the regions of a clean archive tile
the file exactly, and every anomalous range is one region whose finding carries its length.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core import filemap, records
from ckptguard.core.filemap import ZipSpans
from ckptguard.core.io.source import BytesSource
from ckptguard.core.limits import Limits
from ckptguard.core.report import Report
from ckptguard.core.scan import scan_source
from ckptguard.core.state import ScanOptions
from tests.agreement import assert_agree
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import state_dict, torch_layout, v2


def _archive(n: int, *, extra_records: tuple[tuple[str, bytes], ...] = ()) -> bytes:
    items = [(f"layer{i}.weight", v2(str(i))) for i in range(n)]
    storages = [(str(i), struct.pack("<2f", i, -i)) for i in range(n)]
    return torch_layout("archive", state_dict(*items), storages,
                        meta=(("version", b"3\n"), (".format_version", b"1"),
                              (".storage_alignment", b"64"), ("byteorder", b"little"),
                              *extra_records))


def _scan(data: bytes, **options: Any) -> Report:
    return scan_source(BytesSource(data, name="case"), options=ScanOptions(**options))


def _assert_tiles(regions: list[dict[str, Any]], size: int) -> None:
    """Sorted, non-overlapping, gap-free, from byte 0 to the last."""
    pos = 0
    for r in regions:
        assert r["offset"] == pos, (r, pos)
        assert r["length"] > 0
        pos += r["length"]
    assert pos == size


def test_clean_archive_regions_tile_the_file_in_every_engine() -> None:
    data = _archive(5)
    report = assert_agree(data, label="clean")
    regions = report["regions"]
    _assert_tiles(regions, len(data))
    kinds = [r["kind"] for r in regions]
    assert kinds.count("tensor_data") == 5 and kinds.count("pickle") == 1
    assert kinds[-2:] == ["central_directory", "end_records"]
    assert report["regions_omitted"] == 0
    # every tensor's bytes lie in the tensor_data region of its record
    by_name = {r["name"]: r for r in regions if r["kind"] == "tensor_data"}
    for t in report["tensors"]:
        r = by_name[f"archive/data/{t['storage']}"]
        assert r["offset"] <= t["data_offset"] and t["data_offset"] + t["nbytes"] <= r["offset"] + r["length"]


@pytest.mark.parametrize("cap", [4, 13, 40])
def test_past_the_cap_records_merge_into_runs_and_engines_agree(cap: int) -> None:
    data = _archive(30)
    report = assert_agree(data, label=f"cap {cap}", limits=Limits(max_map_regions=cap))
    regions = report["regions"]
    assert len(regions) <= cap
    _assert_tiles(regions, len(data))   # merged runs still cover every record
    merged = [r for r in regions if r["kind"] == "records"]
    assert merged and sum(int(r["name"].split()[0]) for r in merged) > 0


def test_appended_bytes_are_a_region_and_the_finding_has_its_length() -> None:
    clean = _archive(2)
    data = clean + b"<script>window.__pwned=1</script>" * 3
    report = _scan(data).to_json()
    appended = [r for r in report["regions"] if r["kind"] == "appended"]
    assert appended == [{"kind": "appended", "name": "bytes after the end of the archive",
                         "offset": len(clean), "length": len(data) - len(clean)}]
    finding = next(f for f in report["findings"] if f["code"] == "ZIP_APPENDED_DATA")
    assert (finding["offset"], finding["length"]) == (len(clean), len(data) - len(clean))
    _assert_tiles(report["regions"], len(data))


def test_prepended_bytes() -> None:
    junk = b"MZ" + b"\x00" * 98
    buf = io.BytesIO(junk)
    with zipfile.ZipFile(buf, "a") as zf:   # appending to a non-zip: absolute offsets past it
        zf.writestr("archive/data.pkl", asm(("PROTO", 2), "EMPTY_DICT", "STOP"))
        zf.writestr("archive/version", b"3\n")
    data = buf.getvalue()
    report = _scan(data).to_json()
    pre = [r for r in report["regions"] if r["kind"] == "prepended"]
    assert [(r["offset"], r["length"]) for r in pre] == [(0, len(junk))]
    finding = next(f for f in report["findings"]
                   if f["code"] == "ZIP_PREPENDED_DATA" and f["offset"] == 0)
    assert finding["length"] == len(junk)


def test_unreferenced_record_is_its_own_kind_with_the_findings_length() -> None:
    payload = b"hidden payload " * 10
    data = _archive(1, extra_records=(("data/99", payload),))
    report = _scan(data).to_json()
    hidden = [r for r in report["regions"] if r["kind"] == "unreferenced_record"]
    assert [r["name"] for r in hidden] == ["archive/data/99"] and hidden[0]["length"] == len(payload)
    assert data[hidden[0]["offset"]:hidden[0]["offset"] + len(payload)] == payload
    header = next(r for r in report["regions"]
                  if r["kind"] == "local_header" and r["name"] == "archive/data/99")
    finding = next(f for f in report["findings"] if f["code"] == "TORCH_UNREFERENCED_RECORD")
    assert finding["offset"] == header["offset"]
    assert finding["length"] == hidden[0]["offset"] + hidden[0]["length"] - header["offset"]


def test_gap_between_records_is_unreferenced_data() -> None:
    clean = _archive(1)
    report = _scan(clean).to_json()
    cd = next(r for r in report["regions"] if r["kind"] == "central_directory")
    gap = b"\xAA" * 77
    # insert bytes before the directory and move its offset in the zip64 end record
    data = bytearray(clean[:cd["offset"]] + gap + clean[cd["offset"]:])
    z64 = data.rfind(b"PK\x06\x06")
    struct.pack_into("<Q", data, z64 + 48, cd["offset"] + len(gap))
    loc = data.rfind(b"PK\x06\x07")
    struct.pack_into("<Q", data, loc + 8, z64)
    report = _scan(bytes(data)).to_json()
    gaps = [r for r in report["regions"] if r["kind"] == "unreferenced_data"]
    assert [(r["offset"], r["length"]) for r in gaps] == [(cd["offset"], len(gap))]
    finding = next(f for f in report["findings"] if f["code"] == "ZIP_UNREFERENCED_DATA")
    assert finding["length"] == len(gap)


def test_descriptors_without_their_signature_end_where_the_next_record_begins() -> None:
    """12-byte data descriptors (no PK\\x07\\x08, which core.zip.checks tolerates): each
    descriptor region ends at the next local header, so the map still tiles the file."""
    items = [(f"w{i}", v2(str(i))) for i in range(3)]
    data = torch_layout("archive", state_dict(*items),
                        [(str(i), struct.pack("<2f", i, -i)) for i in range(3)],
                        descriptor_signature=False)
    report = assert_agree(data, label="descriptors without signature")
    assert not [f for f in report["findings"] if f["code"].startswith("ZIP_")]
    _assert_tiles(report["regions"], len(data))
    descriptors = [r for r in report["regions"] if r["kind"] == "data_descriptor"]
    assert descriptors and {r["length"] for r in descriptors} == {12}


def test_pickle_file_with_trailing_bytes() -> None:
    body = asm(("PROTO", 2), ("BININT", 7), "STOP")
    data = body + b"trailing!"
    report = _scan(data).to_json()
    assert report["regions"] == [
        {"kind": "pickle", "name": "pickle", "offset": 0, "length": len(body)},
        {"kind": "trailing_data", "name": "bytes after the end", "offset": len(body),
         "length": len(data) - len(body)}]
    finding = next(f for f in report["findings"] if f["code"] == "PICKLE_TRAILING_DATA")
    assert finding["length"] == len(data) - len(body)


def test_npy_and_safetensors_header_and_data() -> None:
    np = pytest.importorskip("numpy")
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float32))
    npy = buf.getvalue()
    regions = _scan(npy).to_json()["regions"]
    assert [r["kind"] for r in regions] == ["header", "tensor_data"]
    _assert_tiles(regions, len(npy))

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    st = struct.pack("<Q", len(header)) + header + b"\x00" * 8
    regions = _scan(st).to_json()["regions"]
    assert [r["kind"] for r in regions] == ["header", "tensor_data"]
    _assert_tiles(regions, len(st))


def test_findings_without_bytes_have_no_length() -> None:
    report = _scan(asm(("GLOBAL", "os", "system"), ("BINUNICODE", "id"), "TUPLE1", "REDUCE",
                       "STOP")).to_json()
    assert report["verdict"] == "unsafe"
    assert all(f["length"] is None for f in report["findings"])
    assert records.fields(Report)   # the report class keeps its record form


@st.composite
def _spans(draw: st.DrawFn) -> ZipSpans:
    """An archive's spans: mostly records that touch end to end (torch's layout, where
    `_zip_regions` takes its shortcut), sometimes with a gap, an overlap or a payload past
    its record's end."""
    n = draw(st.integers(1, 12))
    pos = draw(st.integers(0, 3))
    names, header, data, size, end = [], [], [], [], []
    for i in range(n):
        pos += draw(st.sampled_from([0, 0, 0, 0, 1, -2]))   # a gap or an overlap, sometimes
        pos = max(pos, 0)
        local = draw(st.integers(0, 40))
        payload = draw(st.integers(0, 50))
        descriptor = draw(st.sampled_from([0, 16]))
        names.append(f"a/{i}")
        header.append(pos)
        data.append(pos + local)
        size.append(payload + draw(st.sampled_from([0, 0, 0, 5])))   # past its end, sometimes
        end.append(pos + local + payload + descriptor)
        pos = end[-1]
    cd = max(pos, max(map(sum, zip(data, size, strict=True)))) + draw(st.integers(0, 3))
    return ZipSpans(names=names, header=header, data=data, size=size, end=end, cd_offset=cd,
                    cd_end=cd + 10, tail_start=cd + 10, archive_end=cd + 32, file_size=cd + 40,
                    prefix="a")


@settings(max_examples=300, deadline=None)
@given(spans=_spans(), room=st.integers(0, 40))
def test_the_shortcut_for_touching_records_draws_what_the_walk_draws(
        spans: ZipSpans, room: int) -> None:
    """`_tiled` is a shortcut, never a rule: the map is the same with it switched off."""
    fast = filemap._zip_regions(spans, {"a/0"}, set(), room)
    with mock.patch.object(filemap, "_tiled", return_value=False):
        walked = filemap._zip_regions(spans, {"a/0"}, set(), room)
    assert fast == walked
