"""The compact layout (app/compact.py, app/store.py): a stored report streams back as the very
bytes JSONResponse made of it; the tensor pages agree with the report itself whatever the
filter and sort; a cache hit stores a record, never a copy; DELETE and retention drop an
analysis with its last record; migration 0003 moves old rows into the layout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from ckptguard.app import compact
from ckptguard.app import store as store_module
from ckptguard.app.store import MIGRATIONS, Store, Stored
from ckptguard.app.tables import analyses, manifest_chunks, scans, tensor_keys
from tests.service.test_store import url  # noqa: F401  (the sqlite/postgresql fixture)

DTYPES = ("float32", "float16", "int64", "bfloat16")
NAME_PARTS = ("layer", "Attn", "mlp", "50%", "a_b", "ÉTÉ", "x")


def synthetic_report(n: int, sha: str = "ab" * 32) -> dict[str, Any]:
    """A report whose manifest has ties, rows without a data offset, LIKE metacharacters."""
    tensors = [{"name": f"{NAME_PARTS[i % 7]}.{i % 13}.{NAME_PARTS[(i * 3) % 7]}", "path": ["p", i],
                "dtype": DTYPES[(i * 5) % 4], "shape": [i % 9], "stride": [1], "storage_offset": i,
                "storage": str(i % 3), "kind": "tensor", "requires_grad": i % 2 == 0,
                "data_offset": None if i % 11 == 0 else (i * 7919) % 5000, "nbytes": (i * 31) % 97,
                "record": "archive/data.pkl", "flags": []} for i in range(n)]
    storages = [{"key": str(k), "dtype": "float32", "numel": 9, "nbytes": 36, "location": "cpu",
                 "record": f"archive/data/{k}", "data_offset": 64 * k, "offset_verified": True}
                for k in range(3)]
    findings = [{"code": c, "severity": s, "message": f"{c} here", "record": None, "offset": None}
                for c, s in (("A_LOW", "low"), ("B_CRIT", "critical"), ("C_INFO", "info"),
                             ("D_MED", "medium"), ("E_CRIT", "critical"), ("F_HIGH", "high"),
                             ("G_LOW", "low"))]
    return {"schema_version": 1, "scanner": {"name": "ckptguard", "version": "9", "policy": "p"},
            "source": {"kind": "upload", "name": "m.pt", "url": None, "size": 3, "sha256": sha},
            "format": "torch-zip", "verdict": "suspicious", "weights_only": {"loadable": True},
            "globals": [{"module": "torch", "name": "x"}], "findings": findings, "tensors": tensors,
            "storages": storages, "io": {"bytes_read": 1}, "timings_ms": {"total": 1.5},
            "extra": {"note": "é \u2028 \\"}}


def streamed(store: Store, stored: Stored, *, manifest: bool = True) -> bytes:
    from ckptguard.app.responses import _stored_pieces

    return b"".join(_stored_pieces(store, stored, manifest=manifest))


def expected_body(record: Any, report: dict[str, Any]) -> bytes:
    return bytes(JSONResponse({**record.fields(), **report}).body)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Stored, dict[str, Any]]]:
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('compact') / 'c.db'}")
    report = synthetic_report(3 * compact.ROWS_PER_CHUNK + 17)
    record = store.save(report, policy="p", cacheable=True)
    stored = store.get(record.id)
    assert stored is not None
    yield store, stored, report
    store.close()


def test_a_stored_report_streams_back_byte_for_byte(big) -> None:
    store, stored, report = big
    assert streamed(store, stored) == expected_body(stored.record, report)
    assert len(list(compact.stream({}, report, lambda p: compact.rows_in_pieces(report[p])))) > 1 \
        or len(expected_body(stored.record, report)) < compact.STREAM_PIECE_CHARS
    without = json.loads(streamed(store, stored, manifest=False))
    assert "tensors" not in without and "storages" not in without
    assert without["tensor_count"] == len(report["tensors"]) and without["storage_count"] == 3
    assert without["links"] == {"report": f"/scans/{stored.record.id}",
                                "tensors": f"/scans/{stored.record.id}/tensors"}
    assert {k: v for k, v in without.items() if k not in ("tensor_count", "storage_count", "links")} \
        == {k: v for k, v in json.loads(expected_body(stored.record, report)).items()
            if k not in compact.MANIFEST}


def test_the_list_summary(big) -> None:
    store, stored, report = big
    [item] = store.list().items
    assert item["id"] == stored.record.id and "tensors" not in item
    assert item["counts"] == {"findings": {"low": 2, "critical": 2, "info": 1, "medium": 1, "high": 1},
                              "tensors": len(report["tensors"]), "storages": 3, "globals": 1}
    assert [f["code"] for f in item["findings"]] == ["B_CRIT", "E_CRIT", "F_HIGH", "D_MED", "A_LOW"]
    assert set(item) == {"id", "created_at", "cached", "source", "format", "verdict", "scanner",
                         "counts", "findings"}


def _sort_key(sort: str, row: dict[str, Any], index: int) -> tuple[int, int]:
    field = sort.lstrip("-")
    if field == "index":
        return (index, index)
    value = row[field]
    return (compact.NO_OFFSET if value is None else value, index)


def expected_pages(report: dict[str, Any], *, name: str | None, dtype: str | None,
                   sort: str) -> list[dict[str, Any]]:
    rows = [{"index": i, **r} for i, r in enumerate(report["tensors"])
            if (dtype is None or r["dtype"] == dtype)
            and (not name or name.lower() in r["name"].lower())]
    return sorted(rows, key=lambda r: _sort_key(sort, r, r["index"]), reverse=sort.startswith("-"))


@pytest.mark.parametrize("few", [0, 10**9], ids=["index-walk", "sorted-here"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.none(), st.text("layerATNx.5%_b0123", max_size=4)),
       dtype=st.one_of(st.none(), st.sampled_from((*DTYPES, "complex64"))),
       sort=st.sampled_from(sorted(store_module.TENSOR_SORTS)), limit=st.integers(1, 300))
def test_tensor_pages_agree_with_the_report(big, monkeypatch, few, name, dtype, sort, limit) -> None:
    monkeypatch.setattr(store_module, "FEW_MATCHES", few)
    store, stored, report = big
    got: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = store.tensors(stored, limit=limit, cursor=cursor, name=name, dtype=dtype, sort=sort)
        assert len(page.items) <= limit
        assert page.total == len(expected_pages(report, name=name, dtype=dtype, sort=sort))
        got += page.items
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert got == expected_pages(report, name=name, dtype=dtype, sort=sort)


def test_dtype_totals_and_bad_cursors(big) -> None:
    store, stored, report = big
    for entry in stored.dtypes:
        rows = [r for r in report["tensors"] if r["dtype"] == entry["dtype"]]
        assert entry["count"] == len(rows) and entry["nbytes"] == sum(r["nbytes"] for r in rows)
    assert sum(e["count"] for e in stored.dtypes) == len(report["tensors"])
    cursor = store.tensors(stored, limit=5, sort="nbytes").next_cursor
    assert cursor is not None
    for bad, sort in ((cursor, "-nbytes"), (cursor, "index"), ("!!", "nbytes"), ("eHl6", "index")):
        with pytest.raises(ValueError):
            store.tensors(stored, cursor=bad, sort=sort)


def test_key_columns_give_neutral_keys_to_odd_rows() -> None:
    """Rows of old or odd reports: not objects, fields missing or of another type (a bool is
    not a size); a Mapping that is not a dict is read like one."""
    from types import MappingProxyType

    rows = [{"name": "a", "dtype": "float32", "nbytes": 8, "data_offset": 64},
            "not a row", {"name": None, "dtype": 3, "nbytes": True, "data_offset": None},
            MappingProxyType({"name": 5, "dtype": "int8", "nbytes": 2, "data_offset": 0}), {}]
    keys = compact.key_columns(rows)
    assert keys.names == ["a", "", "", "5", ""]
    assert keys.dtypes == ["float32", "", "3", "int8", ""]
    assert keys.nbytes == [8, 0, 0, 2, 0]
    assert keys.data_offsets == [64, compact.NO_OFFSET, compact.NO_OFFSET, 0, compact.NO_OFFSET]
    assert compact.dtype_totals(keys) == [
        {"dtype": "float32", "count": 1, "nbytes": 8}, {"dtype": "int8", "count": 1, "nbytes": 2},
        {"dtype": "", "count": 2, "nbytes": 0}, {"dtype": "3", "count": 1, "nbytes": 0}]


def test_rows_encode_as_the_response_does() -> None:
    rows = [{"a": [1, 2.5, None, True], "é": "\u2028\n\"x"}, "s", 1e16, [], {}]
    assert compact.dumps_rows(rows) == [compact.dumps(row) for row in rows]
    with pytest.raises(ValueError):
        compact.dumps_rows([{"x": float("nan")}])


def _count(store: Store, table: sa.Table) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_a_cache_hit_stores_a_record_not_a_copy_and_deletes_cascade(url: str) -> None:  # noqa: F811
    store = Store.open(url)
    try:
        report = synthetic_report(600)
        first = store.save(report, policy="p", cacheable=True)
        sizes = {t.name: _count(store, t) for t in (analyses, manifest_chunks, tensor_keys)}
        hit = store.find_cached("ab" * 32, "9", "p")
        assert hit is not None and hit.analysis_id == first.analysis_id
        shared = store.share(hit, {**report["source"], "name": "mine.pt"})
        assert {t.name: _count(store, t) for t in (analyses, manifest_chunks, tensor_keys)} == sizes
        assert _count(store, scans) == 2 and shared.cached and shared.analysis_id == first.analysis_id
        got = store.get(shared.id)
        assert got is not None
        mine = {**report, "source": {**report["source"], "name": "mine.pt"}}
        assert streamed(store, got) == expected_body(shared, mine)
        assert store.delete(first.id) and store.get(first.id) is None
        assert _count(store, analyses) == 1 and store.get(shared.id) is not None  # still referenced
        assert not store.delete(first.id)
        assert store.delete(shared.id)
        assert [_count(store, t) for t in (scans, analyses, manifest_chunks, tensor_keys)] == [0] * 4
    finally:
        store.close()


def test_sharing_an_analysis_deleted_since_it_was_found_adds_nothing(url: str) -> None:  # noqa: F811
    store = Store.open(url)
    try:
        first = store.save(synthetic_report(5), policy="p", cacheable=True)
        hit = store.find_cached("ab" * 32, "9", "p")
        assert hit is not None and store.delete(first.id)
        assert store.share(hit, {"kind": "upload"}) is None     # the caller scans instead
        assert _count(store, scans) == 0
    finally:
        store.close()


def test_retention_sweep(url: str) -> None:  # noqa: F811
    store = Store.open(url)
    try:
        old = store.save(synthetic_report(10, "01" * 32), policy="p", cacheable=True)
        new = store.save(synthetic_report(10, "02" * 32), policy="p", cacheable=True)
        with store.engine.begin() as conn:
            conn.execute(scans.update().where(scans.c.id == old.id)
                         .values(created_at=datetime.now(UTC) - timedelta(days=3)))
        assert store.sweep(datetime.now(UTC) - timedelta(days=2)) == 1
        assert store.get(old.id) is None and store.get(new.id) is not None
        assert _count(store, analyses) == 1 and _count(store, tensor_keys) == 10
        assert store.find_cached("01" * 32, "9", "p") is None
    finally:
        store.close()


# --- migration 0003: a database at 0002 with reports in a JSON column upgrades in place ---
_OLD_SCANS = sa.table(
    "scans", sa.column("id", sa.String), sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("sha256", sa.String), sa.column("size", sa.BigInteger), sa.column("source_kind", sa.String),
    sa.column("source_name", sa.String), sa.column("format", sa.String), sa.column("verdict", sa.String),
    sa.column("scanner_version", sa.String), sa.column("policy", sa.String),
    sa.column("cacheable", sa.Boolean), sa.column("report", sa.JSON))


def _alembic(engine: sa.Engine, target: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)


def test_migration_0003_moves_old_reports_in_place(url: str) -> None:  # noqa: F811
    database = sa.make_url(url).database
    if sa.make_url(url).get_backend_name() == "sqlite" and database:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url)
    _alembic(engine, "0002_hub")
    old = [("a" * 32, synthetic_report(700, "0a" * 32), True),
           ("b" * 32, {**synthetic_report(3, "0b" * 32), "verdict": "invalid"}, False),
           ("c" * 32, {"schema_version": 1, "source": {"sha256": "0c" * 32}, "tensors": [{"name": "é"}],
                       "verdict": "safe", "format": "pickle"}, True)]   # a sparse old report
    created = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    with engine.begin() as conn:
        for scan_id, report, cacheable in old:
            conn.execute(_OLD_SCANS.insert().values(
                id=scan_id, created_at=created, sha256=report["source"]["sha256"], size=3,
                source_kind="upload", source_name="m.pt", format=report["format"],
                verdict=report["verdict"], scanner_version="9", policy="p", cacheable=cacheable,
                report=report))
    engine.dispose()
    store = Store.open(url)                       # upgrades to head, as the service does
    try:
        for scan_id, report, _cacheable in old:
            stored = store.get(scan_id)
            assert stored is not None and stored.record.created_at == created
            record = stored.record
            fields = {"id": scan_id, "created_at": created.isoformat(), "cached": False}
            assert record.fields() == fields
            assert streamed(store, stored) == bytes(JSONResponse({**fields, **report}).body)
        hit = store.find_cached("0a" * 32, "9", "p")
        assert hit is not None and hit.record_id == "a" * 32
        assert store.find_cached("0b" * 32, "9", "p") is None          # was not cacheable
        big = store.get("a" * 32)
        assert big is not None
        page = store.tensors(big, sort="-nbytes", dtype="int64", limit=1000)
        assert page.items == expected_pages(old[0][1], name=None, dtype="int64", sort="-nbytes")
        assert [i["id"] for i in store.list().items] == ["c" * 32, "b" * 32, "a" * 32]
    finally:
        store.close()
