"""uvicorn's h11 protocol with a deadline on the request head (issue 15: slow clients).

uvicorn has no timeout for a request's line and headers: its keep-alive timer is cancelled
by any byte, so a client that sends one header byte every few seconds holds a connection
(and a file descriptor) for ever, and a few hundred of them exhaust the process's fds. Here
every connection must deliver a complete request head within `head_timeout` seconds of
opening, or of the end of the previous response on a kept-alive connection; otherwise it
gets `408 Request Timeout` and is closed. The body has its own limits at the ASGI layer
(app/main.py BodyLimit for JSON bodies, app/uploads.py `paced` for uploads).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ckptguard.app.problems import problem_body

log = logging.getLogger("ckptguard.http")

_BODY = json.dumps(problem_body("HEAD_TIMEOUT", 408, "the request line and headers did not "
                                "arrive in time")).encode()
# written straight to the socket: no ASGI cycle exists before a request head is complete
REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/problem+json\r\n"
                   b"connection: close\r\ncontent-length: " + str(len(_BODY)).encode()
                   + b"\r\n\r\n" + _BODY)


class HeadDeadlineProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request head is not complete in time."""

    head_timeout: float = 10.0   # replaced per server by `with_head_timeout`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    @classmethod
    def with_head_timeout(cls, seconds: float) -> type[HeadDeadlineProtocol]:
        """A subclass bound to one server's setting (uvicorn takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"head_timeout": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        # the next request on a kept-alive connection gets a fresh deadline for its head
        self._arm_head_deadline()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_deadline_passed)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_deadline_passed(self) -> None:
        self._head_deadline = None
        # IDLE: h11 has not yet seen a complete request line and headers on this cycle
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return   # a response is still being written for the previous request
        log.info("request head not received in time; connection closed",
                 extra={"event": "head_timeout", "seconds": self.head_timeout})
        self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()
