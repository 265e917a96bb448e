"""``wick.Engine`` / ``wick.AsyncEngine``: the engine on this machine's GPU.

Resolves the model (built-in name, HF directory, .gguf file or compiled artifact directory),
compiles it when needed (cached), loads it onto the native wgpu backend and wraps the engine's
OpenAI-shaped API. ``quantization=None`` picks the best variant the device supports.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable

from ..compiler.extra import require_compiler
from ..engine import AsyncEngineAPI, EngineAPI, EngineCore
from ..engine.artifact import MANIFEST_NAME, VERIFY_MARKER, Artifact
from ..engine.assembly import assemble_core
from ..engine.errors import (
    ArtifactError,
    DeviceError,
    InvalidRequestError,
    MissingFeatureError,
    ModelNotFoundError,
)
from ..engine.grammar_limits import GrammarLimits
from ..engine.speculative import SpeculativeConfig
from ..engine.runner import Runner

Progress = Callable[[str, int, int], None]
log = logging.getLogger("wick.engine")


def _check_feature(quantization: str, features) -> None:
    from ..compiler.quantization import QUANTIZATIONS, get_quantization

    if get_quantization(quantization).needs_f16 and "shader-f16" not in features:
        working = [q.name for q in QUANTIZATIONS.values() if not q.needs_f16]
        raise MissingFeatureError("shader-f16", working, requested=quantization)


def pick_quantization(model: str, quantization: str | None, features,
                      prefer_f32: bool = False) -> str | None:
    """The variant to compile: the asked one (checked against the device), else the model's
    default (None), or its float32 twin (q4f16_1 -> q4f32_1) on a device without shader-f16
    or one that runs float32 best (``prefer_f32``: the CPU backend)."""
    if quantization is None and ("shader-f16" not in features or prefer_f32):
        from ..compiler.compile import default_quantization
        from ..compiler.quantization import f32_twin

        default = default_quantization(model)
        quantization = f32_twin(default) or default
    if quantization is not None:
        _check_feature(quantization, features)
    return quantization


def named_artifact(model: str) -> str:
    """``model``, or the path of the cached artifact whose directory name it is (as ``wick
    list`` shows it), where it names no built-in model or existing path."""
    from ..compiler.paths import artifacts_dir
    from ..compiler.sources import builtin_models

    if Path(model).exists() or model in builtin_models() or "/" in model \
            or model.startswith("."):
        return model
    path = artifacts_dir() / model
    return str(path) if (path / MANIFEST_NAME).is_file() else model


def check_model_named(model: str) -> None:
    """Raise the "no such model" error for a name that can name nothing: no built-in model, no
    hf:// model, no existing path (``wick serve`` asks before it listens, so a typo is one
    ``error:`` line, not a server that starts and then fails to load)."""
    from ..compiler.hub import is_hub_uri
    from ..compiler.sources import builtin_models, model_not_found

    if not (is_hub_uri(model) or Path(model).expanduser().exists()
            or model in builtin_models()):
        raise model_not_found(model)


def load_artifact(model: str, quantization: str | None, features, progress: Progress | None,
                  prefer_f32: bool = False) -> Artifact:
    from ..compiler.hub import is_hub_uri

    path = Path(model)
    if is_hub_uri(model):
        return _from_hub(model, quantization, features, progress, prefer_f32)
    if (path / MANIFEST_NAME).is_file():
        return _artifact_at(path, quantization)
    if not path.exists() and ("/" in model or model.endswith(".gguf")):
        raise ModelNotFoundError(model)
    require_compiler(model)
    from ..compiler.compile import compile_model

    quantization = pick_quantization(model, quantization, features, prefer_f32)
    out = compile_model(model, quantization, progress=progress)  # None: the model's default
    return Artifact.load(lambda p: (out / p).read_bytes(), str(out))


def _artifact_at(path: Path, quantization: str | None, name: str | None = None) -> Artifact:
    art = Artifact.load(lambda p: (path / p).read_bytes(), str(path))
    if quantization and quantization != art.quantization:
        raise InvalidRequestError(
            f"the artifact at {name or path} is {art.quantization}, not {quantization}: compile "
            f"the source model with --quantization {quantization}", param="quantization")
    return art


def _from_hub(model: str, quantization: str | None, features, progress: Progress | None,
              prefer_f32: bool) -> Artifact:
    """An ``hf://`` model: a repo holding a compiled artifact runs as it is, once every file
    matches the manifest's sha256; a model repo or GGUF is compiled (cached) like a local one."""
    from ..compiler.artifact_writer import artifact_problems
    from ..compiler.hub import fetch
    from ..compiler.sources import file_sha256

    fetched = fetch(model)
    if fetched.kind != "artifact":
        require_compiler(model)
        from ..compiler.compile import compile_model

        quantization = pick_quantization(str(fetched.path), quantization, features, prefer_f32)
        # (by its commit: the compile finds it in the cache without asking the Hub again)
        out = compile_model(fetched.origin, quantization, progress=progress)
        return Artifact.load(lambda p: (out / p).read_bytes(), str(out))
    # every file hashed: once per file version (the cache's blobs never change in place)
    problems = artifact_problems(fetched.path, hashes=True, sha256=file_sha256)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ArtifactError(f"the artifact in {fetched.origin} is damaged: {problems[0]}{more}; "
                            "its repo holds files that do not match its manifest",
                            code="artifact_corrupt")
    return _artifact_at(fetched.path, quantization, fetched.origin)


class NativeRunner(Runner):
    """The Runner, plus a ``step_async`` that keeps the event loop free while the GPU works."""

    async def step_async(self, batch):
        return await asyncio.to_thread(self.step, batch)


def build_core(model: str, *, quantization: str | None = None, device: str = "auto",
                 kv_cache_bytes: int | None = None, progress: Progress | None = None,
                 backend=None, **core_options: Any) -> EngineCore:
    return load_local(model, quantization=quantization, device=device,
                      kv_cache_bytes=kv_cache_bytes, progress=progress, backend=backend,
                      **core_options)[0]


def load_local(model: str, *, quantization: str | None = None, device: str = "auto",
               kv_cache_bytes: int | None = None, progress: Progress | None = None,
               backend=None, **core_options: Any) -> tuple[EngineCore, Path]:
    """The engine core for ``model`` on this machine, and the artifact directory it runs.
    ``core_options``: ``batch_invariant``, ``prefix_cache``, ``grammar_limits``,
    ``speculative`` (see ``EngineCore``)."""
    from ..native.devices import AUTO_WITHOUT_CUDA, create_backend

    chosen = backend is None and (device or "auto").lower() in ("auto", AUTO_WITHOUT_CUDA)
    backend = backend or create_backend(device)
    art = load_artifact(model, quantization, backend.features, progress,
                        backend.prefers_f32)
    options = {"kv_cache_bytes": kv_cache_bytes, "progress": progress, **core_options}
    options["speculative"] = SpeculativeConfig.parse(core_options.get("speculative"))
    if options["speculative"] is not None and options["speculative"].method == "draft":
        options["draft_artifact"] = _draft_artifact(model, options["speculative"], backend,
                                                    progress)
    try:
        return _core_for(art, backend, **options), Path(art.location)
    except (ArtifactError, DeviceError) as err:
        missing = isinstance(err, ArtifactError) and err.code == "kernel_set_missing"
        other = _device_with_a_set(backend.kind, art.manifest["kernel_sets"]) if missing else None
        if chosen and other is not None:
            # "auto" picked a device whose kernel set the artifact was compiled without
            # (`wick compile --kernel-sets`): the CPU's set, or WebGPU's on any adapter
            log.warning("%s; running it on device %r instead", err.message, other)
            backend.close()
            return load_local(model, quantization=quantization, device=other,
                              kv_cache_bytes=kv_cache_bytes, progress=progress,
                              **core_options)
        if chosen and backend.kind == "cuda" and (
                isinstance(err, DeviceError) or missing or err.code == "artifact_stale"):
            # "auto" picked CUDA and it cannot run this model here (an older GPU, an NVRTC
            # without this GPU's architecture, an artifact without CUDA kernels): the next
            # device "auto" would pick does
            log.warning("CUDA cannot run %s here (%s); using the next device", model,
                        err.message)
            backend.close()
            return load_local(model, quantization=quantization, device=AUTO_WITHOUT_CUDA,
                              kv_cache_bytes=kv_cache_bytes, progress=progress,
                              **core_options)
        if not isinstance(err, ArtifactError) or err.code != "artifact_corrupt":
            raise
        # A file changed since it was written (disk error, a stray edit): mark the artifact so
        # that the next compile checks every hash, and rebuild it now when we know its source.
        Path(art.location, VERIFY_MARKER).touch()
        if (Path(model) / MANIFEST_NAME).is_file():
            raise  # an artifact directory given by path: its source is not ours to rebuild
        log.warning("%s; rebuilding the artifact", err.message)
        art = load_artifact(model, quantization, backend.features, progress,
                        backend.prefers_f32)
        return _core_for(art, backend, **options), Path(art.location)


def _device_with_a_set(kind: str, sets: dict) -> str | None:
    """The device ``"auto"`` turns to when the backend it picked (of ``kind``) has no kernel
    set among an artifact's ``sets``: the CPU, else WebGPU on any adapter (lavapipe without
    a GPU); None when neither is there, and for CUDA: its own fallback comes first (the
    next device "auto" would pick: a real GPU through wgpu before the CPU)."""
    if kind == "cuda":
        return None
    if kind != "cpu" and "cpu" in sets:
        return "cpu"
    if kind == "cpu" and "webgpu" in sets:
        return "vulkan"
    return None


def _draft_artifact(model: str, spec: SpeculativeConfig, backend,
                    progress: Progress | None) -> Artifact:
    """The draft model's artifact: ``spec.model`` (default: the engine's own model) in
    ``spec.quantization`` (default: its 4-bit twin), compiled when needed."""
    if spec.model is None and (Path(model) / MANIFEST_NAME).is_file():
        raise InvalidRequestError(
            f"{model} is a compiled artifact: name the draft model (--draft-model, or "
            "speculative={'method': 'draft', 'model': ...})", param="speculative")
    name, quantization = spec.draft_target(model)
    return load_artifact(name, quantization, backend.features, progress,
                         backend.prefers_f32)


def _core_for(art: Artifact, backend, *, kv_cache_bytes: int | None, progress: Progress | None,
              grammar_limits: GrammarLimits | None = None, **core_options: Any) -> EngineCore:
    from ..native.grammar import grammar_for
    from ..native.tokenizer import HFTokenizer

    limits = grammar_limits or GrammarLimits()
    return assemble_core(
        art, backend, tokenizer=HFTokenizer, kv_cache_bytes=kv_cache_bytes,
        grammar=lambda tok_json, info: grammar_for(tok_json, info.vocab_size, info.eos_token_ids,
                                                   limits),
        runner_class=NativeRunner, progress=progress, grammar_limits=limits, **core_options)


def software_adapter_notice(backend) -> str | None:
    """One line for a user whose native "GPU" is a CPU emulation, else None."""
    if not backend.is_software:
        return None
    return (f"{backend.adapter_name} is a software GPU (a CPU emulation): expect a few tokens/s "
            "at most, about 100x below a real GPU. The fast path is the browser engine on your "
            "own GPU: the 'browser' engine of the chat page that `wick serve` serves.")


class _Local:
    """What both facades know about where they run."""

    def _loaded(self, core: EngineCore, artifact_dir: Path) -> EngineCore:
        backend = core.runner.backend
        self.device_name: str = backend.name
        self.artifact_dir = artifact_dir  # what `wick serve` hosts for browsers
        self.software_notice = software_adapter_notice(backend)
        return core


class Engine(_Local, EngineAPI):
    """``Engine(model, *, quantization=None, device="auto")`` with ``.chat.completions.create``
    and ``.completions.create`` (``stream=True`` yields chunks). ``batch_invariant`` (default
    True): a request's tokens never depend on what else runs (see ``Runner``); False mixes
    prompt and decode work in a step, for throughput while prompts arrive. ``prefix_cache``
    (default True): a prompt's pages computed before (an earlier turn, a shared system prompt)
    are reused, not recomputed; ``usage.prompt_tokens_details.cached_tokens`` counts them.
    ``grammar_limits``: how large a response format or tool schema may be, and how long its
    compile may take (``wick.engine.grammar_limits.GrammarLimits``; defaults otherwise).
    ``speculative``: draft tokens for every request and verify them in one step, with output
    unchanged: ``"ngram"`` or ``{"method": "ngram", "num_tokens": 8}`` (prompt lookup; the
    engine adapts the draft length below ``num_tokens`` from what is accepted). Without it,
    requests with OpenAI's ``prediction`` still draft from their prediction."""

    def __init__(self, model: str, *, quantization: str | None = None, device: str = "auto",
                 kv_cache_bytes: int | None = None, progress: Progress | None = None,
                 batch_invariant: bool = True, prefix_cache: bool = True,
                 grammar_limits: GrammarLimits | None = None, speculative: Any = None) -> None:
        super().__init__(self._loaded(*load_local(
            model, quantization=quantization, device=device, kv_cache_bytes=kv_cache_bytes,
            progress=progress, batch_invariant=batch_invariant, prefix_cache=prefix_cache,
            grammar_limits=grammar_limits, speculative=speculative)))


class AsyncEngine(_Local, AsyncEngineAPI):
    """The same API with ``await`` and ``async for``; concurrent requests share engine steps.
    Templating and tokenizing a request run on a worker thread, so a huge request never
    stalls the event loop (running streams, ``/health``)."""

    def __init__(self, model: str, *, quantization: str | None = None, device: str = "auto",
                 kv_cache_bytes: int | None = None, progress: Progress | None = None,
                 batch_invariant: bool = True, prefix_cache: bool = True,
                 grammar_limits: GrammarLimits | None = None, speculative: Any = None) -> None:
        super().__init__(self._loaded(*load_local(
            model, quantization=quantization, device=device, kv_cache_bytes=kv_cache_bytes,
            progress=progress, batch_invariant=batch_invariant, prefix_cache=prefix_cache,
            grammar_limits=grammar_limits, speculative=speculative)))

    async def prepare_off_loop(self, prepare):
        return await asyncio.to_thread(prepare)
