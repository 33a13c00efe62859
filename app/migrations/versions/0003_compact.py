"""compact reports: analyses (head, manifest chunks, tensor keys); scans become records

Revision ID: 0003_compact
Revises: 0002_hub
Create Date: 2026-11-25

Each existing scan's report moves, one row at a time (bounded memory), into an analysis of
its own (app/compact.py's layout); the scan keeps its id and time, gains its source and a
reference to the analysis, and loses the `report` column and the cache-key columns (the
cache key is the analysis').
"""

from __future__ import annotations

import json
from datetime import UTC

import sqlalchemy as sa
from alembic import op

from ckptguard.app import compact

revision = "0003_compact"
down_revision = "0002_hub"
branch_labels = None
depends_on = None

# The tables as this revision leaves them (app/tables.py may move on; this must not).
_analyses = sa.table(
    "analyses", sa.column("id", sa.Integer), sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("sha256", sa.String), sa.column("scanner_version", sa.String),
    sa.column("policy", sa.String), sa.column("cacheable", sa.Boolean),
    sa.column("head", sa.LargeBinary), sa.column("summary", sa.JSON), sa.column("dtypes", sa.JSON),
    sa.column("tensor_count", sa.Integer), sa.column("storage_count", sa.Integer),
    sa.column("stored_bytes", sa.BigInteger))
_chunks = sa.table("manifest_chunks", sa.column("analysis_id", sa.Integer),
                   sa.column("part", sa.String), sa.column("chunk", sa.Integer),
                   sa.column("data", sa.LargeBinary))
_keys = sa.table("tensor_keys", sa.column("analysis_id", sa.Integer), sa.column("idx", sa.Integer),
                 sa.column("name", sa.Text), sa.column("dtype", sa.String),
                 sa.column("nbytes", sa.BigInteger), sa.column("data_offset", sa.BigInteger))
_scans = sa.table("scans", sa.column("seq", sa.Integer), sa.column("created_at", sa.DateTime(timezone=True)),
                  sa.column("policy", sa.String), sa.column("cacheable", sa.Boolean),
                  sa.column("report", sa.JSON), sa.column("analysis_id", sa.Integer),
                  sa.column("cached", sa.Boolean), sa.column("source", sa.JSON))


def upgrade() -> None:
    op.create_table(
        "analyses",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("scanner_version", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(256), nullable=False),
        sa.Column("cacheable", sa.Boolean, nullable=False),
        sa.Column("head", sa.LargeBinary, nullable=False),
        sa.Column("summary", sa.JSON, nullable=False),
        sa.Column("dtypes", sa.JSON, nullable=False),
        sa.Column("tensor_count", sa.Integer, nullable=False),
        sa.Column("storage_count", sa.Integer, nullable=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_analyses_cache", "analyses", ["sha256", "scanner_version", "policy"])
    op.create_table(
        "manifest_chunks",
        sa.Column("analysis_id", sa.Integer, sa.ForeignKey("analyses.id"), primary_key=True),
        sa.Column("part", sa.String(16), primary_key=True),
        sa.Column("chunk", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "tensor_keys",
        sa.Column("analysis_id", sa.Integer, sa.ForeignKey("analyses.id"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("nbytes", sa.BigInteger, nullable=False),
        sa.Column("data_offset", sa.BigInteger, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_tensor_keys_nbytes", "tensor_keys", ["analysis_id", "nbytes", "idx"])
    op.create_index("ix_tensor_keys_data_offset", "tensor_keys", ["analysis_id", "data_offset", "idx"])
    op.create_index("ix_tensor_keys_dtype", "tensor_keys", ["analysis_id", "dtype", "idx"])
    op.create_index("ix_tensor_keys_dtype_nbytes", "tensor_keys", ["analysis_id", "dtype", "nbytes", "idx"])
    op.create_index("ix_tensor_keys_dtype_data_offset", "tensor_keys",
                    ["analysis_id", "dtype", "data_offset", "idx"])
    op.add_column("scans", sa.Column("analysis_id", sa.Integer, nullable=True))
    op.add_column("scans", sa.Column("cached", sa.Boolean, nullable=True))
    op.add_column("scans", sa.Column("source", sa.JSON, nullable=True))
    _move_reports()
    with op.batch_alter_table("scans") as batch:
        batch.drop_index("ix_scans_cache")
        batch.drop_column("report")
        batch.drop_column("scanner_version")
        batch.drop_column("policy")
        batch.drop_column("cacheable")
        batch.alter_column("analysis_id", existing_type=sa.Integer, nullable=False)
        batch.alter_column("cached", existing_type=sa.Boolean, nullable=False)
        batch.alter_column("source", existing_type=sa.JSON, nullable=False)
        batch.create_foreign_key("fk_scans_analysis_id_analyses", "analyses", ["analysis_id"], ["id"])
        batch.create_index("ix_scans_sha256", ["sha256"])
        batch.create_index("ix_scans_analysis", ["analysis_id"])
        batch.create_index("ix_scans_created_at", ["created_at"])


def _move_reports() -> None:
    """Every scan's report into an analysis of its own, a row at a time (reports may be large)."""
    conn = op.get_bind()
    layout = compact.Layout(_analyses, _chunks, _keys)
    last = 0
    while True:
        row = conn.execute(sa.select(_scans.c.seq, _scans.c.created_at, _scans.c.policy,
                                     _scans.c.cacheable, _scans.c.report)
                           .where(_scans.c.seq > last).order_by(_scans.c.seq).limit(1)).first()
        if row is None:
            return
        last = row.seq
        report = row.report if isinstance(row.report, dict) else json.loads(row.report)
        created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
        analysis_id = compact.insert_analysis(conn, layout, report, policy=row.policy,
                                              cacheable=bool(row.cacheable), now=created)
        conn.execute(_scans.update().where(_scans.c.seq == row.seq).values(
            analysis_id=analysis_id, cached=False, source=report.get("source") or {}))


def downgrade() -> None:
    raise NotImplementedError("0003_compact is one-way: restore the database from a backup")
