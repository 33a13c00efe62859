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

# --- model-hub webhook jobs (app/hub/db.py) --------------------------------------------
# One job per (repo type, repo, revision); times that the runner compares in SQL
# (lease, next attempt) are epoch seconds, portable across SQLite and PostgreSQL.
hub_jobs = sa.Table(
    "hub_jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("repo_type", sa.String(16), nullable=False),
    sa.Column("repo", sa.String(256), nullable=False),
    sa.Column("revision", sa.String(64), nullable=False),
    sa.Column("ref", sa.String(256), nullable=True),
    sa.Column("state", sa.String(16), nullable=False),          # queued|running|done|failed
    sa.Column("listed", sa.Boolean, nullable=False),             # file rows exist
    sa.Column("verdict", sa.String(16), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),           # tree-listing attempts
    sa.Column("next_attempt_at", sa.Float, nullable=True),
    sa.Column("lease_owner", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("notify_state", sa.String(16), nullable=True),     # pending|sent|failed
    sa.Column("notify_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("repo_type", "repo", "revision", name="uq_hub_jobs_revision"),
    sa.Index("ix_hub_jobs_state", "state"),
)

hub_files = sa.Table(
    "hub_files",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(32), sa.ForeignKey("hub_jobs.id"), nullable=False),
    sa.Column("path", sa.String(1024), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("lfs_sha256", sa.String(64), nullable=True),
    sa.Column("state", sa.String(16), nullable=False),          # queued|running|done|failed|skipped
    sa.Column("container", sa.String(32), nullable=True),
    sa.Column("verdict", sa.String(16), nullable=True),
    sa.Column("report_id", sa.String(32), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.Float, nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("job_id", "path", name="uq_hub_files_path"),
    sa.Index("ix_hub_files_job", "job_id"),
)

# Webhook deliveries, deduplicated on (repo id, ref, newSha): a replay is recorded once.
hub_deliveries = sa.Table(
    "hub_deliveries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("repo_type", sa.String(16), nullable=False),
    sa.Column("repo", sa.String(256), nullable=False),
    sa.Column("ref", sa.String(256), nullable=False),
    sa.Column("new_sha", sa.String(64), nullable=False),
    sa.Column("job_id", sa.String(32), nullable=False),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("repo_type", "repo", "ref", "new_sha", name="uq_hub_deliveries"),
)
