"""The database schema (SQLAlchemy Core tables). Alembic revisions in app/migrations
create and alter it; `tests/service/test_store.py` checks the two agree.

New tables (e.g. the webhook job table) go here, with a new Alembic revision.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

scans = sa.Table(
    "scans",
    metadata,
    # `seq` orders scans and backs the pagination cursor; `id` is the public name.
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("source_kind", sa.String(16), nullable=False),
    sa.Column("source_name", sa.String(512), nullable=True),
    sa.Column("format", sa.String(32), nullable=False),
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("scanner_version", sa.String(64), nullable=False),
    sa.Column("policy", sa.String(256), nullable=False),
    # Reports of worker failures (TIMEOUT, RESOURCE_LIMIT, WORKER_CRASHED) are stored but
    # never served from the cache: a retry with more resources may succeed.
    sa.Column("cacheable", sa.Boolean, nullable=False),
    sa.Column("report", sa.JSON, nullable=False),
    sa.Index("ix_scans_cache", "sha256", "scanner_version", "policy"),
    sa.Index("ix_scans_verdict", "verdict"),
)
