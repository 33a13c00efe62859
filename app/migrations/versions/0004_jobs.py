"""job tier: asynchronous URL scans, recoveries; on PostgreSQL procrastinate's schema

Revision ID: 0004_jobs
Revises: 0003_compact
Create Date: 2026-11-25

On PostgreSQL the job tier runs on procrastinate (app/hub/tasks.py): its schema, the SQL file
the installed procrastinate ships, is applied here, and every hub revision still queued (or
left running by a process that died) in the home-made table moves over as a procrastinate job,
its retry time kept as the job's schedule. SQLite keeps the in-process queue: nothing to move.
The queue and task names are frozen copies of app/hub/tasks.py's (a migration must not change when the
code does).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_jobs"
down_revision = "0003_compact"
branch_labels = None
depends_on = None



def upgrade() -> None:
    op.create_table(
        "url_scans",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("headers", sa.Text, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("report_id", sa.String(32), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_url_scans_state", "url_scans", ["state"])
    op.create_table(
        "job_recoveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("recovered_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.add_column("hub_files", sa.Column("report_key", sa.String(32), nullable=True))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    from procrastinate.schema import SchemaManager

    # One multi-statement script, on the driver's cursor without parameters: psycopg passes it
    # as it is (through SQLAlchemy, its `%` would be read as placeholders).
    cursor = bind.connection.dbapi_connection.cursor()   # type: ignore[union-attr]
    cursor.execute(SchemaManager.get_schema())
    cursor.close()
    bind.exec_driver_sql(
        "INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, queueing_lock, args, "
        "scheduled_at) "
        "SELECT 'hub', 'hub.revision', 0, 'revision:' || id, 'revision:' || id, "
        "jsonb_build_object('job_id', id), "
        "CASE WHEN state = 'queued' AND next_attempt_at IS NOT NULL "
        "THEN to_timestamp(next_attempt_at) END "
        "FROM hub_jobs WHERE state IN ('queued', 'running')")
    bind.exec_driver_sql(
        "UPDATE hub_jobs SET state = 'queued', lease_owner = NULL, lease_until = NULL, "
        "next_attempt_at = NULL WHERE state IN ('queued', 'running')")
    bind.exec_driver_sql(
        "UPDATE hub_files SET state = 'queued', next_attempt_at = NULL WHERE state = 'running'")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        # procrastinate's jobs go with its tables; queued revisions stay queued in hub_jobs,
        # where the in-process queue's sweeper finds them
        for table in ("procrastinate_events", "procrastinate_periodic_defers", "procrastinate_jobs",
                      "procrastinate_workers"):
            bind.exec_driver_sql(f"DROP TABLE IF EXISTS {table} CASCADE")
    with op.batch_alter_table("hub_files") as batch:   # SQLite rebuilds the table
        batch.drop_column("report_key")
    op.drop_table("job_recoveries")
    op.drop_index("ix_url_scans_state", table_name="url_scans")
    op.drop_table("url_scans")
