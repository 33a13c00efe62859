"""hub: webhook jobs, per-file rows, deduplicated deliveries

Revision ID: 0002_hub
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_hub"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hub_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("repo_type", sa.String(16), nullable=False),
        sa.Column("repo", sa.String(256), nullable=False),
        sa.Column("revision", sa.String(64), nullable=False),
        sa.Column("ref", sa.String(256), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("listed", sa.Boolean, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=True),
        sa.Column("lease_owner", sa.String(32), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
        sa.Column("notify_state", sa.String(16), nullable=True),
        sa.Column("notify_error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("repo_type", "repo", "revision", name="uq_hub_jobs_revision"),
    )
    op.create_index("ix_hub_jobs_state", "hub_jobs", ["state"])
    op.create_table(
        "hub_files",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("hub_jobs.id"), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("lfs_sha256", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("container", sa.String(32), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("report_id", sa.String(32), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "path", name="uq_hub_files_path"),
    )
    op.create_index("ix_hub_files_job", "hub_files", ["job_id"])
    op.create_table(
        "hub_deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("repo_type", sa.String(16), nullable=False),
        sa.Column("repo", sa.String(256), nullable=False),
        sa.Column("ref", sa.String(256), nullable=False),
        sa.Column("new_sha", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("repo_type", "repo", "ref", "new_sha", name="uq_hub_deliveries"),
    )


def downgrade() -> None:
    op.drop_table("hub_deliveries")
    op.drop_index("ix_hub_files_job", table_name="hub_files")
    op.drop_table("hub_files")
    op.drop_index("ix_hub_jobs_state", table_name="hub_jobs")
    op.drop_table("hub_jobs")
