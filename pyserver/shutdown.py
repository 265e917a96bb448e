"""A graceful stop of ``wick serve`` (SIGTERM, Ctrl-C): no new requests at once, a grace
period for the running ones, then an error for each still running (a stream gets it as an
event, then ``data: [DONE]``). uvicorn tells ``Shutdown`` when its own shutdown begins."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..engine.errors import WickError

if TYPE_CHECKING:
    from .app import ModelPool

log = logging.getLogger("wick.server")
HEADER_TIMEOUT_S = 20.0  # a request's headers must arrive within this


class Shutdown:
    """A graceful stop (``wick serve`` on SIGTERM/SIGINT): ``begin(grace)`` makes the guard
    refuse new requests at once and, ``grace`` seconds later, ends every request still
    running with a ``server_shutdown`` error (a stream gets it as an event, then
    ``[DONE]``)."""

    def __init__(self) -> None:
        self.started = False
        self.pool: ModelPool | None = None

    def begin(self, grace: float) -> None:
        if self.started:
            return
        self.started = True
        log.info("shutting down: no new requests; running ones have %.0f s to finish", grace)
        asyncio.get_running_loop().call_later(grace, self.end_running)

    def end_running(self) -> None:
        if self.pool is None:
            return
        for engine in self.pool.engines.values():
            if engine.core.has_unfinished():
                log.info("shutting down: ending the requests still running")
            engine.abort_all(WickError(
                "The server is shutting down and ended this request before it finished; "
                "retry it.", type="service_unavailable", code="server_shutdown", status=503))


def GracefulServer(app: Any, shutdown: Shutdown, grace: float,  # noqa: N802
                   log_level: str = "info", header_timeout: float = HEADER_TIMEOUT_S) -> Any:
    """A uvicorn server that tells the app when shutdown begins (``Shutdown.begin``): running
    requests get ``grace`` seconds, then an error; uvicorn's own deadline comes 5 s later.
    A connection must send each request's headers within ``header_timeout`` seconds."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            shutdown.begin(grace)
            await super().shutdown(sockets)

    return _Server(uvicorn.Config(app, log_level=log_level, access_log=False, log_config=None,
                                  timeout_graceful_shutdown=grace + 5,
                                  http=header_deadline_protocol(header_timeout)))


def header_deadline_protocol(timeout: float) -> type:
    """uvicorn's HTTP/1.1 protocol with a deadline for request headers.

    uvicorn times out a connection only while it is idle between requests, and any byte resets
    that; a client that opens connections and trickles header bytes (or sends none) holds them
    forever. Here a connection that has no complete request head ``timeout`` seconds after it
    opened, or after its last response ended, is closed. Bodies have their own limit
    (``http_io.read_json_body``); a running stream is never affected."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = asyncio.get_running_loop().call_later(timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self._reading_headers():
                return
            log.debug("closed a connection that sent no complete request within %.0f s",
                      timeout)
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

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline
