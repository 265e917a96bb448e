"""Request bodies in, completions and event streams out: reading a JSON body within limits (size,
time) and parsing it off the event loop; server-sent events that end in ``data: [DONE]``;
a non-streaming request cancelled when its client goes away; one log line per request."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from ..engine.errors import InvalidRequestError, WickError

log = logging.getLogger("wick.server")
BODY_TIMEOUT_S = 60.0  # a whole request body must arrive within this ...
BODY_IDLE_S = 15.0  # ... and never pause longer than this


class RequestTooLargeError(InvalidRequestError):
    default_status = 413
    default_code = "request_too_large"


class RequestTimeoutError(InvalidRequestError):
    default_status = 408
    default_code = "request_timeout"


class ClientGone(Exception):
    """The client closed its connection before its request was read: nobody to answer."""




async def read_json_body(request: Request, limit: int, timeout: float = BODY_TIMEOUT_S,
                         idle: float = BODY_IDLE_S) -> Any:
    """The request body parsed as JSON (on a worker thread: a large body must not stall the
    event loop). Too large -> 413, too slow -> 408, malformed -> 400, all OpenAI-shaped; a
    client that disconnects meanwhile -> ``ClientGone``."""
    too_large = RequestTooLargeError(f"The request body exceeds the limit of {limit} bytes.")
    length = request.headers.get("content-length")
    if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
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


# A surrogate escape (\ud800-\udfff) in the raw body: only then can a string hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json_body(raw: bytes) -> Any:
    """JSON -> Python, or an ``invalid_json`` error that says what is wrong with it."""
    try:
        body = json.loads(raw)
        # lone surrogates ("\ud800") parse but are not text: reject them here, as bad JSON.
        # Encoding the whole body again holds the GIL as long as parsing it (0.2 s for 4 MB,
        # while every stream waits), so only where the raw text has such an escape.
        # (json.loads also takes UTF-16/32 and raw surrogate bytes: those bodies always)
        if not raw.isascii() or b"\x00" in raw or _SURROGATE_ESCAPE.search(raw):
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
            await event(json.dumps(internal_error().to_dict()))
            outcome = "error internal"
        else:
            outcome = "ok"
        await event("[DONE]")  # every stream ends so, an error event before it or not
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return outcome


async def unless_disconnected(request: Request, work: Any) -> Any:
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


class FileStreamResponse(StreamingResponse):
    """A file's bytes from a blocking iterator (read on worker threads), closed as soon as the
    response ends in any way (a client gone or dropped included), not when the garbage
    collector gets to it."""

    def __init__(self, chunks: Iterator[bytes], **kwargs: Any) -> None:
        super().__init__(_read_off_loop(chunks), **kwargs)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _read_off_loop(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    try:
        while (chunk := await anyio.to_thread.run_sync(next, chunks, None)) is not None:
            yield chunk
    finally:
        close = getattr(chunks, "close", None)  # a generator holding the open file
        if close is not None:
            close()


def internal_error() -> WickError:
    return WickError("The server had an error while processing your request.",
                     type="server_error", code="internal_error", status=500)
