"""The server's routes (pyserver/app.py assembles them into an app): the OpenAI API, the token
routes, models, health, metrics, hosted artifacts, the chat page and the browser engine's
bundles, and the OpenAPI document. Each route reads its server from ``request.app.state``
(``pool``, ``artifacts``, ``settings``, ``metrics``; app.py sets them), so the routes are
plain module-level functions, one router for every app."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import AsyncEngineAPI
from ..engine.errors import InvalidRequestError, ModelNotFoundError, WickError
from ..engine.protocol import MAX_N, ChatCompletionRequest, CompletionRequest
from ..engine.sampling_defaults import chat_values
from .artifact_host import ArtifactHost, RangeNotSatisfiable, etag_matches, parse_range
from .http_errors import AuthenticationError, UnsupportedMediaTypeError, error_response
from .http_io import (
    EventStreamResponse,
    FileStreamResponse,
    RequestLog,
    read_json_body,
    unless_disconnected,
)
from .model_pool import ModelPool, engine_health
from .openapi import protocol_schemas
from .request_schemas import Served

STATIC = Path(__file__).resolve().parent / "static"
EXTRA = protocol_schemas()[1]  # the routes' parts; openapi_document fills in the served models'
ERRORS = EXTRA["errors"]

router = APIRouter()


def pool_of(request: Request) -> ModelPool:
    return request.app.state.pool


# ---------------------------------------------------------------------------------------------
# What a route asks of a request


async def check_key(request: Request) -> None:
    api_key = request.app.state.settings.api_key
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


V1 = [Depends(check_key)]  # every route but /health and the chat page's static files
V1_JSON = [Depends(check_key), Depends(check_json)]


async def json_body(request: Request) -> Any:
    settings = request.app.state.settings
    return await read_json_body(request, settings.max_body_bytes, settings.body_timeout)


# ---------------------------------------------------------------------------------------------
# The OpenAI API and the token routes


async def complete(request: Request, api: str) -> Response:
    body = await json_body(request)
    model = body.get("model") if isinstance(body, dict) else None
    engine = pool_of(request).select(model)
    request_cls = ChatCompletionRequest if api == "chat" else CompletionRequest
    if not isinstance(body, dict) or "self" in body:
        request_cls.from_dict(body)  # raises the engine's own error for it
        raise InvalidRequestError("The request body must be a JSON object.")
    stream = body.get("stream") is True
    drop_usage = stream and body.get("stream_options") is None
    if drop_usage:  # ask for usage anyway, for the log line; the client never sees it
        body = {**body, "stream_options": {"include_usage": True}}
    record = RequestLog(api, engine.core.info.model_id, stream)
    create = engine.chat.completions.create if api == "chat" else engine.completions.create
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


@router.post("/v1/chat/completions", dependencies=V1_JSON, openapi_extra=EXTRA["chat"],
             operation_id="createChatCompletion")
async def chat_completions(request: Request) -> Response:
    return await complete(request, "chat")


@router.post("/v1/completions", dependencies=V1_JSON, openapi_extra=EXTRA["completion"],
             operation_id="createCompletion")
async def completions(request: Request) -> Response:
    return await complete(request, "completion")


@router.post("/v1/embeddings", dependencies=V1_JSON, openapi_extra=EXTRA["embeddings"],
             operation_id="createEmbedding")
async def embeddings(request: Request) -> Response:
    body = await json_body(request)
    engine = pool_of(request).select(body.get("model") if isinstance(body, dict) else None)
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


async def _refuse_body(engine: AsyncEngineAPI, body: Any) -> None:
    """A body that is not a JSON object of fields: the engine's own error for it."""
    from ..engine.embeddings import EmbeddingRequest

    EmbeddingRequest.from_dict(body if isinstance(body, dict) else None)
    raise InvalidRequestError("The request body must be a JSON object.")


async def token_route(request: Request, work: str) -> JSONResponse:
    body = await json_body(request)
    engine = pool_of(request).select(body.get("model") if isinstance(body, dict) else None)
    fn = engine.tokenize if work == "tokenize" else engine.detokenize
    return JSONResponse(await engine.prepare_off_loop(lambda: fn(body)))


@router.post("/tokenize", dependencies=V1_JSON, openapi_extra=EXTRA["tokenize"],
             operation_id="tokenize")
async def tokenize(request: Request) -> Response:
    """The prompt's token ids as the engine would prefill them (a wick extension, as
    vLLM's and llama.cpp's servers have)."""
    return await token_route(request, "tokenize")


@router.post("/detokenize", dependencies=V1_JSON, openapi_extra=EXTRA["detokenize"],
             operation_id="detokenize")
async def detokenize(request: Request) -> Response:
    """Token ids back to text, special tokens as written (a wick extension)."""
    return await token_route(request, "detokenize")


# ---------------------------------------------------------------------------------------------
# Models, health, metrics


def model_object(pool: ModelPool, name: str) -> dict[str, Any]:
    info = pool.engines[name].core.info
    # (wick's fields beside OpenAI's: the task, and the sampling a request leaving its
    # fields unset gets and an interactive chat should send; engine/sampling_defaults.py)
    return {"id": name, "object": "model", "created": pool.created, "owned_by": "wick",
            "task": info.task, "sampling_defaults": info.sampling_defaults,
            "chat_sampling": chat_values(info.sampling_defaults)}


@router.get("/v1/models", dependencies=V1, operation_id="listModels",
            responses={k: v for k, v in ERRORS.items() if k == "401"})
async def list_models(request: Request) -> dict[str, Any]:
    pool = pool_of(request)
    return {"object": "list", "data": [model_object(pool, n) for n in pool.engines]}


@router.get("/v1/models/{model:path}", dependencies=V1, operation_id="retrieveModel",
            responses={k: v for k, v in ERRORS.items() if k in ("401", "404")})
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    pool = pool_of(request)
    if model not in pool.engines:
        raise ModelNotFoundError(model, pool.engines)
    return model_object(pool, model)


@router.get("/health", operation_id="health",
            responses={"503": {"description": "loading, or loading failed"}})
async def health(request: Request) -> JSONResponse:
    """Loading state, and per model the requests in flight, the KV pool (``free`` +
    ``cached`` == ``pages`` when idle: a leak would show here) and speculation's counts
    (drafted and accepted tokens, tokens per verify step)."""
    pool = pool_of(request)
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


@router.get("/metrics", operation_id="metrics", dependencies=V1, response_class=Response,
            responses={"200": {"description": "Prometheus text format",
                               "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    """Each served model's engine: requests running and waiting, KV-cache use, the
    prefix cache's hit ratio, token and request counters, latency histograms (the names
    vLLM's dashboards and Kubernetes inference gateways read, ``wick:`` for ``vllm:``).
    In the format the scraper's Accept header asks for (Prometheus text or
    OpenMetrics)."""
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encode(request.app.state.metrics), headers={"Content-Type": content_type})


# ---------------------------------------------------------------------------------------------
# Hosted artifacts


@router.get("/artifacts/{artifact_id}/{path:path}", operation_id="getArtifactFile",
            dependencies=V1,
            responses={"206": {"description": "a byte range"},
                       "304": {"description": "not modified"},
                       "404": {"description": "no such artifact file"},
                       "416": {"description": "range not satisfiable"}})
async def artifact_file(artifact_id: str, path: str, request: Request) -> Response:
    return serve_artifact(request.app.state.artifacts, artifact_id, path, request)


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


# HEAD wherever GET is (uvicorn sends no body for it), outside the OpenAPI document
for _path, _endpoint, _deps in (("/artifacts/{artifact_id}/{path:path}", artifact_file, V1),
                                ("/v1/models", list_models, V1),
                                ("/v1/models/{model:path}", retrieve_model, V1),
                                ("/metrics", metrics, V1),
                                ("/health", health, [])):
    router.add_api_route(_path, _endpoint, methods=["HEAD"], dependencies=_deps,
                         include_in_schema=False)


# ---------------------------------------------------------------------------------------------
# The chat page and the browser engine

# cross-origin isolated (COOP + COEP): the page may share memory with workers, so the
# browser engine's WebAssembly kernels run on every core (web/src/wasm_executor.ts); the
# page loads nothing from other origins
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin",
             "Cross-Origin-Embedder-Policy": "require-corp"}
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                           "frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache", **ISOLATION}


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def index() -> Response:
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)


@router.api_route("/web/models.json", methods=["GET", "HEAD"], dependencies=V1,
                  include_in_schema=False)
async def web_models(request: Request) -> JSONResponse:
    """The browser engine's index: artifacts this server hosts, by model and quantization;
    ``preparing``: variants being compiled for browsers (``{model, quantization,
    features, stage, done, total}``, or ``error``); ``served``: the models the server's
    own engines answer for; ``loading``: whether more may come (models still loading)."""
    pool, artifacts = pool_of(request), request.app.state.artifacts
    return JSONResponse({"data": artifacts.artifacts(), "preparing": artifacts.preparing(),
                         "served": list(pool.engines), "loading": pool.state == "loading"},
                        headers={"Cache-Control": "no-cache"})


def bundle_route(name: str):
    """The browser engine's bundles (web/build.mjs writes them to static/web/), also at
    /static/wick.js and /static/wick-worker.js."""
    def serve_bundle() -> Response:
        path = STATIC / "web" / name
        if not path.is_file():
            raise StarletteHTTPException(404, f"{name} is not built: run `bash web/build.sh`")
        # (the worker keeps its page's isolation: COEP of its own)
        extra = {"Cross-Origin-Embedder-Policy": "require-corp"} if name == "wick-worker.js" else {}
        return FileResponse(path, media_type="application/json" if name.endswith(".map")
                            else "text/javascript", headers={"Cache-Control": "no-cache", **extra})
    return serve_bundle


for _bundle in ("wick.js", "wick-worker.js", "wick.js.map", "wick-worker.js.map"):
    router.add_api_route(f"/static/{_bundle}", bundle_route(_bundle), methods=["GET", "HEAD"],
                         include_in_schema=False)


# ---------------------------------------------------------------------------------------------
# The OpenAPI document


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The document, with token ids, choices and max_tokens bounded by the served models
    once they are loaded (by the largest, when they differ); one per bound, kept."""
    engines = [e.core for e in app.state.pool.engines.values()]
    served = Served() if not engines else Served(
        vocab_size=max(c.info.vocab_size for c in engines),
        max_n=min(MAX_N, max(c.scheduler.max_batch_size for c in engines)),
        context_window=max(c.max_total_tokens for c in engines))
    documents = app.state.openapi_documents
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


@router.api_route("/openapi.json", methods=["GET", "HEAD"], dependencies=V1,
                  include_in_schema=False)
async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())
