"""wick as the engine of a Ray Serve LLM application (#32): ``from wick.ray import WickServer``.

Ray Serve LLM (``ray.serve.llm``) runs an OpenAI ingress over ``LLMServer`` deployments, each
driving an engine class with its ``LLMEngine`` interface (chat, completions and embeddings as
async generators, health, prefix-cache reset); vLLM's is the default. ``WickEngine`` is that
interface over wick's ``AsyncEngine``, and ``WickServer`` the ``LLMServer`` that uses it and
places its replicas without asking vLLM (whose engine config the stock placement reads)::

    config = LLMConfig(model_loading_config={"model_id": "smollm2",
                                             "model_source": "smollm2-135m-instruct"},
                       server_cls=WickServer, engine_kwargs={"quantization": "q4f32_1"})
    serve.run(build_openai_app({"llm_configs": [config]}))

``model_source`` (else ``model_id``) is anything ``wick serve`` takes: a built-in name, a local
directory or GGUF, an ``hf://`` repo. ``engine_kwargs`` are ``AsyncEngine``'s keywords
(``quantization``, ``device``, ``kv_cache_bytes``, ``prefix_cache``, ``speculative`` ...).

Requests arrive as Ray's pydantic models (vLLM's or SGLang's OpenAI types, whichever is
installed: Ray Serve LLM imports one of them); their set fields go to wick's own validation, so
a request means about what it means on ``wick serve`` (those types' validators may have set a
field or two the client did not, e.g. SGLang's ``tool_choice``). Replies go back as Ray's
response types; a wick error as Ray's ``ErrorResponse`` with its status (Ray's ingress keeps
the message, type and status, not OpenAI's ``param``/``code``). Score, transcription and
profiling routes answer with an error: wick has none of them.

Importing this module imports ``ray.llm``, which needs ``ray[serve,llm]`` (it brings vLLM) or
``ray[serve]`` plus SGLang's protocol package.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

try:
    from ray.llm._internal.serve.core.engine.protocol import LLMEngine
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import openai_api_models as ray_types
except ImportError as e:  # (Ray Serve LLM imports vLLM's or SGLang's OpenAI types at once)
    raise ImportError(
        f"wick.ray needs Ray Serve LLM and the OpenAI types it uses ({e}): "
        "pip install 'ray[serve,llm]==2.60.0' (with vLLM) or 'ray[serve]==2.60.0' pyarrow "
        "with SGLang's protocol package.") from e
from ray.llm._internal.serve.core.configs.openai_api_models import (
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    TokenizeResponse,
)

from ..engine.errors import InvalidRequestError, WickError

log = logging.getLogger("wick")

# what Ray's request models carry that is the router's, not the client's
ROUTING_FIELDS = ("model", "request_id")


def request_body(request: Any) -> dict[str, Any]:
    """The fields the client set, as wick's endpoints take them: Ray's routing fields left out,
    and a message's unset fields (its dump of a typed message model lists them as None)."""
    body = request.model_dump(exclude_unset=True, warnings=False)
    for key in ROUTING_FIELDS:
        body.pop(key, None)
    messages = body.get("messages")
    if isinstance(messages, list):
        body["messages"] = [{k: v for k, v in m.items() if v is not None}
                            if isinstance(m, dict) else m for m in messages]
    return body


def error_response(err: WickError) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=err.message, type=err.type, param=err.param,
                                         code=err.status))


def event(data: dict[str, Any]) -> str:
    """One server-sent event, as Ray's ingress passes a streamed string on."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class WickEngine(LLMEngine):
    """Ray Serve LLM's engine interface over one wick ``AsyncEngine``."""

    def __init__(self, llm_config: Any) -> None:
        self.llm_config = llm_config
        loading = llm_config.model_loading_config
        self.model_id: str = loading.model_id
        self.source: str = loading.model_source or loading.model_id
        self.options: dict[str, Any] = dict(llm_config.engine_kwargs)
        self.engine: Any = None

    async def start(self) -> None:
        from .local import AsyncEngine

        # (loading may compile first: off the replica's event loop)
        self.engine = await asyncio.to_thread(AsyncEngine, self.source, **self.options)
        log.info("wick engine for %s: %s on %s", self.model_id, self.engine.core.info.model_id,
                 self.engine.device_name)

    def routing_stats(self) -> dict:
        return {}  # (what a KV-aware router would read; Ray's default router reads queues)

    async def resolve_lora(self, lora_model: Any) -> None:
        raise InvalidRequestError("wick serves no LoRA adapters.", param="model",
                                  code="lora_not_supported")

    async def check_health(self) -> None:
        """Ray Serve LLM's health check: unhealthy before the engine starts, and while its last
        runner call failed, with none returning since (ray_serve.raise_if_failing)."""
        from .ray_serve import raise_if_failing

        if self.engine is None:
            raise RuntimeError("the wick engine has not started")
        raise_if_failing({self.model_id: self.engine})

    async def reset_prefix_cache(self) -> None:
        self.engine.core.reset_prefix_cache()

    async def chat(self, request: Any, raw_request_info: Any = None,
                   ) -> AsyncGenerator[Any, None]:
        async for item in self._generate("chat", request):
            yield item

    async def completions(self, request: Any, raw_request_info: Any = None,
                          ) -> AsyncGenerator[Any, None]:
        async for item in self._generate("completion", request):
            yield item

    async def _generate(self, api: str, request: Any) -> AsyncGenerator[Any, None]:
        """A stream's chunks as events, else the one reply; a wick error as Ray's error (or,
        once streaming, as an error event). Leaving the generator early (the client left)
        closes the engine's stream, which aborts the request."""
        endpoint = self.engine.chat.completions if api == "chat" else self.engine.completions
        body = request_body(request)
        try:
            result = await endpoint.create(**body)
        except WickError as e:
            yield error_response(e)
            return
        if body.get("stream") is not True:
            reply = self._named(result.to_dict(), request)
            cls = ray_types.ChatCompletionResponse if api == "chat" else \
                ray_types.CompletionResponse
            yield cls.model_validate(reply)
            return
        try:
            async for chunk in result:
                yield event(self._named(chunk.to_dict(), request))
        except WickError as e:
            yield event(e.to_dict())
        finally:
            await result.aclose()

    async def embeddings(self, request: Any, raw_request_info: Any = None,
                         ) -> AsyncGenerator[Any, None]:
        try:
            result = await self.engine.embeddings.create(**request_body(request))
        except WickError as e:
            yield error_response(e)
            return
        yield ray_types.EmbeddingResponse.model_validate(self._named(result.to_dict(), request))

    async def transcriptions(self, request: Any, raw_request_info: Any = None,
                             ) -> AsyncGenerator[Any, None]:
        yield error_response(InvalidRequestError(
            "wick serves text models: there is no transcription endpoint.", param="model",
            code="model_not_supported"))

    async def tokenize(self, request: Any, raw_request_info: Any = None,
                       ) -> AsyncGenerator[Any, None]:
        body = request_body(request)
        body.pop("add_special_tokens", None)  # (wick's rule: the model's own BOS rule)
        try:
            reply = await self.engine.prepare_off_loop(lambda: self.engine.tokenize(body))
        except WickError as e:
            yield error_response(e)
            return
        yield TokenizeResponse.model_validate(reply)

    async def detokenize(self, request: Any, raw_request_info: Any = None,
                         ) -> AsyncGenerator[Any, None]:
        try:
            reply = await self.engine.prepare_off_loop(
                lambda: self.engine.detokenize(request_body(request)))
        except WickError as e:
            yield error_response(e)
            return
        # (wick's and vLLM's reply says "prompt", SGLang's "text")
        key = "prompt" if "prompt" in DetokenizeResponse.model_fields else "text"
        yield DetokenizeResponse.model_validate({key: reply["prompt"]})

    async def score(self, request: Any, raw_request_info: Any = None,
                    ) -> AsyncGenerator[Any, None]:
        yield error_response(InvalidRequestError(
            "wick has no scoring endpoint.", param="model", code="model_not_supported"))

    async def start_profile(self) -> None:
        raise InvalidRequestError("wick has no profiler to start.", code="not_supported")

    async def stop_profile(self) -> None:
        raise InvalidRequestError("wick has no profiler to stop.", code="not_supported")

    async def shutdown(self) -> None:
        if self.engine is not None:
            await self.engine.aclose()

    def _named(self, reply: dict[str, Any], request: Any) -> dict[str, Any]:
        """A reply under the name the client asked Ray for (wick names its model itself)."""
        if "model" in reply:
            reply["model"] = getattr(request, "model", None) or self.model_id
        return reply


class WickServer(LLMServer):
    """Ray Serve LLM's deployment with wick as its engine: ``LLMConfig(server_cls=WickServer)``.

    Placement: the engine runs in the replica itself, so a replica is one bundle of
    ``ray_actor_options``' CPUs (default 1) and GPUs (default 0: wick runs on the CPU; give
    ``num_gpus: 1`` with ``engine_kwargs={"device": "cuda"}``), added to the first of
    ``placement_group_config``'s ``bundles`` where it gives them (as Ray's own server does)."""

    _default_engine_cls = WickEngine

    async def _start_engine(self) -> None:
        # (the stock one also reports vLLM usage telemetry, which fails without vLLM)
        await self.engine.start()

    @classmethod
    def get_deployment_options(cls, llm_config: Any) -> dict[str, Any]:
        options = copy.deepcopy(llm_config.deployment_config)
        if "placement_group_bundles" in options or "placement_group_strategy" in options:
            raise ValueError("give placement in the LLMConfig's placement_group_config "
                             "(bundles, strategy), not in deployment_config")
        actor = options.get("ray_actor_options", {})
        pg = llm_config.placement_group_config or {}
        if "bundle_per_worker" in pg:
            raise ValueError("wick runs one engine per replica, in the replica: give "
                             "placement_group_config 'bundles', not 'bundle_per_worker'")
        replica = {"CPU": actor.get("num_cpus", 1), "GPU": actor.get("num_gpus", 0),
                   **actor.get("resources", {})}
        if "memory" in actor:
            replica["memory"] = actor["memory"]
        given = [dict(b) for b in pg.get("bundles", [])]
        if given:  # (the replica takes the first bundle: its resources go there)
            given[0] = {k: given[0].get(k, 0) + replica.get(k, 0) for k in {*given[0], *replica}}
        bundles = given or [replica]
        strategy = pg.get("strategy", "PACK" if given else "STRICT_PACK")
        options.update(placement_group_bundles=bundles, placement_group_strategy=strategy)
        if llm_config.runtime_env:
            actor["runtime_env"] = {**actor.get("runtime_env", {}), **llm_config.runtime_env}
        options["ray_actor_options"] = actor
        return options
