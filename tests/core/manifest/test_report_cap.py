"""The report's total size cap (issue 14): past `report_budget` the lists are cut, the rest
counted in one LIMIT_REPORT finding, and the verdict is never better than suspicious.

Bound checked on every generated hostile family: report JSON bytes <= 8 x pickle bytes +
2 KiB per tensor the pickle declares + 256 per zip entry, or Limits.report_floor_bytes if that
is more: issue 14's target, but for the entries' share."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code
from ckptguard.core.filemap import Region
from ckptguard.core.limits import Limits
from ckptguard.core.report import StorageEntry, TensorEntry, bound_names, json_len
from ckptguard.core.reportsize import (
    regions_bound,
    report_budget,
    storages_bound,
    tensors_bound,
)
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from tests.builders.hostile_names import (
    memoized_key_checkpoint,
    memoized_module_globals,
    memoized_shape_views,
    memoized_storage_views,
)
from tests.builders.torchlayout import state_dict, torch_layout, v2

_LIMITS = Limits()


def _scan(data: bytes, limits: Limits = _LIMITS) -> tuple[int, dict[str, Any]]:
    report = scan_bytes(data, options=ScanOptions(limits=limits)).to_json()
    return len(json.dumps(report).encode()), report


def _check_capped(data: bytes, pickle_bytes: int, tensors: int) -> dict[str, Any]:
    size, report = _scan(data)
    io = report["io"]
    assert io["pickle_bytes"] == pickle_bytes
    assert size <= report_budget(_LIMITS, pickle_bytes, tensors, io.get("zip_entries", 0))
    # issue 14's target (and 256 bytes per zip entry), or the floor
    assert size <= max(_LIMITS.report_floor_bytes,
                       8 * pickle_bytes + 2048 * tensors + 256 * io.get("zip_entries", 0))
    cut = [f for f in report["findings"] if f["code"] == Code.LIMIT_REPORT]
    if cut:
        assert report["verdict"] != "safe"
        listed = {"tensors": len(report["tensors"]), "globals": len(report["globals"]),
                  "findings": len(report["findings"]) - 1, "storages": len(report["storages"]),
                  "regions": len(report["regions"])}
        # the map's regions come last: a report may lose only some of them
        counts = re.findall(r"([\d,]+) of ([\d,]+) (tensors|globals|findings|storages|regions)",
                            cut[0]["message"])
        assert counts
        for missing, total, label in counts:   # listed + not listed = all
            assert listed[label] + int(missing.replace(",", "")) == int(total.replace(",", ""))
            assert label != "tensors" or int(total.replace(",", "")) == tensors
    else:
        assert len(report["tensors"]) == tensors
    return report


_FAMILY = st.one_of(
    st.tuples(st.just("keys"), st.integers(1, 64), st.integers(1, 60), st.integers(1, 3000)),
    st.tuples(st.just("shape"), st.integers(1, 400), st.integers(1, 3000), st.just(0)),
    st.tuples(st.just("storage"), st.integers(1, 400), st.integers(1, 20_000), st.just(0)),
    st.tuples(st.just("globals"), st.integers(1, 2000), st.integers(1, 20_000), st.just(0)),
)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_FAMILY)
def test_hostile_reports_stay_under_the_budget(case: tuple[str, int, int, int]) -> None:
    kind, a, b, c = case
    if kind == "keys":
        data, pkl = memoized_key_checkpoint(a, b, "k" * c)
        tensors = b
    elif kind == "shape":
        data, pkl, tensors = memoized_shape_views(a, b)
    elif kind == "storage":
        data, pkl, tensors = memoized_storage_views(a, "s" * b)
    else:
        data, pkl, tensors = memoized_module_globals(a, "m" * b)
    _check_capped(data, pkl, tensors)


def test_views_of_a_long_shape_are_cut_and_counted() -> None:
    """1,000 views sharing one memoized 1,000-dim shape: 6 MB of rows from a 146 KB pickle."""
    data, pkl, tensors = memoized_shape_views(1_000, 1_000)
    report = _check_capped(data, pkl, tensors)
    assert report["verdict"] == "suspicious"
    assert [f["code"] for f in report["findings"]] == [Code.LIMIT_REPORT]
    assert 0 < len(report["tensors"]) < tensors
    assert [t["name"] for t in report["tensors"]] == [f"t{i}" for i in range(len(report["tensors"]))]


def test_globals_of_a_long_module_are_cut_and_counted() -> None:
    """3,000 distinct globals of one memoized 10,000-char module: was a 30 MB report."""
    data, pkl, _ = memoized_module_globals(3_000, "m" * 10_000)
    report = _check_capped(data, pkl, 0)
    assert report["verdict"] == "suspicious"
    assert 0 < len(report["globals"]) < 3_000
    assert report["weights_only"]["safe_globals_hint"] is None or \
        len(report["weights_only"]["unsafe_globals"]) == 3_000


def test_a_small_cap_cuts_a_benign_checkpoint_to_a_prefix() -> None:
    """A benign 3,000-tensor file under a 600 KB cap: the first rows, the same as uncapped
    (whole chunks taken by their bound, the last one row by row)."""
    pkl = state_dict(*((f"layer.{i}.weight", v2(str(i))) for i in range(3_000)))
    data = torch_layout("archive", pkl, [(str(i), b"\0" * 8) for i in range(3_000)])
    full_size, full = _scan(data)
    assert full["verdict"] == "safe" and len(full["tensors"]) == 3_000
    assert full_size > 1_000_000
    tight = Limits(max_report_bytes=600_000)
    size, cut = _scan(data, tight)
    assert size <= 600_000
    assert cut["verdict"] == "suspicious"
    assert [f["code"] for f in cut["findings"]] == [Code.LIMIT_REPORT]
    kept = len(cut["tensors"])
    assert 1024 < kept < 3_000 and cut["tensors"] == full["tensors"][:kept]
    assert cut["storages"] == full["storages"][:len(cut["storages"])]
    assert f"{3_000 - kept:,} of 3,000 tensors" in cut["findings"][0]["message"]


def test_a_cap_never_makes_an_unsafe_report_better() -> None:
    data = b"cos\nsystem\n(S'echo pwned'\ntR."
    _, report = _scan(data, Limits(max_report_bytes=100))
    assert report["verdict"] == "unsafe"
    assert report["findings"][-1]["code"] == Code.LIMIT_REPORT


_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from(['"', "\\", "\x01", "\ud800"]),
                max_size=80)
_INT = st.integers(-(1 << 70), 1 << 70)
_ROW = st.builds(
    TensorEntry, name=_TEXT, path=st.lists(_TEXT | _INT, max_size=6), dtype=_TEXT,
    shape=st.lists(_INT, max_size=6), stride=st.lists(_INT, max_size=6), storage_offset=_INT,
    storage=st.none() | _TEXT, kind=_TEXT, requires_grad=st.booleans(),
    data_offset=st.none() | _INT, nbytes=_INT, record=st.none() | _TEXT,
    flags=st.lists(st.sampled_from(["conj", "neg"]), max_size=2))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_ROW, max_size=20))
def test_the_column_bound_is_an_upper_bound(rows: list[TensorEntry]) -> None:
    """The cheap bound never under-counts, or a report could pass its cap unchecked."""
    rows = [r._replace(name=".".join(map(str, r.path))) for r in rows]   # names join paths
    bound_names(rows, 100)   # long names (and paths) shortened as a scan does
    exact = len(json.dumps([r.to_json() for r in rows]))
    assert tensors_bound(rows, 100) + 2 >= exact


_STORAGE = st.builds(
    StorageEntry, key=_TEXT, dtype=_TEXT, numel=_INT, nbytes=_INT, location=_TEXT,
    record=st.none() | _TEXT, data_offset=st.none() | _INT, offset_verified=st.booleans())


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_STORAGE, max_size=20))
def test_the_storage_bound_is_an_upper_bound(rows: list[StorageEntry]) -> None:
    exact = len(json.dumps([r.to_json() for r in rows]))
    assert storages_bound(rows) + 2 >= exact


@settings(max_examples=300, deadline=None)
@given(text=_TEXT | st.text(st.characters(min_codepoint=0, max_codepoint=0x80)))
def test_text_is_counted_as_json_writes_it(text: str) -> None:
    """The count without encoding (printable ASCII) equals what the encoder writes."""
    assert json_len(text) == len(json.dumps(text)) - 2


_REGION = st.builds(Region, kind=_TEXT, name=_TEXT, offset=st.integers(0, 1 << 70),
                    length=st.integers(0, 1 << 70))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_REGION, max_size=20))
def test_the_map_bound_is_an_upper_bound(rows: list[Region]) -> None:
    exact = len(json.dumps([r.to_json() for r in rows]))
    assert regions_bound(rows) + 2 >= exact


def test_the_map_is_cut_last_and_its_omitted_rows_counted() -> None:
    """A map of many records fills a small cap after the manifest: its cut rows are counted
    in regions_omitted, the manifest stays whole when it fits."""
    pkl = state_dict(*((f"w{i}", v2(str(i))) for i in range(300)))
    data = torch_layout("archive", pkl, [(str(i), b"\0" * 8) for i in range(300)])
    full_size, full = _scan(data)
    assert full["regions_omitted"] == 0 and len(full["regions"]) > 600
    regions_size = len(json.dumps(full["regions"]))
    size, cut = _scan(data, Limits(max_report_bytes=full_size - regions_size // 2))
    assert size <= full_size - regions_size // 2
    assert cut["tensors"] == full["tensors"] and cut["storages"] == full["storages"]
    kept = len(cut["regions"])
    assert 0 < kept < len(full["regions"]) and cut["regions"] == full["regions"][:kept]
    assert cut["regions_omitted"] == len(full["regions"]) - kept
    assert cut["findings"][-1]["code"] == Code.LIMIT_REPORT and "regions" in cut["findings"][-1]["message"]
