"""Outbound notification: POST a finished revision's summary, signed, with retries.

Strategy: the body is the exact JSON bytes that are signed; the signature header is
`X-Ckptguard-Signature: sha256=<hex HMAC-SHA256(secret, body)>` (the GitHub
`X-Hub-Signature-256` scheme), so a receiver verifies with one `hmac.compare_digest`.
The signed body carries `sent_at` (epoch seconds) so receivers can refuse replays.
Non-2xx answers and transport errors are retried with exponential
backoff; the last error is returned to be recorded, never swallowed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from typing import Any

import httpx

SIGNATURE_HEADER = "X-Ckptguard-Signature"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does (and what the tests check)."""
    return hmac.compare_digest(sign(secret, body), header)


async def notify(url: str, summary: dict[str, Any], *, secret: str | None, retries: int = 3,
                 backoff_s: float = 1.0, timeout_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> str | None:
    """POST `summary`; None on a 2xx, else the last error after `retries` extra attempts."""
    body = json.dumps({**summary, "sent_at": int(time.time())}, sort_keys=True,
                      separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "ckptguard-notify"}
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    error: str | None = None
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, follow_redirects=False,
                                 transport=transport) as client:
        for attempt in range(retries + 1):
            if attempt:
                await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
            try:
                resp = await client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                continue
            if 200 <= resp.status_code < 300:
                return None
            error = f"HTTP {resp.status_code}"
    return error
