"""The store: Alembic owns the schema, reports survive a restart, SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from ckptguard.app.store import MIGRATIONS, Store, decode_cursor, encode_cursor, policy_key
from ckptguard.app.tables import metadata, ours
from tests.e2e.service_server import private_postgres


def report(sha: str, verdict: str = "safe", version: str = "0.1.0") -> dict:
    return {"schema_version": 1, "scanner": {"name": "ckptguard", "version": version,
                                             "policy": "p"},
            "source": {"kind": "upload", "name": "m.pt", "size": 3, "sha256": sha},
            "format": "pickle", "verdict": verdict, "findings": [], "tensors": [{"name": "é"}]}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nested' / 'dir' / 'c.db'}"
        return
    with private_postgres() as private:   # a private schema: runs never see each other's rows
        yield private


def test_migrations_match_the_tables(url: str) -> None:
    store = Store.open(url)
    try:
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"include_name": ours}), metadata)
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        assert diff == []
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        assert version == ScriptDirectory.from_config(cfg).get_current_head()
    finally:
        store.close()


def test_reports_survive_reopen_and_cache_key(url: str) -> None:
    sha = "ab" * 32
    store = Store.open(url)
    saved = store.save(report(sha, "unsafe"), policy="p", cacheable=True)
    store.save(report(sha, "invalid"), policy="p", cacheable=False)   # worker failure: not cached
    store.close()
    store = Store.open(url)                                           # migrate again: idempotent
    try:
        got = store.get(saved.id)
        assert got is not None and got.record.created_at.tzinfo is not None
        assert {**got.report_head(), "tensors": list(store.part_rows(
            got.record.analysis_id, "tensors", got.tensor_count))} == {
            **report(sha, "unsafe"), "tensors": ['{"name":"é"}']}
        hit = store.find_cached(sha, "0.1.0", "p")
        assert hit is not None and hit.record_id == saved.id and hit.verdict == "unsafe"
        assert store.find_cached(sha, "0.2.0", "p") is None
        assert store.find_cached(sha, "0.1.0", "other") is None
        assert store.find_cached("cd" * 32, "0.1.0", "p") is None
        assert [s["verdict"] for s in store.list(sha256=sha).items] == ["invalid", "unsafe"]
    finally:
        store.close()


def test_a_report_saved_again_under_its_job_id_is_kept_once(url: str) -> None:
    """A job's rerun (its process died after saving) finds the record its id names."""
    store = Store.open(url)
    try:
        key = uuid.uuid4().hex
        first = store.save(report("ef" * 32, "unsafe"), policy="p", cacheable=False, record_id=key)
        again = store.save(report("ef" * 32, "safe"), policy="p", cacheable=False, record_id=key)
        assert first.id == again.id == key and again.verdict == "unsafe"   # the first stands
        assert [s["id"] for s in store.list(sha256="ef" * 32).items] == [key]
        other = store.save(report("ef" * 32), policy="p", cacheable=False)   # no job id: its own
        assert other.id != key and len(store.list(sha256="ef" * 32).items) == 2
    finally:
        store.close()


def test_pagination_is_stable(url: str) -> None:
    store = Store.open(url)
    try:
        ids = [store.save(report(f"{i:064x}"), policy="p", cacheable=True).id for i in range(7)]
        seen, cursor = [], None
        while True:
            page = store.list(limit=3, cursor=cursor)
            seen += [s["id"] for s in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == ids[::-1]
    finally:
        store.close()


def test_cursor_roundtrip_and_rejects() -> None:
    assert decode_cursor(encode_cursor(12345)) == 12345
    for bad in ("", "!!", "eHl6", encode_cursor(1) + "A" * 40):
        with pytest.raises(ValueError):
            decode_cursor(bad)


def test_policy_key_includes_allowlist() -> None:
    assert policy_key("pol", frozenset()) == "pol"
    assert policy_key("pol", frozenset({"b.B", "a.A"})) == "pol+allow:a.A,b.B"


def test_names_a_database_cannot_hold_as_text_are_stored_and_given_back(url: str) -> None:
    """A pickle's names may hold a NUL (PostgreSQL text refuses it) or a lone surrogate (UTF-8
    cannot encode it): the report keeps them, the key columns their JSON escapes."""
    names = ["a\0b", "w\udcff", "plain", "é\0"]
    doc = {**report("cd" * 32, "safe"), "tensors": [{"name": n, "dtype": "float32", "nbytes": 4}
                                                   for n in names]}
    store = Store.open(url)
    try:
        saved = store.save(doc, policy="p", cacheable=True)
        stored = store.get(saved.id)
        assert stored is not None
        page = store.tensors(stored, limit=10)
        assert [t["name"] for t in page.items] == names and page.total == 4
        for query, want in (("\0", ["a\0b", "é\0"]), ("a\0", ["a\0b"])):   # (PostgreSQL: no 500)
            assert [t["name"] for t in store.tensors(stored, limit=10, name=query).items] == want
    finally:
        store.close()
