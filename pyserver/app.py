"""The OpenAI-compatible REST server (FastAPI) over one or more ``AsyncEngine``s.

    POST /v1/chat/completions    JSON, or SSE with ``stream: true`` (``data: {...}`` ... ``[DONE]``)
    POST /v1/completions
    GET  /v1/models, /v1/models/{model}
    GET  /health                 503 while the models load, 200 once they serve
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
(and never stall longer than ``BODY_IDLE_S``); parsing and request preparation run off the
event loop. On shutdown (``Shutdown``) running requests get a grace period, then end with an
error (streams: an error event, then ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from ..engine import AsyncEngineAPI
from ..engine.errors import InvalidRequestError, ModelNotFoundError, WickError
from ..engine.protocol import (
    INT32_MAX,
    MAX_N,
    ChatCompletion,
    ChatCompletionChunk,
    ROLES,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
)
from .artifact_host import (
    ArtifactHost,
    RangeNotSatisfiable,
    etag_matches,
    parse_range,
)
from .guard import RequestGuard

log = logging.getLogger("wick.server")
STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES = 4 << 20
BODY_TIMEOUT_S = 60.0  # a whole request body must arrive within this ...
BODY_IDLE_S = 15.0  # ... and never pause longer than this


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


class RequestTooLargeError(InvalidRequestError):
    default_status = 413
    default_code = "request_too_large"


class RequestTimeoutError(InvalidRequestError):
    default_status = 408
    default_code = "request_timeout"


class UnsupportedMediaTypeError(InvalidRequestError):
    default_status = 415
    default_code = "unsupported_media_type"


class ClientGone(Exception):
    """The client closed its connection before its request was read: nobody to answer."""


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


def error_response(err: WickError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.to_dict(), status_code=err.status, headers=headers)


def GracefulServer(app: FastAPI, shutdown: Shutdown, grace: float,  # noqa: N802
                   log_level: str = "info") -> Any:
    """A uvicorn server that tells the app when shutdown begins (``Shutdown.begin``): running
    requests get ``grace`` seconds, then an error; uvicorn's own deadline comes 5 s later."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            shutdown.begin(grace)
            await super().shutdown(sockets)

    return _Server(uvicorn.Config(app, log_level=log_level, access_log=False, log_config=None,
                                  timeout_graceful_shutdown=grace + 5))


# ---------------------------------------------------------------------------------------------
# The served models


Loader = Callable[[], AsyncEngineAPI]


@dataclass
class ModelPool:
    """The engines this server answers with, by name; ``load()`` builds them in order.

    ``state`` is ``loading`` -> ``ready`` (every loader done) or ``failed`` (one raised). A
    model serves as soon as it is loaded. Names: the engine's ``model_id`` (``/v1/models``),
    also ``model_id-quantization``; a request without ``model`` gets the first model.
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

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()


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
# OpenAPI: schemas generated from the engine's protocol dataclasses


def _protocol_schemas() -> tuple[dict[str, dict], dict[str, Any]]:
    """(component schemas, per-route ``openapi_extra``), all from ``wick.engine.protocol``."""
    components: dict[str, dict] = {}

    def ref(cls: type, required: Sequence[str] = ()) -> dict[str, str]:
        schema = TypeAdapter(cls).json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        if required:  # a request: from_dict requires these, and rejects unknown fields
            schema["required"] = sorted(set(schema.get("required", [])) | set(required))
            schema["additionalProperties"] = False
        components[cls.__name__] = schema
        return {"$ref": f"#/components/schemas/{cls.__name__}"}

    error = {"$ref": "#/components/schemas/Error"}
    components["Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
    }
    errors = {str(s): {"description": d, "content": {"application/json": {"schema": error}}}
              for s, d in ((400, "invalid request"), (401, "missing or wrong API key"),
                           (403, "a foreign Host or Origin"), (404, "unknown model"),
                           (408, "the body did not arrive in time"),
                           (413, "request body too large"),
                           (415, "Content-Type is not application/json"),
                           (503, "models still loading, or shutting down"))}

    def route(request: type, required: str, response: type, chunk: type,
              example: dict[str, Any]) -> dict[str, Any]:
        return {
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": ref(request, [required]), "example": example}}},
            "responses": {"200": {"description": "the completion, or with stream: true an SSE "
                                                 "stream of chunks ending in data: [DONE]",
                                  "content": {"application/json": {"schema": ref(response)},
                                              "text/event-stream": {"schema": ref(chunk)}}},
                          **errors},
        }

    extras = {
        "chat": route(ChatCompletionRequest, "messages", ChatCompletion, ChatCompletionChunk,
                      {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}),
        "completion": route(CompletionRequest, "prompt", Completion, Completion,
                            {"prompt": "Once upon a time", "max_tokens": 16}),
        "errors": errors,
    }
    # the dataclass types role as str; its values are the protocol's ROLES
    components["ChatMessage"]["properties"]["role"]["enum"] = list(ROLES)
    _add_value_rules(components)
    return components, extras


def _add_value_rules(components: dict[str, dict]) -> None:
    """The value rules the dataclasses' ``__post_init__`` enforce, which their types cannot
    say: the schema accepts what the server accepts and refuses what it refuses."""
    ranges = {"max_tokens": {"minimum": 1, "maximum": INT32_MAX},
              "temperature": {"minimum": 0, "maximum": 2},
              "top_p": {"exclusiveMinimum": 0, "maximum": 1},
              "top_k": {"minimum": 0, "maximum": INT32_MAX},
              "n": {"minimum": 1, "maximum": MAX_N}}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = components[name]["properties"]
        for field_name, rule in ranges.items():
            for option in props[field_name].get("anyOf", [props[field_name]]):
                if option.get("type") in ("integer", "number"):
                    option.update(rule)
    components["ChatCompletionRequest"]["properties"]["messages"]["minItems"] = 1
    tokens = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    components["CompletionRequest"]["properties"]["prompt"] = {
        "anyOf": [{"type": "string", "minLength": 1}, tokens,
                  {"type": "array", "minItems": 1, "maxItems": 1,  # a batch of one: unwrapped
                   "items": {"anyOf": [{"type": "string", "minLength": 1}, tokens]}}],
        "description": "a string, token ids, or a list of one of either"}


# ---------------------------------------------------------------------------------------------
# Request bodies and streaming


async def read_json_body(request: Request, limit: int, timeout: float = BODY_TIMEOUT_S,
                         idle: float = BODY_IDLE_S) -> Any:
    """The request body parsed as JSON (on a worker thread: a large body must not stall the
    event loop). Too large -> 413, too slow -> 408, malformed -> 400, all OpenAI-shaped; a
    client that disconnects meanwhile -> ``ClientGone``."""
    too_large = RequestTooLargeError(f"The request body exceeds the limit of {limit} bytes.")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    deadline = time.monotonic() + timeout
    stream = request.stream().__aiter__()
    while True:
        wait = min(idle, deadline - time.monotonic())
        try:
            with anyio.fail_after(max(wait, 0)):
                chunk = await stream.__anext__()
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise RequestTimeoutError(
                f"The request body did not arrive in time (at most {timeout:.0f} s in all, "
                f"and no pause over {idle:.0f} s).") from None
        except ClientDisconnect:
            raise ClientGone from None
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return await anyio.to_thread.run_sync(parse_json_body, b"".join(chunks))


def parse_json_body(raw: bytes) -> Any:
    """JSON -> Python, or an ``invalid_json`` error that says what is wrong with it."""
    try:
        body = json.loads(raw)
        # lone surrogates ("\ud800") parse but are not text: reject them here, as bad JSON
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return body
    except json.JSONDecodeError as e:
        detail = f"{e.msg} at line {e.lineno} column {e.colno}"
    except UnicodeDecodeError:
        detail = "it is not valid UTF-8"
    except UnicodeEncodeError:
        detail = "a string holds a lone surrogate escape (such as \\ud800), which is not text"
    except RecursionError:
        detail = "it is nested too deeply"
    except ValueError as e:  # int() refuses numbers of more than sys.get_int_max_str_digits()
        detail = ("a number in it has too many digits" if "digits" in str(e)
                  else str(e).split("\n")[0])
    raise InvalidRequestError(
        f"We could not parse the JSON body of your request ({detail}). The OpenAI API expects "
        "a JSON payload.", code="invalid_json")


@dataclass(slots=True)
class RequestLog:
    """One log line per completion request."""

    route: str
    model: str
    stream: bool
    started: float = field(default_factory=time.perf_counter)
    request_id: str = "-"
    first_token: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def chunk(self, chunk: Any) -> None:
        self.request_id = chunk.id
        if self.first_token is None and any(_chunk_text(c) for c in chunk.choices):
            self.first_token = time.perf_counter()
        if chunk.usage is not None:
            self.prompt_tokens = chunk.usage.prompt_tokens
            self.completion_tokens = chunk.usage.completion_tokens

    def write(self, outcome: str = "ok") -> None:
        elapsed = time.perf_counter() - self.started
        ttft = f"{self.first_token - self.started:.3f}s" if self.first_token else "-"
        done = self.completion_tokens
        rate = f"{done / elapsed:.1f}" if done and elapsed > 0 else "-"
        log.info("%s %s model=%s prompt=%s completion=%s ttft=%s tok/s=%s time=%.3fs %s%s",
                 self.route, self.request_id, self.model, _dash(self.prompt_tokens), _dash(done),
                 ttft, rate, elapsed, "stream " if self.stream else "", outcome)


def _chunk_text(choice: Any) -> str | None:
    delta = getattr(choice, "delta", None)
    return delta.content if delta is not None else choice.text


def _dash(v: int | None) -> str:
    return "-" if v is None else str(v)


class EventStreamResponse(StreamingResponse):
    """Engine chunks as server-sent events, ending with ``data: [DONE]``.

    It watches for the client's disconnect while it waits on the engine, and always closes the
    engine stream at the end, which aborts an unfinished request (pages freed next step).
    """

    def __init__(self, chunks: Any, record: RequestLog, drop_usage: bool) -> None:
        super().__init__(chunks, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.record = record
        self.drop_usage = drop_usage  # usage was asked for the log only

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks, outcome = self.body_iterator, "client disconnected"
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch_disconnect)
            try:
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})
                outcome = await self._stream(chunks, send)
            except OSError:  # the client went away while we were sending
                pass
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await chunks.aclose()
                    self.record.write(outcome)

    async def _stream(self, chunks: AsyncIterator[Any], send: Any) -> str:
        async def event(data: str) -> None:
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(),
                        "more_body": True})

        try:
            async for chunk in chunks:
                self.record.chunk(chunk)
                if self.drop_usage and chunk.usage is not None and not chunk.choices:
                    continue
                await event(json.dumps(chunk.to_dict(), ensure_ascii=False))
        except WickError as e:  # the engine failed mid-stream: say so in OpenAI's way
            await event(json.dumps(e.to_dict()))
            outcome = f"error {e.code}"
        except Exception:
            log.exception("stream %s failed", self.record.request_id)
            await event(json.dumps(_internal_error().to_dict()))
            outcome = "error internal"
        else:
            outcome = "ok"
        await event("[DONE]")  # every stream ends so, an error event before it or not
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return outcome


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """Await ``work``; cancel it (aborting its engine request) if the client goes away first,
    and return None then. The body has been read, so ``receive`` only reports the disconnect."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return None


def _internal_error() -> WickError:
    return WickError("The server had an error while processing your request.",
                     type="server_error", code="internal_error", status=500)


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
    components, extra = _protocol_schemas()

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
        if stream:  # create() validates, then returns the stream at once
            return EventStreamResponse(await create(**body), record, drop_usage)
        result = await _unless_disconnected(request, create(**body))  # the engine validates
        if result is None:
            record.write("client disconnected")
            return Response(status_code=499)  # nobody is listening
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

    def model_object(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": pool.created, "owned_by": "wick"}

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
        """Loading state, and per model the requests in flight and the KV pool (``free`` ==
        ``pages`` when idle: a leak would show here)."""
        body: dict[str, Any] = {"status": "ok" if pool.state == "ready" else pool.state,
                                "models": list(pool.engines)}
        body["engines"] = {name: {"requests": e.core.num_unfinished(),
                                  "kv_pages": e.core.kv.num_pages,
                                  "kv_pages_free": e.core.kv.free_pages}
                           for name, e in pool.engines.items()}
        if pool.loading:
            body["loading"] = pool.loading
        if pool.error:
            body["error"] = pool.error
        return JSONResponse(body, status_code=200 if pool.state == "ready" else 503)

    @app.get("/artifacts/{artifact_id}/{path:path}", operation_id="getArtifactFile",
             dependencies=v1,
             responses={"206": {"description": "a byte range"},
                        "304": {"description": "not modified"},
                        "404": {"description": "no such artifact file"},
                        "416": {"description": "range not satisfiable"}})
    async def artifact_file(artifact_id: str, path: str, request: Request) -> Response:
        return serve_artifact(artifacts, artifact_id, path, request)

    app.add_api_route("/artifacts/{artifact_id}/{path:path}", artifact_file, methods=["HEAD"],
                      dependencies=v1, include_in_schema=False)

    page_headers = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                               "frame-ancestors 'none'",
                    "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return FileResponse(STATIC / "index.html", headers=page_headers)

    @app.get("/web/models.json", dependencies=v1, include_in_schema=False)
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
            return FileResponse(path, media_type="application/json" if name.endswith(".map")
                                else "text/javascript", headers={"Cache-Control": "no-cache"})
        return serve_bundle

    for bundle in ("wick.js", "wick-worker.js", "wick.js.map", "wick-worker.js.map"):
        app.add_api_route(f"/static/{bundle}", bundle_route(bundle), methods=["GET"],
                          include_in_schema=False)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", dependencies=v1, include_in_schema=False)
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
    return StreamingResponse(found.chunks(start, length), status_code=status,
                             headers=headers, media_type=found.content_type)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WickError)
    async def wick_error(request: Request, err: WickError) -> JSONResponse:
        if err.status >= 500 and not isinstance(err, ServiceUnavailableError):
            log.error("%s %s failed: %r", request.method, request.url.path, err)
        else:
            log.info("%s %s -> %d %s%s", request.method, request.url.path, err.status, err.code,
                     f" param={err.param}" if err.param else "")
        headers = {"Retry-After": "5"} if isinstance(err, ServiceUnavailableError) else None
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
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(_internal_error())


def _version() -> str:
    from .. import __version__

    return __version__
