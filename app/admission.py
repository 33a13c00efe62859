"""Caps on work in flight: uploads being received, URL scans running, and per API key.

Each kind has a service-wide cap, so a crowd of slow uploads cannot exhaust connections and
spool files, and URL scans (which wait on someone else's server) cannot take every scan
worker: uploads keep being scanned while a trickling upstream holds its share. Where API keys
are configured, one key also has a cap over all kinds together, so one caller cannot take a
whole kind's share. Past any cap: 503 with Retry-After, before any work starts.

Counters live on the event loop only (no lock needed).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Literal

from ckptguard.app.problems import AppError

Kind = Literal["upload", "url"]
RETRY_AFTER_S = 5
RETRY = {"Retry-After": str(RETRY_AFTER_S)}


def key_identity(token: str) -> str:
    """What the counters hold for a key: a digest, so no key sits in another table in clear."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


class Admission:
    def __init__(self, caps: dict[Kind, int], per_key: int, on_refusal: Callable[[], None]) -> None:
        self.caps = caps
        self.per_key = per_key
        self.on_refusal = on_refusal
        self.in_flight: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()

    @contextlib.contextmanager
    def slot(self, kind: Kind, key: str | None) -> Iterator[None]:
        """Hold one slot of `kind` (and of `key`, an identity from `key_identity`) or raise 503."""
        if self.in_flight[kind] >= self.caps[kind]:
            self.on_refusal()
            if kind == "upload":
                raise AppError("UPLOADS_BUSY", 503, f"{self.in_flight[kind]} uploads are being "
                               "received; retry later", headers=RETRY)
            raise AppError("URL_SCANS_BUSY", 503, f"{self.in_flight[kind]} URL scans are running; "
                           "retry later", headers=RETRY)
        if key is not None and self.by_key[key] >= self.per_key:
            self.on_refusal()
            raise AppError("KEY_BUSY", 503, f"this API key has {self.by_key[key]} uploads and URL "
                           "scans in flight; retry later", headers=RETRY)
        self.in_flight[kind] += 1
        if key is not None:
            self.by_key[key] += 1
        try:
            yield
        finally:
            self.in_flight[kind] -= 1
            if key is not None:
                self.by_key[key] -= 1
                if not self.by_key[key]:
                    del self.by_key[key]   # no entry per key ever seen: the table stays small
