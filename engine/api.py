"""The user API over one engine core, OpenAI-shaped: sync ``EngineAPI`` and async
``AsyncEngineAPI``, each with ``.chat.completions.create(...)``, ``.completions.create(...)`` and
``.embeddings.create(...)``.

Each endpoint is a file of its own (engine/endpoint.py says what one is): it prepares its
requests and renders the core's outputs as its stream of chunks; ``stream=False`` returns that
stream folded into one reply. The facades here run the steps and hand each stream its outputs.
Requests are validated (and rejected with typed errors) inside ``create`` itself, before any
step runs, also when streaming.

The sync facade drives ``core.step()`` from whichever call is waiting for output; outputs for
other requests are kept for them, so several sync streams may be interleaved. The async facade
runs ONE step loop task per event loop (``core.step_async()``): concurrent requests share steps.
It never uses threads (Pyodide has none): a runner's ``async def step_async(batch)`` is awaited
when present, else its ``step(batch)`` is called directly, and the loop yields to other tasks
between steps.

A stream that is closed, dropped or cancelled before its end aborts its request; the core frees
its pages at the next step.

Preparing a request (validation, chat template, tokenization) touches no engine state, so a host
with threads may run it off its event loop (``AsyncEngineAPI.prepare_off_loop``): a huge body
then never stalls running streams.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from .core import EngineCore, SequenceOutput, StepRunner
from .embeddings import EmbeddingsEndpoint
from .endpoint import Endpoint, Submitted
from .errors import EngineAbortedError, WickError
from .grammar import CompiledGrammar, GrammarSpec, check_opens, check_opens_async
from .logprob_text import TokenTexts
from .model_info import ModelInfo
from .serve_chat import ChatEndpoint
from .serve_completion import CompletionEndpoint
from .serve_tokenize import detokenize, tokenize
from .tokenizer import Tokenizer

T = TypeVar("T")


class _Frontend:
    """What both facades share: the core and its endpoints."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.token_texts = TokenTexts(core)
        self.endpoints: dict[str, Endpoint] = {
            "chat": ChatEndpoint(core, self.token_texts),
            "completion": CompletionEndpoint(core, self.token_texts),
            "embeddings": EmbeddingsEndpoint(core, self.token_texts),
        }

    @property
    def model(self) -> str:
        return self.core.info.model_id

    @property
    def stats(self):  # EngineStats
        return self.core.stats

    def tokenize(self, body: Any) -> dict[str, Any]:
        return tokenize(self.endpoints["chat"], self.endpoints["completion"], body)

    def detokenize(self, body: Any) -> dict[str, Any]:
        return detokenize(self.endpoints["chat"], body)

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        compile_now = getattr(self.core.grammar, "compile", None)
        if compile_now is None:  # the browser's wasm xgrammar answers with promises
            raise WickError("this engine's grammar backend compiles asynchronously (use "
                            "AsyncEngineAPI)", code="runner_contract")
        return compile_now(spec)


class _Namespace:
    """``api.completions`` / ``api.embeddings``: a ``create`` bound to one endpoint."""

    def __init__(self, create: Callable[..., Any]) -> None:
        self.create = create


class _ChatNamespace:
    def __init__(self, create: Callable[..., Any]) -> None:
        self.completions = _Namespace(create)


# ---------------------------------------------------------------------------------------------
# Sync


class ChunkStream(Generic[T]):
    """An iterator of chunks that aborts its request when closed or dropped before the end."""

    def __init__(self, chunks: Iterator[T], on_close: Callable[[], None]) -> None:
        self._chunks = chunks
        self._on_close: Callable[[], None] | None = on_close

    def __iter__(self) -> ChunkStream[T]:
        return self

    def __next__(self) -> T:
        return next(self._chunks)

    def close(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            try:
                self._chunks.close()  # type: ignore[attr-defined]
            finally:
                on_close()

    def __enter__(self) -> ChunkStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class EngineAPI(_Frontend):
    """Sync facade: ``api.chat.completions.create(messages=[...], stream=...)``."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        self._inbox: dict[str, deque[SequenceOutput]] = {}
        self.chat = _ChatNamespace(lambda **kwargs: self._create("chat", kwargs))
        self.completions = _Namespace(lambda **kwargs: self._create("completion", kwargs))
        self.embeddings = _Namespace(lambda **kwargs: self._create("embeddings", kwargs))

    @classmethod
    def from_runner(cls, runner: StepRunner, tokenizer: Tokenizer, info: ModelInfo, *,
                    num_pages: int, **core_options: Any) -> EngineAPI:
        return cls(EngineCore(runner, tokenizer, info, num_pages=num_pages, **core_options))

    def _create(self, name: str, kwargs: dict[str, Any]) -> Any:
        endpoint = self.endpoints[name]
        prep = endpoint.prepare(kwargs)
        answered = endpoint.without_model(prep)
        if answered is not None:
            sub, chunks = answered
            return ChunkStream(iter(chunks), lambda: None) if sub.stream else endpoint.fold(
                sub, chunks)
        if prep.grammar_spec is not None:
            prep.grammar = self._compile(prep.grammar_spec)
            check_opens(prep.grammar, prep.grammar_spec)
        sub = endpoint.submit(prep)
        for rid in sub.request_ids:
            self._inbox[rid] = deque()
        if sub.stream:
            return ChunkStream(self._chunks(endpoint, sub), lambda: self._release(sub))
        try:
            return endpoint.fold(sub, list(self._chunks(endpoint, sub)))
        finally:
            self._release(sub)

    def _chunks(self, endpoint: Endpoint, sub: Submitted) -> Iterator[Any]:
        yield from endpoint.opening(sub)
        while (rid := endpoint.waiting_on(sub)) is not None:
            yield from endpoint.on_output(sub, self._next_output(rid))
        yield from endpoint.closing(sub)

    def _next_output(self, rid: str) -> SequenceOutput:
        inbox = self._inbox[rid]
        while not inbox:
            if not self.core.has_unfinished():
                raise EngineAbortedError(f"request {rid} is no longer in the engine")
            self._pump()
        return inbox.popleft()

    def _pump(self) -> None:
        try:
            outputs = self.core.step()
        except BaseException:
            # The step failed half-way; nothing in flight can be trusted. Every request ends with
            # "abort" at the next step, and the caller sees the error.
            self.core.abort_all()
            raise
        for out in outputs:
            box = self._inbox.get(out.request_id)
            if box is not None:
                box.append(out)

    def _release(self, sub: Submitted) -> None:
        for rid in sub.request_ids:
            self._inbox.pop(rid, None)
            self.core.abort(rid)  # a no-op once finished


# ---------------------------------------------------------------------------------------------
# Async


class AsyncChunkStream(Generic[T]):
    """An async iterator of chunks that aborts its request when closed, cancelled or dropped."""

    def __init__(self, chunks: AsyncIterator[T], on_close: Callable[[], None]) -> None:
        self._chunks = chunks
        self._on_close: Callable[[], None] | None = on_close

    def __aiter__(self) -> AsyncChunkStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            self._close_now()

    def _close_now(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()

    async def __aenter__(self) -> AsyncChunkStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        try:
            self._close_now()
        except Exception:  # the event loop may be gone already; the request is over anyway
            pass


class AsyncEngineAPI(_Frontend):
    """Async facade: ``await api.chat.completions.create(...)``; with ``stream=True``,
    ``async for chunk in await api.chat.completions.create(..., stream=True)``."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        self._queues: dict[str, asyncio.Queue[SequenceOutput | BaseException]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self.chat = _ChatNamespace(lambda **kwargs: self._create("chat", kwargs))
        self.completions = _Namespace(lambda **kwargs: self._create("completion", kwargs))
        self.embeddings = _Namespace(lambda **kwargs: self._create("embeddings", kwargs))

    @classmethod
    def from_runner(cls, runner: StepRunner, tokenizer: Tokenizer, info: ModelInfo, *,
                    num_pages: int, **core_options: Any) -> AsyncEngineAPI:
        return cls(EngineCore(runner, tokenizer, info, num_pages=num_pages, **core_options))

    async def prepare_off_loop(self, prepare: Callable[[], T]) -> T:
        """Run ``prepare`` (validation, template, tokenization). Inline here: Pyodide has no
        threads. A host with threads overrides this to keep its event loop free."""
        return prepare()

    async def _compile_async(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile off the event loop: the backend's ``compile_async`` (the native one runs
        it in a child process, then on threads of its own; the browser's awaits wasm), else
        its ``compile`` where requests are prepared. Cancelling the caller (its client left)
        abandons the compile."""
        compile_async = getattr(self.core.grammar, "compile_async", None)
        if compile_async is not None:
            return await compile_async(spec)
        return await self.prepare_off_loop(lambda: self._compile(spec))

    async def _create(self, name: str, kwargs: dict[str, Any]) -> Any:
        endpoint = self.endpoints[name]
        prep = await self.prepare_off_loop(lambda: endpoint.prepare(kwargs))
        answered = endpoint.without_model(prep)
        if answered is not None:
            sub, chunks = answered

            async def replay() -> AsyncIterator[Any]:
                for chunk in chunks:
                    yield chunk
            return AsyncChunkStream(replay(), lambda: None) if sub.stream else endpoint.fold(
                sub, chunks)
        if prep.grammar_spec is not None:
            prep.grammar = await self._compile_async(prep.grammar_spec)
            await check_opens_async(prep.grammar, prep.grammar_spec)
        sub = endpoint.submit(prep)
        for rid in sub.request_ids:
            self._queues[rid] = asyncio.Queue()
        self._ensure_loop()
        if sub.stream:
            return AsyncChunkStream(self._chunks(endpoint, sub), lambda: self._release(sub))
        try:
            return endpoint.fold(sub, [chunk async for chunk in self._chunks(endpoint, sub)])
        finally:
            self._release(sub)

    async def _chunks(self, endpoint: Endpoint, sub: Submitted) -> AsyncIterator[Any]:
        try:
            for chunk in endpoint.opening(sub):
                yield chunk
            while (rid := endpoint.waiting_on(sub)) is not None:
                for chunk in endpoint.on_output(sub, await self._next_output(rid)):
                    yield chunk
            for chunk in endpoint.closing(sub):
                yield chunk
        finally:
            self._release(sub)

    async def _next_output(self, rid: str) -> SequenceOutput:
        item = await self._queues[rid].get()
        if isinstance(item, BaseException):
            raise item
        return item

    def _release(self, sub: Submitted) -> None:
        for rid in sub.request_ids:
            self._queues.pop(rid, None)
            self.core.abort(rid)
        if self._wakeup is not None:
            self._wakeup.set()  # the loop applies the abort (frees pages) on its next step

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            # A fresh Event too: an Event belongs to the event loop that first waited on it.
            self._wakeup = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._step_loop())
        assert self._wakeup is not None
        self._wakeup.set()

    async def _step_loop(self) -> None:
        """The one step loop: runs while any request is unfinished, sleeps otherwise."""
        assert self._wakeup is not None
        core = self.core
        while True:
            if not core.has_unfinished():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                outputs = await core.step_async()
            except Exception as e:  # the runner failed: fail every waiting request with it
                core.abort_all()
                for q in self._queues.values():
                    q.put_nowait(e)
                await asyncio.sleep(0)
                continue
            for out in outputs:
                q = self._queues.get(out.request_id)
                if q is not None:
                    q.put_nowait(out)
            await asyncio.sleep(0)  # let consumers read and new requests join the next step

    def abort_all(self, error: WickError | None = None) -> None:
        """Abort every unfinished request. Without ``error`` each ends with finish_reason
        "abort" (the engine's interrupt); with one, each waiting caller gets ``error`` raised
        (a stream ends with it)."""
        self.core.abort_all()
        if error is not None:
            for q in self._queues.values():
                q.put_nowait(error)
        if self._wakeup is not None:
            self._wakeup.set()  # the loop applies the aborts (frees pages) on its next step

    async def aclose(self) -> None:
        """Stop the step loop; unfinished requests are aborted (and grammar compiles)."""
        self.abort_all(EngineAbortedError("the engine was closed"))
        close_grammar = getattr(self.core.grammar, "close", None)
        if close_grammar is not None:  # the native backend's compile children
            close_grammar()
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
