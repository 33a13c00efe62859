"""Migration 0004 on PostgreSQL: revisions queued in the home-made table move to procrastinate,
under the same queueing lock the job tier uses (so enqueueing one again adds nothing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from ckptguard.app.settings import Settings
from ckptguard.app.store import MIGRATIONS
from ckptguard.app.tables import hub_jobs
from tests.e2e.service_server import private_postgres


@pytest.fixture
def url() -> Iterator[str]:
    with private_postgres() as private:
        yield private


def _upgrade(engine: sa.Engine, target: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)


def test_queued_revisions_move_over(url: str, tmp_path: Path) -> None:
    engine = sa.create_engine(url)
    try:
        _upgrade(engine, "0003_compact")
        now = datetime.now(UTC)
        retry_at = time.time() + 3600
        rows = {"queued": ("q" * 32, retry_at, None), "running": ("r" * 32, None, time.time() + 60),
                "done": ("d" * 32, None, None)}
        with engine.begin() as conn:
            for i, (state, (job_id, next_at, lease)) in enumerate(rows.items()):
                conn.execute(hub_jobs.insert().values(
                    id=job_id, repo_type="model", repo="a/b", revision=f"{i:040x}", state=state,
                    listed=False, attempts=0, next_attempt_at=next_at, lease_owner="x" if lease else None,
                    lease_until=lease, created_at=now, updated_at=now))
        _upgrade(engine, "head")
        with engine.connect() as conn:
            moved = conn.execute(sa.text(
                "SELECT args->>'job_id' AS job, task_name, queue_name, queueing_lock, lock, "
                "status::text AS status, scheduled_at FROM procrastinate_jobs ORDER BY job")).all()
            states = dict(conn.execute(sa.select(hub_jobs.c.id, hub_jobs.c.state)).all())
            leases = conn.execute(sa.select(sa.func.count())
                                  .where(hub_jobs.c.lease_owner.isnot(None))).scalar()
        assert [m.job for m in moved] == ["q" * 32, "r" * 32]
        for m in moved:
            assert (m.task_name, m.queue_name, m.status) == ("hub.revision", "hub", "todo")
            assert m.queueing_lock == m.lock == f"revision:{m.job}"
        assert moved[0].scheduled_at is not None and abs(moved[0].scheduled_at.timestamp() - retry_at) < 1
        assert moved[1].scheduled_at is None                        # the dead process's: at once
        assert states == {"q" * 32: "queued", "r" * 32: "queued", "d" * 32: "done"} and leases == 0

        from ckptguard.app.hub.tasks import ProcrastinateQueue, Runtime, build_app

        settings = Settings(data_dir=tmp_path, database_url=url)

        async def enqueue_again() -> None:
            queue = ProcrastinateQueue(build_app(settings, Runtime()), settings)
            await queue.start()
            try:
                await queue.enqueue_revision("r" * 32)            # waiting already: nothing added
            finally:
                await queue.close()

        asyncio.run(enqueue_again())
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM procrastinate_jobs")).scalar() == 2
    finally:
        engine.dispose()
