"""What one HTTP connection to ``wick serve`` may do: uvicorn's HTTP/1.1 protocol with two
deadlines, and its protocol errors answered in OpenAI's shape.

- Request heads: uvicorn times out a connection only while it is idle between requests, and
  any byte resets that; a client that opens connections and trickles header bytes (or sends
  none) would hold them forever. A connection that has no complete request head
  ``header_timeout`` seconds after it opened, or after its last response ended, is closed.
  Bodies have their own limit (``http_io.read_json_body``).
- Responses: a client that stops reading (a 25 MB shard, a stream) fills the socket's buffer;
  the response then waits, holding its file or its engine request. When the buffer stays full
  for ``write_timeout`` seconds, the connection is dropped (what it held is released as for
  any disconnect). A slow client that reads keeps its connection.
- A request h11 cannot parse (two ``Host`` headers, a malformed line) gets a 400 JSON error,
  not uvicorn's plain text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from ..engine.errors import InvalidRequestError

log = logging.getLogger("wick.server")
HEADER_TIMEOUT_S = 20.0  # a request's head must arrive within this
WRITE_TIMEOUT_S = 60.0  # a client that reads none of its response for this long is dropped


def guarded_protocol(header_timeout: float, write_timeout: float) -> type:
    """The uvicorn protocol class (``uvicorn.Config(http=...)``) with these deadlines: h11's,
    always (with httptools installed, as ``uvicorn[standard]`` installs it for Ray Serve,
    uvicorn's ``auto`` would pick that parser, which takes what h11 refuses: two Host headers)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedHTTP(H11Protocol):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None
        _write_deadline: asyncio.TimerHandle | None = None

        # -- request heads --------------------------------------------------------------

        def _arm(self) -> None:
            self._disarm()
            self._deadline = asyncio.get_running_loop().call_later(header_timeout,
                                                                   self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self._reading_headers():
                return
            log.debug("closed a connection that sent no complete request within %.0f s",
                      header_timeout)
            self.transport.close()

        def _reading_headers(self) -> bool:
            # between requests, or inside one whose head has not arrived: no cycle running
            return self.cycle is None or self.cycle.response_complete

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._deadline is not None and not self._reading_headers():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        # -- responses the client does not read -----------------------------------------

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_deadline is None:
                self._write_deadline = asyncio.get_running_loop().call_later(
                    write_timeout, self._write_expired)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._write_disarm()

        def _write_disarm(self) -> None:
            if self._write_deadline is not None:
                self._write_deadline.cancel()
                self._write_deadline = None

        def _write_expired(self) -> None:
            self._write_deadline = None
            log.info("dropped a connection whose client read none of its response for %.0f s",
                     write_timeout)
            self.transport.abort()  # close() would wait for the buffer to drain: never

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._write_disarm()
            super().connection_lost(exc)
            # a response waiting for the buffer to drain learns that it never will
            self.flow.resume_writing()

        # -- what h11 cannot parse --------------------------------------------------------

        def send_400_response(self, msg: str) -> None:
            # (uvicorn's messages end with a period or not, and may say "Invalid HTTP
            # request" themselves: one period, and the words once)
            detail = msg.strip().rstrip(".")
            if not detail.lower().startswith("invalid http request"):
                detail = f"Invalid HTTP request: {detail}"
            err = InvalidRequestError(f"{detail}.", code="invalid_http_request")
            body = json.dumps(err.to_dict()).encode()
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
                + body)
            self.transport.close()

    return GuardedHTTP
