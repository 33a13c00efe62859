"""The hub webhook: secret check, payload -> revisions to scan, and the revision summary.

Strategy: Hugging Face conventions (huggingface.co/docs/hub/webhooks). The hub sends
the configured secret verbatim in `X-Webhook-Secret` (no HMAC; `?secret=` is accepted
too): missing -> 401, wrong -> 403, compared in constant time. Only `repo.content`
events of models and datasets mean work; every other event is acknowledged and
dropped. Each updated ref with a new sha (`updatedRefs[].newSha`; a deleted ref has
none) becomes one delivery, deduplicated on (repo type, repo, ref, sha); a revision
has one job whatever refs point at it. Nothing is scanned inside the request.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from ckptguard.app.hub.db import HubDb
from ckptguard.app.problems import AppError
from ckptguard.core.records import record

REPO_TYPES = {"model": "model", "models": "model", "dataset": "dataset", "datasets": "dataset"}
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_REF = re.compile(r"^refs/[A-Za-z0-9._/-]{1,240}$")


@record(frozen=True, slots=True)
class Target:
    repo_type: str
    repo: str
    ref: str
    sha: str


def check_secret(configured: str | None, presented: str | None) -> None:
    """401 when no secret came, 403 when it is wrong, 503 when none is configured."""
    if not configured:
        raise AppError("WEBHOOK_DISABLED", 503, "no webhook secret is configured (CKPTGUARD_WEBHOOK_SECRET)")
    if not presented:
        raise AppError("UNAUTHORIZED", 401, "the X-Webhook-Secret header is missing")
    if not hmac.compare_digest(presented.encode(), configured.encode()):
        raise AppError("FORBIDDEN", 403, "the webhook secret is wrong")


def repo_type_of(value: str) -> str:
    kind = REPO_TYPES.get(value)
    if kind is None:
        raise AppError("BAD_REPO_TYPE", 404, "repo type must be model(s) or dataset(s)")
    return kind


def valid_repo(name: object) -> str | None:
    """`namespace/name` (or a legacy bare name) with hub-safe characters, else None."""
    if not isinstance(name, str):
        return None
    parts = name.split("/")
    if not 1 <= len(parts) <= 2 or not all(_SEGMENT.match(p) and ".." not in p for p in parts):
        return None
    return name


def parse_event(payload: object) -> tuple[list[Target], str | None]:
    """(revisions to scan, why ignored). Malformed payloads raise 400."""
    if not isinstance(payload, dict):
        raise AppError("BAD_WEBHOOK", 400, "the payload is not a JSON object")
    event, repo = payload.get("event"), payload.get("repo")
    if not isinstance(event, dict) or not isinstance(repo, dict):
        raise AppError("BAD_WEBHOOK", 400, "the payload needs `event` and `repo` objects")
    scope, action = event.get("scope"), event.get("action")
    if scope != "repo.content":
        return [], f"event scope {str(scope)[:64]!r} needs no scan"
    if action not in ("create", "update"):
        return [], f"action {str(action)[:32]!r} needs no scan"
    kind = repo.get("type")
    if kind not in ("model", "dataset"):
        return [], f"repo type {str(kind)[:32]!r} is not scanned"
    name = valid_repo(repo.get("name"))
    if name is None:
        raise AppError("BAD_WEBHOOK", 400, "repo.name is not a valid repository name")
    targets: list[Target] = []
    refs = payload.get("updatedRefs")
    if isinstance(refs, list) and refs:
        for entry in refs[:64]:
            if not isinstance(entry, dict):
                continue
            ref, sha = entry.get("ref"), entry.get("newSha")
            if sha is None:
                continue  # a deleted ref: nothing new to scan
            if not isinstance(ref, str) or not _REF.match(ref) or ".." in ref \
                    or not isinstance(sha, str) or not _SHA.match(sha):
                raise AppError("BAD_WEBHOOK", 400, "updatedRefs entries need a ref and a 40-hex newSha")
            targets.append(Target(kind, name, ref, sha))
    else:
        sha = repo.get("headSha")
        if not isinstance(sha, str) or not _SHA.match(sha):
            raise AppError("BAD_WEBHOOK", 400, "repo.headSha must be a 40-hex commit sha")
        targets.append(Target(kind, name, "refs/heads/main", sha))
    return list(dict.fromkeys(targets)), None


def accept(db: HubDb, targets: list[Target]) -> list[dict[str, Any]]:
    """Record the deliveries (blocking); the caller enqueues the new jobs."""
    out = []
    for t in targets:
        d = db.deliver(t.repo_type, t.repo, t.ref, t.sha)
        out.append({"repo_type": t.repo_type, "repo": t.repo, "ref": t.ref, "revision": t.sha,
                    "job_id": d.job_id, "duplicate": d.duplicate, "new_job": d.new_job})
    return out


def summary(db: HubDb, job_id: str) -> dict[str, Any] | None:
    """The revision document: job state, per-file verdicts and report ids, overall verdict."""
    job = db.job(job_id)
    if job is None:
        return None
    return _job_doc(job, db.files(job_id))


def revision_item(job: Any, files: list[Any], states: dict[str, int]) -> dict[str, Any]:
    """One revision of GET /hub/revisions: the document with its first files and the count
    of files in each state."""
    return {**_job_doc(job, files), "file_count": sum(states.values()), "file_states": states}


def _job_doc(job: Any, files: list[Any]) -> dict[str, Any]:
    return {
        "job_id": job.id, "repo_type": job.repo_type, "repo": job.repo, "revision": job.revision,
        "ref": job.ref, "state": job.state, "verdict": job.verdict, "error": job.error,
        "created_at": job.created_at.isoformat(), "updated_at": job.updated_at.isoformat(),
        # "sending" is a sender's claim (HubDb.claim_notification): still pending to a reader
        "notification": "pending" if job.notify_state == "sending" else job.notify_state,
        "files": [{"path": f.path, "size": f.size, "lfs_sha256": f.lfs_sha256, "state": f.state,
                   "container": f.container, "verdict": f.verdict, "report_id": f.report_id,
                   "attempts": f.attempts, "error": f.error} for f in files],
    }
