"""The worker's Python side: load an artifact into an ``AsyncEngineAPI`` on the worker's
executor (WebGPU, or the WebAssembly kernels) and answer create requests, posting results and
stream chunks back to JavaScript as JSON.

JS calls ``load(...)`` once, then ``host.start(rid, api, body_json)`` per request (api: "chat" |
"completion" | "embeddings"; a task; concurrent requests share engine steps), ``host.abort(rid)``
(its AbortSignal) and ``host.abort_all()`` (every request ends with finish_reason "abort"; the
engine stays usable).
Everything comes back through ``post(rid, kind, json)`` with kind "result" | "chunk" | "done" |
"error"; errors carry the engine's own ``to_dict()`` plus status and class name.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from wick.engine import AsyncEngineAPI
from wick.engine.artifact import Artifact
from wick.engine.assembly import assemble_core, no_grammar
from wick.engine.errors import EngineAbortedError, InvalidRequestError, WickError
from wick.engine.embeddings import EmbeddingRequest
from wick.engine.protocol import ChatCompletionRequest, CompletionRequest
from wick.engine.sampling_defaults import chat_values
from wick.engine.speculative import SpeculativeConfig

from .backend import WasmBackend, WebGPUBackend
from .grammar import WebGrammarBackend
from .tokenizer import WebTokenizer

def error_payload(e: BaseException) -> str:
    if not isinstance(e, WickError):
        e = WickError(f"{type(e).__name__}: {e}")
    return json.dumps({**e.to_dict(), "status": e.status, "class": type(e).__name__})


class Host:
    def __init__(self, api: AsyncEngineAPI, backend: WebGPUBackend | WasmBackend,
                 post: Callable) -> None:
        self.api = api
        self.backend = backend
        self._post = post
        self._tasks: dict[int, asyncio.Task] = {}

    def placements_json(self, draft: bool = False) -> str:
        """Where the weight bytes go, ``[[shard, offset, nbytes, buffer], ...]``: the worker
        streams each verified shard straight into these buffers (no weights through Python).
        ``draft``: the draft model's (on its own executor when that is WebAssembly)."""
        core = self.api.core
        runner = core.draft.runner if draft else core.runner
        return json.dumps([[w.shard, w.offset, w.nbytes, w.buffer]
                           for w in runner.weight_placements])

    async def ready(self) -> str | None:
        """After the weights are written: the first WebGPU error so far as an error payload
        (JSON, for the worker to rebuild as a typed JS error), else None."""
        try:
            await self.backend.check()
        except Exception as e:
            return error_payload(e)
        return None

    def grammar_json(self) -> str:
        """How many grammar masks were applied so far and the digest over all of them (the
        native engine's ``stats`` has the same two numbers for the same requests)."""
        stats = self.api.core.stats
        return json.dumps({"masks": stats.grammar_masks, "digest": stats.grammar_mask_digest})

    def chat_sampling_json(self) -> str:
        """What an interactive chat sends for unset sampling fields (engine/sampling_defaults)."""
        return json.dumps(chat_values(self.api.core.info.sampling_defaults))

    def info_json(self) -> str:
        """The model, the device and host-side step timings: the last step's and the sums over
        all steps, split into the Python engine (scheduling, postprocessing), building the
        dispatch lists (plan), and the backend call, itself split by the executor into JS
        encoding and waiting for the device + readback."""
        info = self.api.core.info
        t = self.api.core.runner.timings
        stats = self.api.core.stats
        return json.dumps({"model": info.model_id, "quantization": info.quantization,
                           "device": self.backend.name, "steps": self.backend.steps,
                           "tokens_computed": stats.tokens_computed,
                           "last_step": {"plan_ms": t.plan_ms, "backend_ms": t.backend_ms,
                                         "engine_ms": stats.last_step_host_ms},
                           "totals": {"steps": t.steps, "engine_ms": stats.total_host_ms,
                                      "plan_ms": t.plan_ms_total, "backend_ms": t.backend_ms_total,
                                      "js_encode_ms": float(self.backend.js_encode_ms),
                                      "device_wait_ms": float(self.backend.device_wait_ms)},
                           "grammar": json.loads(self.grammar_json()),
                           "speculation": stats.speculation(),
                           # (the WebAssembly executor: its slowest kernels and its threads)
                           **json.loads(self.backend.profile_json())})

    def start(self, rid: int, api: str, body_json: str) -> None:
        task = asyncio.ensure_future(self._run(rid, api, body_json))
        self._tasks[rid] = task
        task.add_done_callback(lambda t: self._ended(rid, t))

    def _ended(self, rid: int, task: asyncio.Task) -> None:
        self._tasks.pop(rid, None)
        # ``_run`` answers its own cancellation; a task still counted as cancelled never ran
        # it (cancelled before its first step): answer for it, or the JS caller waits forever
        if task.cancelled():
            self._post(rid, "error", error_payload(EngineAbortedError("the request was aborted")))

    async def _run(self, rid: int, api: str, body_json: str) -> None:
        stream = None
        try:
            body = json.loads(body_json)
            ns = {"chat": self.api.chat.completions, "completion": self.api.completions,
                  "embeddings": self.api.embeddings}[api]
            if not isinstance(body, dict):  # as the server: the engine's own error for it
                {"chat": ChatCompletionRequest, "completion": CompletionRequest,
                 "embeddings": EmbeddingRequest}[api].from_dict(body)
                raise InvalidRequestError("The request body must be a JSON object.")
            result = await ns.create(**body)
            if body.get("stream") is True:
                stream = result
                async for chunk in stream:
                    self._post(rid, "chunk", json.dumps(chunk.to_dict()))
                self._post(rid, "done", "null")
            else:
                self._post(rid, "result", json.dumps(result.to_dict()))
        except asyncio.CancelledError:
            self._post(rid, "error", error_payload(EngineAbortedError("the request was aborted")))
        except Exception as e:  # WickError and anything unexpected, typed for JS
            self._post(rid, "error", error_payload(e))
        finally:
            if stream is not None:
                await stream.aclose()

    def abort(self, rid: int) -> None:
        task = self._tasks.get(rid)
        if task is not None:
            task.cancel()

    def abort_all(self) -> None:
        """Abort every running request: streams end with finish_reason "abort"."""
        self.api.abort_all()

    async def close(self) -> None:
        for t in list(self._tasks.values()):
            t.cancel()
        await self.api.aclose()


def draft_wanted(speculative_json: str, model: str) -> str:
    """The draft model createEngine's ``speculative`` option asks for, before anything is
    fetched: ``{"model", "quantization"}`` (default: ``model`` itself in its 4-bit twin, as
    the native engine), ``null`` for no draft model, or ``{"error": payload}`` for an option
    the engine refuses."""
    try:
        spec = SpeculativeConfig.parse(json.loads(speculative_json) if speculative_json else None)
    except Exception as e:
        return json.dumps({"error": json.loads(error_payload(e))})
    if spec is None or spec.method != "draft":
        return "null"
    name, quantization = spec.draft_target(model)
    return json.dumps({"model": name, "quantization": quantization})


class Loaded:
    """What ``load`` gives JavaScript: the host, or the failure as an error payload (JSON).
    Errors cross into JS as data, never as a Python traceback to parse."""

    def __init__(self, host: Host | None = None, error: str | None = None) -> None:
        self.host = host
        self.error = error


async def load(executor: Any, js_tokenizer: Any, get_file: Any, post: Callable,
               kv_cache_bytes: int = 0, create_grammar: Any = None,
               prefix_cache: bool = True, speculative_json: str = "",
               draft_executor: Any = None, get_draft_file: Any = None) -> Loaded:
    """``get_file(path)`` -> Uint8Array | None of the (already verified) small artifact files
    (tokenizer, kernels). The weight buffers are only allocated: the caller fills them as
    ``Host.placements_json()`` says, then awaits ``Host.ready()``. ``create_grammar``: the
    factory of web/src/grammar.ts (None: structured output is refused with a 400);
    ``prefix_cache``, ``speculative`` (JSON of createEngine's option, "" for none): see
    ``EngineCore``. Speculation with a draft model (``draft_wanted``): ``get_draft_file``
    gives its manifest and kernels, ``draft_executor`` runs it (a WebAssembly executor holds
    one kernel module: the draft has its own; on WebGPU it is ``executor``)."""
    try:
        speculative = SpeculativeConfig.parse(
            json.loads(speculative_json) if speculative_json else None)
        return Loaded(host=await _load(executor, js_tokenizer, get_file, post, kv_cache_bytes,
                                       create_grammar, prefix_cache, speculative,
                                       draft_executor, get_draft_file))
    except Exception as e:
        return Loaded(error=error_payload(e))


def _reader(get_file: Any) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:
        data = get_file(path)
        if data is None:
            raise FileNotFoundError(path)
        return data.to_bytes()
    return read


def _backend(executor: Any) -> WebGPUBackend | WasmBackend:
    wasm = json.loads(executor.infoJson()).get("kind") == "wasm"
    return WasmBackend(executor) if wasm else WebGPUBackend(executor)


async def _load(executor: Any, js_tokenizer: Any, get_file: Any, post: Callable,
                kv_cache_bytes: int, create_grammar: Any, prefix_cache: bool,
                speculative: SpeculativeConfig | None, draft_executor: Any,
                get_draft_file: Any) -> Host:

    def grammar(tokenizer_json: str, info):
        _, vocab = no_grammar(tokenizer_json, info)
        if create_grammar is None:
            return None, vocab
        return WebGrammarBackend(create_grammar, vocab, info.vocab_size, info.eos_token_ids), vocab

    art = Artifact.load(_reader(get_file))  # (its errors name the model)
    backend = _backend(executor)
    draft_art = draft_backend = None
    if speculative is not None and speculative.method == "draft":
        if get_draft_file is None:
            raise InvalidRequestError("speculative method 'draft' needs its draft model's files",
                                      param="speculative")
        draft_art = Artifact.load(_reader(get_draft_file))
        draft_backend = backend if draft_executor is None else _backend(draft_executor)
    core = assemble_core(art, backend, kv_cache_bytes=kv_cache_bytes or None,
                         tokenizer=lambda tok_json: WebTokenizer(js_tokenizer, tok_json),
                         grammar=grammar, prefix_cache=prefix_cache, speculative=speculative,
                         draft_artifact=draft_art, draft_backend=draft_backend,
                         upload_weights=False)
    await backend.check()
    return Host(AsyncEngineAPI(core), backend, post)
