"""Hub jobs in the database: the durable state machine behind app/hub/jobs.py.

Strategy: every state change is one short transaction, so a process killed at any
point leaves rows a restart can continue from. A job is claimed with a conditional
UPDATE (queued, or running with an expired lease) and the lease is renewed while the
runner works, so two replicas sharing a database never run the same job at once.
    job:  queued -> running -> done | failed      (running + lease expired -> claimable)
          queued -> cancelled                     (a queued rescan called off)
    file: queued -> running -> done | failed | skipped   (failed only after the last retry)
Leases are the in-process queue's (SQLite); on PostgreSQL procrastinate's locks keep a job
to one worker, and its tasks use `begin`, `finish_if_complete` (app/hub/tasks.py).
Blocking calls: the async runner uses `asyncio.to_thread`.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ckptguard.app.hub.client import TreeFile
from ckptguard.app.tables import hub_deliveries, hub_files, hub_jobs
from ckptguard.core.records import record

FINISHED = frozenset({"done", "failed"})
RESCANNABLE = FINISHED | {"cancelled"}
PENDING = ("queued", "running")
# Worst first: a file that could not be judged counts as `invalid` (never as safe).
VERDICT_RANK = {"safe": 0, "suspicious": 1, "invalid": 2, "unsafe": 3}


@record(frozen=True, slots=True)
class Delivery:
    job_id: str
    duplicate: bool       # this (repo, ref, sha) was delivered before: nothing new queued
    new_job: bool         # a job row was created (a revision not seen before)


def _now() -> datetime:
    return datetime.now(UTC)


def _notification_due(now: float) -> Any:
    return sa.or_(hub_jobs.c.notify_state == "pending", sa.and_(
        hub_jobs.c.notify_state == "sending", hub_jobs.c.lease_until < now))


def worst(verdicts: list[str | None]) -> str | None:
    known = [v if v in VERDICT_RANK else "invalid" for v in verdicts]
    return max(known, key=VERDICT_RANK.__getitem__) if known else None


def encode_job_cursor(job: Any) -> str:
    created = job.created_at if job.created_at.tzinfo else job.created_at.replace(tzinfo=UTC)
    raw = f"{created.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_job_cursor(cursor: str) -> tuple[datetime, str]:
    """(created_at, id) of the last revision of a page; ValueError if it is not ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        created, job_id = raw.split("|")
        when = datetime.fromisoformat(created)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("bad cursor") from exc
    if not re.fullmatch(r"[0-9a-f]{32}", job_id) or when.tzinfo is None:
        raise ValueError("bad cursor")
    return when, job_id


class HubDb:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    # --- deliveries ---------------------------------------------------------------

    def deliver(self, repo_type: str, repo: str, ref: str, sha: str) -> Delivery:
        """Record a delivery and make sure the revision has a job (both idempotent)."""
        job_id, new_job = self._job_for(repo_type, repo, sha, ref)
        try:
            with self.engine.begin() as conn:
                conn.execute(hub_deliveries.insert().values(
                    repo_type=repo_type, repo=repo, ref=ref, new_sha=sha, job_id=job_id,
                    received_at=_now()))
        except IntegrityError:
            return Delivery(job_id, duplicate=True, new_job=new_job)
        return Delivery(job_id, duplicate=False, new_job=new_job)

    def _job_for(self, repo_type: str, repo: str, sha: str, ref: str | None) -> tuple[str, bool]:
        key = (hub_jobs.c.repo_type == repo_type, hub_jobs.c.repo == repo, hub_jobs.c.revision == sha)
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(hub_jobs.c.id).where(*key)).scalar()
        if found is not None:
            return str(found), False
        now = _now()
        try:
            with self.engine.begin() as conn:
                job_id = uuid.uuid4().hex
                conn.execute(hub_jobs.insert().values(
                    id=job_id, repo_type=repo_type, repo=repo, revision=sha, ref=ref, state="queued",
                    listed=False, attempts=0, created_at=now, updated_at=now))
            return job_id, True
        except IntegrityError:  # a concurrent delivery created it first
            with self.engine.connect() as conn:
                return str(conn.execute(sa.select(hub_jobs.c.id).where(*key)).scalar_one()), False

    # --- claiming -------------------------------------------------------------------

    def claim(self, job_id: str, owner: str, lease_s: float) -> bool:
        now = time.time()
        due = sa.or_(hub_jobs.c.next_attempt_at.is_(None), hub_jobs.c.next_attempt_at <= now)
        claimable = sa.or_(sa.and_(hub_jobs.c.state == "queued", due),
                           sa.and_(hub_jobs.c.state == "running", hub_jobs.c.lease_until < now))
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(hub_jobs.c.id == job_id, claimable).values(
                state="running", lease_owner=owner, lease_until=now + lease_s, updated_at=_now()))
        return done.rowcount == 1

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(
                hub_jobs.c.id == job_id, hub_jobs.c.lease_owner == owner, hub_jobs.c.state == "running",
            ).values(lease_until=time.time() + lease_s))
        return done.rowcount == 1

    def release(self, owner: str) -> int:
        """A stopping runner hands its jobs back (queued) instead of waiting out the lease."""
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(
                hub_jobs.c.lease_owner == owner, hub_jobs.c.state == "running",
            ).values(state="queued", lease_owner=None, lease_until=None, updated_at=_now()))
        return int(done.rowcount)

    def runnable(self) -> list[tuple[str, float]]:
        """Jobs someone should run: (id, when) for queued ones and expired leases."""
        now = time.time()
        query = sa.select(hub_jobs.c.id, hub_jobs.c.state, hub_jobs.c.next_attempt_at,
                          hub_jobs.c.lease_until).where(
            sa.or_(hub_jobs.c.state == "queued",
                   sa.and_(hub_jobs.c.state == "running", hub_jobs.c.lease_until < now)))
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(hub_jobs.c.created_at)).all()
        return [(r.id, float(r.next_attempt_at or 0.0) if r.state == "queued" else 0.0) for r in rows]

    def unnotified(self) -> list[str]:
        """Finished revisions whose notification is due: pending, or claimed by a sender whose
        claim ran out (it died mid-send)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(hub_jobs.c.id).where(
                hub_jobs.c.state.in_(FINISHED), _notification_due(time.time()))).all()
        return [r.id for r in rows]

    def claim_notification(self, job_id: str, ttl_s: float) -> str:
        """Take the sending of a revision's notification for `ttl_s` (the longest a send with all
        its retries takes), so two processes never send it at once: "claimed", "busy" (another
        sender holds it), or "done" (nothing to send). The claim lives in the finished job's
        lease column, unused once the job ended; documents show a claimed send as pending."""
        now = time.time()
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(
                hub_jobs.c.id == job_id, hub_jobs.c.state.in_(FINISHED), _notification_due(now)).values(
                notify_state="sending", lease_until=now + ttl_s))
            if done.rowcount == 1:
                return "claimed"
            state = conn.execute(sa.select(hub_jobs.c.notify_state).where(hub_jobs.c.id == job_id)).scalar()
        return "busy" if state == "sending" else "done"

    # --- job rows -------------------------------------------------------------------

    def job(self, job_id: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(hub_jobs).where(hub_jobs.c.id == job_id)).first()

    def find_job(self, repo_type: str, repo: str, revision: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(hub_jobs).where(
                hub_jobs.c.repo_type == repo_type, hub_jobs.c.repo == repo,
                hub_jobs.c.revision == revision)).first()

    def list_jobs(self, *, limit: int, cursor: str | None = None, state: str | None = None,
                  ) -> tuple[list[Any], str | None]:
        """Revisions newest first, `limit` at most, and the cursor of the next page (or None).

        Raises ValueError on a cursor `list_jobs` did not issue."""
        query = sa.select(hub_jobs)
        if state is not None:
            query = query.where(hub_jobs.c.state == state)
        if cursor is not None:
            created, job_id = decode_job_cursor(cursor)
            query = query.where(sa.or_(hub_jobs.c.created_at < created, sa.and_(
                hub_jobs.c.created_at == created, hub_jobs.c.id < job_id)))
        query = query.order_by(hub_jobs.c.created_at.desc(), hub_jobs.c.id.desc()).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = list(conn.execute(query).all())
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, encode_job_cursor(rows[-1]) if more and rows else None

    def file_page(self, job_id: str, limit: int) -> tuple[list[Any], dict[str, int]]:
        """A revision's first `limit` files by path, and how many files are in each state."""
        with self.engine.connect() as conn:
            files = list(conn.execute(sa.select(hub_files).where(hub_files.c.job_id == job_id)
                                      .order_by(hub_files.c.path).limit(limit)).all())
            counts = conn.execute(sa.select(hub_files.c.state, sa.func.count()).where(
                hub_files.c.job_id == job_id).group_by(hub_files.c.state)).all()
        return files, {str(state): int(n) for state, n in counts}

    def reset(self, job_id: str) -> bool:
        """Queue a finished revision again from scratch (tree listing, every file).

        False if the job is not finished (queued or running jobs are left alone; a cancelled
        one may be queued again). Files whose
        LFS sha256 has a report from this scanner version and policy still reuse it; after an
        upgrade or an allowlist change they are scanned again.
        """
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(
                hub_jobs.c.id == job_id, hub_jobs.c.state.in_(RESCANNABLE)).values(
                state="queued", listed=False, verdict=None, error=None, attempts=0,
                next_attempt_at=None, lease_owner=None, lease_until=None, notify_state=None,
                notify_error=None, updated_at=_now()))
            if done.rowcount != 1:
                return False
            conn.execute(hub_files.delete().where(hub_files.c.job_id == job_id))
        return True

    def cancel(self, job_id: str) -> bool:
        """Call off a revision nobody has started (queued -> cancelled); False otherwise."""
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(
                hub_jobs.c.id == job_id, hub_jobs.c.state == "queued").values(
                state="cancelled", lease_owner=None, lease_until=None, updated_at=_now()))
        return done.rowcount == 1

    def begin(self, job_id: str) -> bool:
        """A procrastinate task takes the revision (its lock keeps it to one worker, so a
        `running` row is one a dead worker left). False when cancelled or finished."""
        with self.engine.begin() as conn:
            done = conn.execute(hub_jobs.update().where(
                hub_jobs.c.id == job_id, hub_jobs.c.state.in_(PENDING)).values(
                state="running", updated_at=_now()))
        return done.rowcount == 1

    def list_failed(self, job_id: str, error: str, *, final: bool, retry_at: float | None = None,
                    notify: bool = False) -> None:
        """A tree listing failed: fail the job for good (`final`), or queue it again (the
        in-process queue runs it at `retry_at`; procrastinate keeps its own retry time)."""
        values: dict[str, Any] = {"attempts": hub_jobs.c.attempts + 1, "error": error[:2000],
                                  "updated_at": _now(), "lease_owner": None, "lease_until": None}
        if final:
            values.update(state="failed", verdict="invalid", notify_state="pending" if notify else None)
        else:
            values.update(state="queued", next_attempt_at=retry_at)
        with self.engine.begin() as conn:
            conn.execute(hub_jobs.update().where(hub_jobs.c.id == job_id).values(**values))

    def add_files(self, job_id: str, files: list[TreeFile], min_bytes: int) -> None:
        now = _now()
        rows = [{"job_id": job_id, "path": f.path, "size": f.size, "lfs_sha256": f.lfs_sha256,
                 "report_key": uuid.uuid4().hex,
                 "state": "queued" if f.size >= min_bytes else "skipped",
                 "error": None if f.size >= min_bytes else f"{f.size} bytes: too small to hold a checkpoint",
                 "attempts": 0, "updated_at": now} for f in files]
        with self.engine.begin() as conn:
            if rows:
                conn.execute(hub_files.insert(), rows)
            conn.execute(hub_jobs.update().where(hub_jobs.c.id == job_id).values(
                listed=True, error=None, updated_at=now))

    def finish(self, job_id: str, *, notify: bool) -> str:
        """Close the job from its files: failed if any file failed; the worst verdict."""
        state = self.finish_if_complete(job_id, notify=notify, only_running=False)
        assert state is not None
        return state

    def finish_if_complete(self, job_id: str, *, notify: bool, only_running: bool = True,
                           owner: str | None = None) -> str | None:
        """Close a running job whose files are all finished; its state, or None when files are
        pending or someone else closed it. Each file task ends with this: the conditional
        UPDATE lets exactly one of two files finishing at once close the revision. With `owner`
        (the in-process runner) only while it still holds the lease: a runner whose lease was
        taken over must not close (and announce) the revision a second time."""
        with self.engine.begin() as conn:
            files = list(conn.execute(sa.select(hub_files.c.state, hub_files.c.verdict).where(
                hub_files.c.job_id == job_id)).all())
            if any(f.state in PENDING for f in files):
                return None
            failed = [f for f in files if f.state == "failed"]
            judged = [f.verdict for f in files if f.state == "done"] + [None for _ in failed]
            state = "failed" if failed else "done"
            error = f"{len(failed)} file(s) could not be scanned" if failed else None
            where = [hub_jobs.c.id == job_id] + ([hub_jobs.c.state == "running"] if only_running else [])
            if owner is not None:
                where.append(hub_jobs.c.lease_owner == owner)
            done = conn.execute(hub_jobs.update().where(*where).values(
                state=state, verdict=worst(judged) or "safe", error=error,
                lease_owner=None, lease_until=None, updated_at=_now(),
                notify_state="pending" if notify else None))
        return state if done.rowcount == 1 else None

    def notified(self, job_id: str, error: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(hub_jobs.update().where(hub_jobs.c.id == job_id).values(
                notify_state="failed" if error else "sent", notify_error=error, lease_until=None))

    # --- file rows ------------------------------------------------------------------

    def files(self, job_id: str) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(hub_files).where(hub_files.c.job_id == job_id)
                                     .order_by(hub_files.c.path)).all())

    def pending(self, job_id: str) -> list[Any]:
        """Files still to scan (a `running` row is left over from a process that died)."""
        return [f for f in self.files(job_id) if f.state in ("queued", "running")]

    def file(self, file_id: int) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(hub_files).where(hub_files.c.id == file_id)).first()

    def known_refs(self) -> list[tuple[str, str, str]]:
        """(repo type, repo, ref) of every branch a delivery named: what `reconcile` polls."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(hub_deliveries.c.repo_type, hub_deliveries.c.repo,
                                          hub_deliveries.c.ref).distinct().where(
                hub_deliveries.c.ref.like("refs/heads/%"))).all()
        return [(r.repo_type, r.repo, r.ref) for r in rows]

    def file_state(self, file_id: int, **values: Any) -> None:
        values["updated_at"] = _now()
        with self.engine.begin() as conn:
            conn.execute(hub_files.update().where(hub_files.c.id == file_id).values(**values))
