"""A graceful stop of ``wick serve`` (SIGTERM, Ctrl-C): no new requests at once, a grace
period for the running ones, then an error for each still running (a stream gets it as an
event, then ``data: [DONE]``). uvicorn tells ``Shutdown`` when its own shutdown begins."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..engine.errors import WickError
from .connection import HEADER_TIMEOUT_S, WRITE_TIMEOUT_S

if TYPE_CHECKING:
    from .model_pool import ModelPool

log = logging.getLogger("wick.server")


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
                   log_level: str = "info", header_timeout: float = HEADER_TIMEOUT_S,
                   write_timeout: float = WRITE_TIMEOUT_S) -> Any:
    """A uvicorn server that tells the app when shutdown begins (``Shutdown.begin``): running
    requests get ``grace`` seconds, then an error; uvicorn's own deadline comes 5 s later.
    Its connections keep ``connection.guarded_protocol``'s deadlines."""
    import uvicorn

    from .connection import guarded_protocol

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            shutdown.begin(grace)
            await super().shutdown(sockets)

    return _Server(uvicorn.Config(app, log_level=log_level, access_log=False, log_config=None,
                                  timeout_graceful_shutdown=grace + 5,
                                  # (asyncio's loop whatever is installed: uvloop comes with
                                  # uvicorn[standard], which Ray Serve installs)
                                  loop="asyncio",
                                  http=guarded_protocol(header_timeout, write_timeout)))
