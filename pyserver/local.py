"""``wick.Engine`` / ``wick.AsyncEngine``: the engine on this machine's GPU.

Resolves the model (built-in name, HF directory, .gguf file or compiled artifact directory),
compiles it when needed (cached), loads it onto the native wgpu backend and wraps the engine's
OpenAI-shaped API. ``quantization=None`` picks the best variant the device supports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import asyncio

from ..engine import AsyncEngineAPI, EngineAPI, EngineCore, ModelInfo
from ..engine.artifact import MANIFEST_NAME, Artifact
from ..engine.errors import InvalidRequestError, MissingFeatureError, ModelNotFoundError
from ..engine.runner import DEFAULT_KV_BUDGET, Runner, kv_pages_for

Progress = Callable[[str, int, int], None]


def pick_quantization(features: frozenset[str] | set[str]) -> str:
    return "q4f16_1" if "shader-f16" in features else "q4f32_1"


def _check_feature(quantization: str, features) -> None:
    if quantization.endswith("f16") or "f16_" in quantization:
        if "shader-f16" not in features:
            raise MissingFeatureError("shader-f16", ["q4f32_1", "q0f32"], requested=quantization)


def load_artifact(model: str, quantization: str | None, features, progress: Progress | None) -> Artifact:
    path = Path(model)
    if (path / MANIFEST_NAME).is_file():
        art = Artifact.load(lambda p: (path / p).read_bytes(), str(path))
        if quantization and quantization != art.quantization:
            raise InvalidRequestError(
                f"the artifact at {path} is {art.quantization}, not {quantization}: compile the "
                f"source model with --quantization {quantization}", param="quantization")
        return art
    if not path.exists() and ("/" in model or model.endswith(".gguf")):
        raise ModelNotFoundError(model)
    from ..compiler.compile import compile_model

    quant = quantization or pick_quantization(features)
    _check_feature(quant, features)
    out = compile_model(model, quant, progress=progress)
    return Artifact.load(lambda p: (out / p).read_bytes(), str(out))


class NativeRunner(Runner):
    """The Runner, plus a ``step_async`` that keeps the event loop free while the GPU works."""

    async def step_async(self, batch):
        return await asyncio.to_thread(self.step, batch)


def build_core(model: str, *, quantization: str | None = None, device: str = "auto",
                 kv_cache_bytes: int | None = None, progress: Progress | None = None,
                 backend=None) -> EngineCore:
    from ..native.tokenizer import HFTokenizer
    from ..native.wgpu_backend import WgpuBackend

    backend = backend or WgpuBackend.create(device)
    art = load_artifact(model, quantization, backend.features, progress)
    pages = kv_pages_for(art.model, kv_cache_bytes or DEFAULT_KV_BUDGET, backend.max_storage_binding)
    runner = NativeRunner(art, backend, num_pages=pages, progress=progress)
    tokenizer = HFTokenizer(art.tokenizer_json())
    return EngineCore(runner, tokenizer, ModelInfo.from_manifest(art.manifest), num_pages=pages)


class Engine(EngineAPI):
    """``Engine(model, *, quantization=None, device="auto")`` with ``.chat.completions.create``
    and ``.completions.create`` (``stream=True`` yields chunks)."""

    def __init__(self, model: str, *, quantization: str | None = None, device: str = "auto",
                 kv_cache_bytes: int | None = None, progress: Progress | None = None) -> None:
        super().__init__(build_core(model, quantization=quantization, device=device,
                                    kv_cache_bytes=kv_cache_bytes, progress=progress))
        self.device_name = self.core.runner.backend.name


class AsyncEngine(AsyncEngineAPI):
    """The same API with ``await`` and ``async for``; concurrent requests share engine steps."""

    def __init__(self, model: str, *, quantization: str | None = None, device: str = "auto",
                 kv_cache_bytes: int | None = None, progress: Progress | None = None) -> None:
        super().__init__(build_core(model, quantization=quantization, device=device,
                                    kv_cache_bytes=kv_cache_bytes, progress=progress))
        self.device_name = self.core.runner.backend.name
