"""The server's own errors (a bad key, a body that is not JSON) and how every error becomes an
OpenAI error body (the engine's errors pass through unchanged)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.errors import InvalidRequestError, WickError
from .http_io import ClientGone, internal_error
from .model_pool import ServiceUnavailableError

log = logging.getLogger("wick.server")


class AuthenticationError(WickError):
    default_status = 401
    default_type = "invalid_request_error"
    default_code = "invalid_api_key"


class UnsupportedMediaTypeError(InvalidRequestError):
    default_status = 415
    default_code = "unsupported_media_type"


def error_response(err: WickError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.to_dict(), status_code=err.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-shaped error bodies for every failure: wick's own errors with their status, a
    client gone (499), an unknown route or method, a bad parameter, and anything unexpected
    (a generic 500; the traceback goes to the log)."""

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
