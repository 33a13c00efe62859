"""scans: stored reports, cache key (sha256, scanner_version, policy)

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scans",
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
        sa.Column("cacheable", sa.Boolean, nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
    )
    op.create_index("ix_scans_cache", "scans", ["sha256", "scanner_version", "policy"])
    op.create_index("ix_scans_verdict", "scans", ["verdict"])


def downgrade() -> None:
    op.drop_index("ix_scans_verdict", table_name="scans")
    op.drop_index("ix_scans_cache", table_name="scans")
    op.drop_table("scans")
