"""The database schema (SQLAlchemy Core tables). Alembic revisions in app/migrations
create and alter it; `tests/service/test_store.py` checks the two agree.

New tables (e.g. the webhook job table) go here, with a new Alembic revision.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# An analysis is what a scan of some bytes found; a record (`scans`) is one caller's request
# for it. A cache hit adds a record that references the analysis: never a copy of the report.
analyses = sa.Table(
    "analyses",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("scanner_version", sa.String(64), nullable=False),
    sa.Column("policy", sa.String(256), nullable=False),
    # Reports of worker failures (TIMEOUT, RESOURCE_LIMIT, WORKER_CRASHED) are stored but
    # never served from the cache: a retry with more resources may succeed.
    sa.Column("cacheable", sa.Boolean, nullable=False),
    sa.Column("head", sa.LargeBinary, nullable=False),        # app/compact.py: report - manifest
    sa.Column("summary", sa.JSON, nullable=False),            # compact.summary_of
    sa.Column("dtypes", sa.JSON, nullable=False),             # compact.dtype_totals
    sa.Column("tensor_count", sa.Integer, nullable=False),
    sa.Column("storage_count", sa.Integer, nullable=False),
    sa.Column("stored_bytes", sa.BigInteger, nullable=False),  # head + chunks, compressed
    sa.Index("ix_analyses_cache", "sha256", "scanner_version", "policy"),
)

# The manifest parts (`tensors`, `storages`) in compressed chunks of compact.ROWS_PER_CHUNK rows.
manifest_chunks = sa.Table(
    "manifest_chunks",
    metadata,
    sa.Column("analysis_id", sa.Integer, sa.ForeignKey("analyses.id"), primary_key=True),
    sa.Column("part", sa.String(16), primary_key=True),
    sa.Column("chunk", sa.Integer, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

# What GET /scans/{id}/tensors filters and sorts on, one row per tensor (`idx` = its place in
# the manifest); the rows themselves come from the chunks. data_offset -1 = none. In SQLite a
# WITHOUT ROWID table: an analysis' rows lie together in index order, so a scan of one
# analysis (a name filter) reads them in sequence (500,000 rows: 2.7 s with a rowid, 0.1 s).
tensor_keys = sa.Table(
    "tensor_keys",
    metadata,
    sa.Column("analysis_id", sa.Integer, sa.ForeignKey("analyses.id"), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("dtype", sa.String(32), nullable=False),
    sa.Column("nbytes", sa.BigInteger, nullable=False),
    sa.Column("data_offset", sa.BigInteger, nullable=False),
    sa.Index("ix_tensor_keys_nbytes", "analysis_id", "nbytes", "idx"),
    sa.Index("ix_tensor_keys_data_offset", "analysis_id", "data_offset", "idx"),
    sa.Index("ix_tensor_keys_dtype", "analysis_id", "dtype", "idx"),
    # a dtype filter walks these in the sort's order (sort keys often follow the dtype: the
    # storages of one dtype lie together in the file)
    sa.Index("ix_tensor_keys_dtype_nbytes", "analysis_id", "dtype", "nbytes", "idx"),
    sa.Index("ix_tensor_keys_dtype_data_offset", "analysis_id", "dtype", "data_offset", "idx"),
    sqlite_with_rowid=False,
)

scans = sa.Table(
    "scans",
    metadata,
    # `seq` orders scans and backs the pagination cursor; `id` is the public name.
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("analysis_id", sa.Integer, sa.ForeignKey("analyses.id"), nullable=False),
    sa.Column("cached", sa.Boolean, nullable=False),       # the analysis was another request's
    sa.Column("source", sa.JSON, nullable=False),          # this request's report `source`
    # copies of the analysis' columns that a list filters on (no join to filter)
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("source_kind", sa.String(16), nullable=False),
    sa.Column("source_name", sa.String(512), nullable=True),
    sa.Column("format", sa.String(32), nullable=False),
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Index("ix_scans_sha256", "sha256"),
    sa.Index("ix_scans_verdict", "verdict"),
    sa.Index("ix_scans_analysis", "analysis_id"),
    sa.Index("ix_scans_created_at", "created_at"),
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
    # the id this file's report will be stored under, drawn when the row is made: a scan that
    # runs again after its process died between storing and recording keeps the first report
    sa.Column("report_key", sa.String(32), nullable=True),
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

# --- asynchronous URL scans (POST /scan/url?async=true; app/urlscans.py) -------------------
# The request (URL, headers until the scan ends) and its outcome; the report itself is a scan
# record like any other. `lease_until` (epoch seconds) lets the in-process queue take over a
# scan whose process died (SQLite); on PostgreSQL procrastinate's lock and recovery do that.
url_scans = sa.Table(
    "url_scans",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("headers", sa.Text, nullable=True),               # JSON; cleared when finished
    sa.Column("state", sa.String(16), nullable=False),          # queued|running|done|failed
    sa.Column("report_id", sa.String(32), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_url_scans_state", "state"),
)

# Jobs of a dead worker that the job tier's recovery task queued again (for /metrics).
job_recoveries = sa.Table(
    "job_recoveries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("queue", sa.String(64), nullable=False),
    sa.Column("task", sa.String(64), nullable=False),
    sa.Column("recovered_at", sa.DateTime(timezone=True), nullable=False),
)


def ours(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's `include_name`: procrastinate's tables (PostgreSQL, migration 0004) are its own
    schema, applied from its SQL file, not this metadata's."""
    return not (name or "").startswith("procrastinate_")
