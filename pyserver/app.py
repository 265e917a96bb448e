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
OpenAPI schemas are generated from the engine's dataclasses, not written again. Every client
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
import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ..engine import AsyncEngineAPI
from ..engine.errors import InvalidRequestError, ModelNotFoundError, WickError
from ..engine.protocol import MAX_N, ChatCompletionRequest, CompletionRequest
from ..engine.sampling_defaults import chat_values
from .artifact_host import (
    ArtifactHost,
    RangeNotSatisfiable,
    etag_matches,
    parse_range,
)
from .guard import RequestGuard
from .http_io import (
    BODY_TIMEOUT_S,
    ClientGone,
    EventStreamResponse,
    FileStreamResponse,
    RequestLog,
    internal_error,
    read_json_body,
    unless_disconnected,
)
from .metrics import metrics_registry
from .openapi import protocol_schemas
from .request_schemas import Served
from .shutdown import GracefulServer, Shutdown

__all__ = ["GracefulServer", "ModelPool", "Shutdown", "create_app"]

log = logging.getLogger("wick.server")
STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES = 4 << 20


# ---------------------------------------------------------------------------------------------
# Server-side errors (the engine's own errors pass through unchanged)


class ServiceUnavailableError(WickError):
    default_status = 503
    default_type = "service_unavailable"
    default_code = "model_loading"


class AuthenticationError(WickError):
    default_status = 401
    default_type = "invalid_request_error"
    default_code = "invalid_api_key"


class UnsupportedMediaTypeError(InvalidRequestError):
    default_status = 415
    default_code = "unsupported_media_type"


def error_response(err: WickError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.to_dict(), status_code=err.status, headers=headers)


# ---------------------------------------------------------------------------------------------
# The served models


Loader = Callable[[], AsyncEngineAPI]


@dataclass
class ModelPool:
    """The engines this server answers with, by name; ``load()`` builds them in order.

    ``state`` is ``loading`` -> ``ready`` (every loader done) or ``failed`` (one raised). A
    model serves as soon as it is loaded. Names: the engine's ``model_id`` (``/v1/models``),
    also ``model_id-quantization`` and the name it was loaded by; a request without ``model``
    gets the first model.
    """

    loaders: Sequence[tuple[str, Loader]] = ()  # (label for logs, loader)
    on_loaded: Callable[[str, AsyncEngineAPI], None] | None = None
    on_failed: Callable[[BaseException], None] | None = None
    state: str = "loading"
    loading: str | None = None  # label of the model being loaded
    error: str | None = None
    engines: dict[str, AsyncEngineAPI] = field(default_factory=dict)  # listed name -> engine
    _aliases: dict[str, str] = field(default_factory=dict)  # any accepted name -> listed name
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, *engines: AsyncEngineAPI) -> ModelPool:
        """A pool of engines that are already loaded."""
        pool = cls(state="ready")
        for engine in engines:
            pool.add(engine)
        return pool

    def add(self, engine: AsyncEngineAPI) -> str:
        info = engine.core.info
        full = f"{info.model_id}-{info.quantization}"
        name = info.model_id if info.model_id not in self._aliases else full
        if name in self._aliases:
            raise ValueError(f"model {full} is served twice")
        self.engines[name] = engine
        for alias in (name, full):
            self._aliases.setdefault(alias, name)
        return name

    async def load(self) -> None:
        try:
            for label, loader in self.loaders:
                self.loading = label
                engine = await _in_daemon_thread(loader)
                name = self.add(engine)
                # the name it was served by works too (wick serve hf://ORG/REPO: the model id
                # is ORG/REPO, as vLLM lists it; a client may send either)
                self._aliases.setdefault(label, name)
                if self.on_loaded is not None:
                    self.on_loaded(name, engine)
            self.state, self.loading = "ready", None
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"
            log.error("loading %s failed: %s", self.loading, self.error)
            if self.on_failed is not None:
                self.on_failed(e)

    def select(self, model: Any) -> AsyncEngineAPI:
        """The engine a request's ``model`` field names (a non-string goes to the first engine,
        whose validation rejects it)."""
        if isinstance(model, str):
            name = self._aliases.get(model)
            if name is not None:
                return self.engines[name]
        elif self.engines:
            return next(iter(self.engines.values()))
        if self.state == "loading":
            raise ServiceUnavailableError(
                f"wick is still loading {self.loading or 'its models'}; retry once GET /health "
                "answers 200.")
        if self.state == "failed":
            raise ServiceUnavailableError(f"loading the model failed: {self.error}",
                                          code="model_load_failed")
        if model is None:
            raise ServiceUnavailableError("no model is loaded", code="model_loading")
        raise ModelNotFoundError(model, self.engines)

    def cores(self) -> list[tuple[str, str | None, Any]]:
        """``(served name, replica, engine core)`` per engine (replica None: in-process)."""
        return [(name, None, e.core) for name, e in self.engines.items()]

    def replicas(self) -> dict[str, Any] | None:
        """Per replica, what /health says of it (None: no replicas, the engines run here)."""
        return None

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()


def engine_health(core: Any) -> dict[str, Any]:
    """What /health says of an engine core (of each replica's too, under --replicas)."""
    return {"requests": core.num_unfinished(), "kv_pages": core.kv.num_pages,
            "kv_pages_free": core.kv.free_pages, "kv_pages_cached": core.kv.cached_pages,
            "speculation": core.stats.speculation(),
            # what a request leaving sampling fields unset gets, and why
            "sampling_defaults": core.info.sampling_defaults}


async def _in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a daemon thread (a compile must not keep Ctrl-C from exiting)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the server stopped (its loop closed) while this was loading
            pass

    threading.Thread(target=run, name="wick-load", daemon=True).start()
    return await future


# ---------------------------------------------------------------------------------------------
# The app


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
    artifacts = artifacts or ArtifactHost()
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
    app.state.artifacts = artifacts
    app.state.shutdown = shutdown
    extra = protocol_schemas()[1]  # the routes' parts; openapi() fills in the served models'

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                  api_key.encode()):
            raise AuthenticationError(
                "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'."
                if given else "You didn't provide an API key. Send it as "
                              "'Authorization: Bearer <key>'.")

    async def check_json(request: Request) -> None:
        """JSON routes take JSON only: a page on another site can send a form or text/plain
        without asking (no CORS preflight), but not application/json."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise UnsupportedMediaTypeError(
                f"The request's Content-Type is {media or 'missing'!r}; send the JSON body "
                "with 'Content-Type: application/json'.", param="Content-Type")

    v1 = [Depends(check_key)]  # every route but /health and the chat page's static files
    v1_json = [Depends(check_key), Depends(check_json)]

    async def complete(request: Request, kind: str) -> Response:
        body = await read_json_body(request, max_body_bytes, body_timeout)
        model = body.get("model") if isinstance(body, dict) else None
        engine = pool.select(model)
        request_cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
        if not isinstance(body, dict) or "self" in body:
            request_cls.from_dict(body)  # raises the engine's own error for it
            raise InvalidRequestError("The request body must be a JSON object.")
        stream = body.get("stream") is True
        drop_usage = stream and body.get("stream_options") is None
        if drop_usage:  # ask for usage anyway, for the log line; the client never sees it
            body = {**body, "stream_options": {"include_usage": True}}
        record = RequestLog(kind, engine.core.info.model_id, stream)
        create = engine.chat.completions.create if kind == "chat" else engine.completions.create
        # the engine validates, compiles the request's grammar (a client that leaves
        # meanwhile abandons it), then returns the stream at once or runs to the end
        result = await unless_disconnected(request, create(**body))
        if result is None:
            record.write("client disconnected")
            return Response(status_code=499)  # nobody is listening
        if stream:
            return EventStreamResponse(result, record, drop_usage)
        record.request_id = result.id
        record.prompt_tokens = result.usage.prompt_tokens
        record.completion_tokens = result.usage.completion_tokens
        record.write()
        return JSONResponse(result.to_dict())

    @app.post("/v1/chat/completions", dependencies=v1_json, openapi_extra=extra["chat"],
              operation_id="createChatCompletion")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, "chat")

    @app.post("/v1/completions", dependencies=v1_json, openapi_extra=extra["completion"],
              operation_id="createCompletion")
    async def completions(request: Request) -> Response:
        return await complete(request, "completion")

    @app.post("/v1/embeddings", dependencies=v1_json, openapi_extra=extra["embeddings"],
              operation_id="createEmbedding")
    async def embeddings(request: Request) -> Response:
        body = await read_json_body(request, max_body_bytes, body_timeout)
        engine = pool.select(body.get("model") if isinstance(body, dict) else None)
        record = RequestLog("embeddings", engine.core.info.model_id, False)
        result = await unless_disconnected(request, engine.embeddings.create(
            **body) if isinstance(body, dict) and "self" not in body
            else _refuse_body(engine, body))
        if result is None:
            record.write("client disconnected")
            return Response(status_code=499)
        record.prompt_tokens = result.usage.prompt_tokens
        record.write()
        return JSONResponse(result.to_dict())

    async def token_route(request: Request, work: str) -> JSONResponse:
        body = await read_json_body(request, max_body_bytes, body_timeout)
        engine = pool.select(body.get("model") if isinstance(body, dict) else None)
        fn = engine.tokenize if work == "tokenize" else engine.detokenize
        return JSONResponse(await engine.prepare_off_loop(lambda: fn(body)))

    @app.post("/tokenize", dependencies=v1_json, openapi_extra=extra["tokenize"],
              operation_id="tokenize")
    async def tokenize(request: Request) -> Response:
        """The prompt's token ids as the engine would prefill them (a wick extension, as
        vLLM's and llama.cpp's servers have)."""
        return await token_route(request, "tokenize")

    @app.post("/detokenize", dependencies=v1_json, openapi_extra=extra["detokenize"],
              operation_id="detokenize")
    async def detokenize(request: Request) -> Response:
        """Token ids back to text, special tokens as written (a wick extension)."""
        return await token_route(request, "detokenize")

    def model_object(name: str) -> dict[str, Any]:
        info = pool.engines[name].core.info
        # (wick's fields beside OpenAI's: the task, and the sampling a request leaving its
        # fields unset gets and an interactive chat should send; engine/sampling_defaults.py)
        return {"id": name, "object": "model", "created": pool.created, "owned_by": "wick",
                "task": info.task, "sampling_defaults": info.sampling_defaults,
                "chat_sampling": chat_values(info.sampling_defaults)}

    @app.get("/v1/models", dependencies=v1, operation_id="listModels",
             responses={k: v for k, v in extra["errors"].items() if k == "401"})
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_object(n) for n in pool.engines]}

    @app.get("/v1/models/{model:path}", dependencies=v1, operation_id="retrieveModel",
             responses={k: v for k, v in extra["errors"].items() if k in ("401", "404")})
    async def retrieve_model(model: str) -> dict[str, Any]:
        if model not in pool.engines:
            raise ModelNotFoundError(model, pool.engines)
        return model_object(model)

    @app.get("/health", operation_id="health",
             responses={"503": {"description": "loading, or loading failed"}})
    async def health() -> JSONResponse:
        """Loading state, and per model the requests in flight, the KV pool (``free`` +
        ``cached`` == ``pages`` when idle: a leak would show here) and speculation's counts
        (drafted and accepted tokens, tokens per verify step)."""
        body: dict[str, Any] = {"status": "ok" if pool.state == "ready" else pool.state,
                                "models": list(pool.engines)}
        body["engines"] = {name: engine_health(e.core) for name, e in pool.engines.items()}
        replicas = pool.replicas()
        if replicas is not None:
            body["replicas"] = replicas
        if pool.loading:
            body["loading"] = pool.loading
        if pool.error:
            body["error"] = pool.error
        return JSONResponse(body, status_code=200 if pool.state == "ready" else 503)

    registry = metrics_registry(pool.cores)

    @app.get("/metrics", operation_id="metrics", dependencies=v1, response_class=Response,
             responses={"200": {"description": "Prometheus text format",
                                "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
    async def metrics(request: Request) -> Response:
        """Each served model's engine: requests running and waiting, KV-cache use, the
        prefix cache's hit ratio, token and request counters, latency histograms (the names
        vLLM's dashboards and Kubernetes inference gateways read, ``wick:`` for ``vllm:``).
        In the format the scraper's Accept header asks for (Prometheus text or
        OpenMetrics)."""
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), headers={"Content-Type": content_type})

    @app.get("/artifacts/{artifact_id}/{path:path}", operation_id="getArtifactFile",
             dependencies=v1,
             responses={"206": {"description": "a byte range"},
                        "304": {"description": "not modified"},
                        "404": {"description": "no such artifact file"},
                        "416": {"description": "range not satisfiable"}})
    async def artifact_file(artifact_id: str, path: str, request: Request) -> Response:
        return serve_artifact(artifacts, artifact_id, path, request)

    # HEAD wherever GET is (uvicorn sends no body for it), outside the OpenAPI document
    for path, endpoint, deps in (("/artifacts/{artifact_id}/{path:path}", artifact_file, v1),
                                 ("/v1/models", list_models, v1),
                                 ("/v1/models/{model:path}", retrieve_model, v1),
                                 ("/metrics", metrics, v1),
                                 ("/health", health, [])):
        app.add_api_route(path, endpoint, methods=["HEAD"], dependencies=deps,
                          include_in_schema=False)

    # cross-origin isolated (COOP + COEP): the page may share memory with workers, so the
    # browser engine's WebAssembly kernels run on every core (web/src/wasm_executor.ts); the
    # page loads nothing from other origins
    isolation = {"Cross-Origin-Opener-Policy": "same-origin",
                 "Cross-Origin-Embedder-Policy": "require-corp"}
    page_headers = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                               "frame-ancestors 'none'",
                    "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
                    **isolation}

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index() -> Response:
        return FileResponse(STATIC / "index.html", headers=page_headers)

    @app.api_route("/web/models.json", methods=["GET", "HEAD"], dependencies=v1,
                   include_in_schema=False)
    async def web_models() -> JSONResponse:
        """The browser engine's index: artifacts this server hosts, by model and quantization;
        ``preparing``: variants being compiled for browsers (``{model, quantization,
        features, stage, done, total}``, or ``error``); ``served``: the models the server's
        own engines answer for; ``loading``: whether more may come (models still loading)."""
        return JSONResponse({"data": artifacts.artifacts(), "preparing": artifacts.preparing(),
                             "served": list(pool.engines), "loading": pool.state == "loading"},
                            headers={"Cache-Control": "no-cache"})

    # the browser engine's bundles (web/build.mjs writes them to static/web/) also at
    # /static/wick.js and /static/wick-worker.js
    def bundle_route(name: str) -> Callable[[], Response]:
        def serve_bundle() -> Response:
            path = STATIC / "web" / name
            if not path.is_file():
                raise StarletteHTTPException(404, f"{name} is not built: run `bash web/build.sh`")
            # (the worker keeps its page's isolation: COEP of its own)
            extra = {"Cross-Origin-Embedder-Policy": "require-corp"} if name == "wick-worker.js" else {}
            return FileResponse(path, media_type="application/json" if name.endswith(".map")
                                else "text/javascript", headers={"Cache-Control": "no-cache", **extra})
        return serve_bundle

    for bundle in ("wick.js", "wick-worker.js", "wick.js.map", "wick-worker.js.map"):
        app.add_api_route(f"/static/{bundle}", bundle_route(bundle), methods=["GET", "HEAD"],
                          include_in_schema=False)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    documents: dict[Served, dict[str, Any]] = {}  # by what the served models allow

    def openapi() -> dict[str, Any]:
        """The document, with token ids, choices and max_tokens bounded by the served models
        once they are loaded (by the largest, when they differ)."""
        engines = [e.core for e in pool.engines.values()]
        served = Served() if not engines else Served(
            vocab_size=max(c.info.vocab_size for c in engines),
            max_n=min(MAX_N, max(c.scheduler.max_batch_size for c in engines)),
            context_window=max(c.max_total_tokens for c in engines))
        if served not in documents:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components, routes = protocol_schemas(served)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            for path, key in (("/v1/chat/completions", "chat"), ("/v1/completions", "completion"),
                              ("/tokenize", "tokenize"), ("/detokenize", "detokenize"),
                              ("/v1/embeddings", "embeddings")):
                schema["paths"][path]["post"].update(routes[key])
            documents[served] = schema
        return documents[served]

    app.openapi = openapi  # type: ignore[method-assign]

    @app.api_route("/openapi.json", methods=["GET", "HEAD"], dependencies=v1,
                   include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())

    _install_error_handlers(app)
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


async def _refuse_body(engine: AsyncEngineAPI, body: Any) -> None:
    """A body that is not a JSON object of fields: the engine's own error for it."""
    from ..engine.embeddings import EmbeddingRequest

    EmbeddingRequest.from_dict(body if isinstance(body, dict) else None)
    raise InvalidRequestError("The request body must be a JSON object.")


def serve_artifact(host: ArtifactHost, artifact_id: str, path: str, request: Request) -> Response:
    raw = request.scope.get("raw_path") or b""
    found = host.resolve(artifact_id, path, raw)
    if found is None:
        raise StarletteHTTPException(404)
    headers = {"ETag": found.etag, "Cache-Control": found.cache_control,
               "Accept-Ranges": "bytes", "X-Content-Type-Options": "nosniff"}
    inm = request.headers.get("if-none-match")
    if inm is not None and etag_matches(inm, found.etag):
        return Response(status_code=304, headers=headers)
    status, start, length = 200, 0, found.size
    range_header = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if range_header and (if_range is None or if_range.strip() == found.etag):
        try:
            byte_range = parse_range(range_header, found.size)
        except RangeNotSatisfiable:
            err = WickError(f"Range {range_header!r} is outside the file ({found.size} bytes).",
                            type="invalid_request_error", code="range_not_satisfiable",
                            status=416)
            return error_response(err, {**headers, "Content-Range": f"bytes */{found.size}"})
        if byte_range is not None:
            status, start, length = 206, byte_range.start, byte_range.length
            headers["Content-Range"] = f"bytes {start}-{byte_range.end}/{found.size}"
    headers["Content-Length"] = str(length)
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers, media_type=found.content_type)
    return FileStreamResponse(found.chunks(start, length), status_code=status,
                              headers=headers, media_type=found.content_type)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WickError)
    async def wick_error(request: Request, err: WickError) -> JSONResponse:
        if err.status >= 500 and not isinstance(err, ServiceUnavailableError):
            log.error("%s %s failed: %r", request.method, request.url.path, err)
        else:
            log.info("%s %s -> %d %s%s", request.method, request.url.path, err.status, err.code,
                     f" param={err.param}" if err.param else "")
        # (a 503 says "later", whoever raised it: a model loading, an engine shutting down)
        headers = {"Retry-After": "5"} if err.status == 503 else None
        if isinstance(err, AuthenticationError):
            headers = {"WWW-Authenticate": "Bearer"}
        return error_response(err, headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        log.info("%s %s: the client disconnected before sending its request",
                 request.method, request.url.path)
        return Response(status_code=499)  # nobody is listening

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        what = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message, code = f"Unknown request URL: {what}. Please check the URL.", "not_found"
        elif exc.status_code == 405:
            message, code = f"Method not allowed: {what}.", "method_not_allowed"
        else:
            message, code = str(exc.detail), "http_error"
        err = WickError(message, type="invalid_request_error", code=code, status=exc.status_code)
        return error_response(err, dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(InvalidRequestError(
            f"Invalid request: {first.get('msg', 'validation failed')}.", param=param,
            code="invalid_value"))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(internal_error())


def _version() -> str:
    from .. import __version__

    return __version__
