"""The OpenAI-compatible REST server (FastAPI) over one or more ``AsyncEngine``s.

    POST /v1/chat/completions    JSON, or SSE with ``stream: true`` (``data: {...}`` ... ``[DONE]``)
    POST /v1/completions
    GET  /v1/models, /v1/models/{model}
    GET  /health                 503 while the models load, 200 once they serve
    GET  /metrics                each served model's engine in Prometheus' format (``metrics.py``)
    GET  /artifacts/{id}/{path}  compiled artifact files (``artifact_host.py``)
    GET  /                       the chat page (``static/``)

The engine is the one definition of the protocol: request bodies are parsed as JSON here and
handed to ``engine.chat.completions.create(**body)`` unchanged; the engine validates them and
raises typed ``WickError``s, which become OpenAI error bodies with their own status. The
OpenAPI schemas are generated from the engine's dataclasses, not written again. The routes are
module-level functions (``routes.py``) reading this app's state; errors become OpenAI bodies in
``http_errors.py``. Every client
mistake (bad JSON, unknown route, wrong method, oversized body, bad key) gets an OpenAI-shaped
4xx; anything unexpected a generic 500 without internals (the traceback goes to the log).

Models load in the background after the server starts (compiling on first use), so ``/health``
can answer 503 meanwhile. Concurrent requests share engine steps; a streaming client that
disconnects has its request aborted (its KV pages are freed at the next step).

Hostile clients: every request passes ``guard.RequestGuard`` (Host and Origin checks); JSON
routes need ``Content-Type: application/json``; with an API key every route but ``/health``
and the chat page's static files needs it; a body must arrive within ``body_timeout`` seconds
(and never stall longer than ``http_io.BODY_IDLE_S``); parsing and request preparation run off the
event loop. On shutdown (``Shutdown``) running requests get a grace period, then end with an
error (streams: an error event, then ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware

from .artifact_host import ArtifactHost
from .guard import RequestGuard
from .http_errors import install_error_handlers
from .http_io import BODY_TIMEOUT_S
from .metrics import metrics_registry
from .model_pool import ModelPool
from .routes import STATIC, openapi_document, router
from .shutdown import GracefulServer, Shutdown

__all__ = ["GracefulServer", "ModelPool", "Shutdown", "create_app"]

MAX_BODY_BYTES = 4 << 20


@dataclass(frozen=True)
class Settings:
    """What the routes need of the server's options (``app.state.settings``)."""

    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout: float = BODY_TIMEOUT_S


def create_app(
    pool: ModelPool,
    *,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout: float = BODY_TIMEOUT_S,
    artifacts: ArtifactHost | None = None,
    shutdown: Shutdown | None = None,
) -> FastAPI:
    """The ASGI app. ``pool.load()`` runs in the background from the app's lifespan."""
    shutdown = shutdown or Shutdown()
    shutdown.pool = pool

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(pool.load()) if pool.loaders else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            await pool.aclose()

    app = FastAPI(title="wick", version=_version(), docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.pool = pool
    app.state.artifacts = artifacts or ArtifactHost()
    app.state.shutdown = shutdown
    app.state.settings = Settings(api_key, max_body_bytes, body_timeout)
    app.state.metrics = metrics_registry(pool.cores)
    app.state.openapi_documents = {}
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")  # (after /static/wick.js)
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    install_error_handlers(app)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Range", "If-Range", "If-None-Match"],
            expose_headers=["ETag", "Content-Range", "Accept-Ranges", "Content-Length"],
        )
    # outermost: a request from a foreign Host or Origin is refused before anything else
    app.add_middleware(RequestGuard, allowed_hosts=allowed_hosts, cors_origins=cors_origins,
                       shutting_down=lambda: shutdown.started)
    return app


def _version() -> str:
    from .._version import __version__

    return __version__
