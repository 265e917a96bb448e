"""``wick compile``: model source -> artifact directory, cached.

Stages (each reported through ``progress(stage, done, total)``): resolve the source, load and
convert its weights, build the Relax model, lower it with TVM to WGSL + plans, quantize and write
the weight shards. The compile cache is keyed by (source weights hash, quantization, target,
compiler version): asking for the same thing twice returns the existing artifact at once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..engine.artifact import MANIFEST_NAME, SHARD_MAX_BYTES, VERIFY_MARKER, cpu_kernels_misfit
from ..engine.errors import InvalidRequestError
from . import lazy_weights, paths
from .artifact_writer import artifact_problems, build_lock, sweep_stale_builds, write_artifact
from .cpu_schedules import WIDE_BATCHES
from .embedding_files import special_tokens
from .gguf_read import readers_shared_within
from .lower import lower, merge
from .targets import build_all, chosen_kernel_sets, targets
from .targets.cpu import CpuSet
from .targets.cuda import cuda_target
from .targets.webgpu import webgpu_target
from .models import family_for
from .models.layers import MAX_BINDING_BYTES, requantize, row_splits
from .models.kv_layout import PAGE_SIZE
from .quantization import Quantization, f32_twin, get_quantization, mixed_plan, quantize
from .source_digest import compiler_stamp

DEFAULT_PREFILL_CHUNK = 256
DEFAULT_MAX_BATCH = 32

Progress = Callable[[str, int, int], None]
log = logging.getLogger("wick.compiler")


def cache_key(source_hash: str, quant: str, options: dict) -> str:
    # (the manifest's compiler stamp itself: `wick list` calls an artifact stale exactly when
    # no key of this compiler's can name it)
    blob = json.dumps([source_hash, quant, compiler_stamp(), options], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sampler_module(vocab_size: int):
    """The sampling entry points: ``process_logits`` (grammar mask, penalties, bias),
    ``sample`` and ``logprobs`` (compiler/logits.py, compiler/sampling.py)."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import Tensor, op

    from .logits import MAX_TOP_LOGPROBS, bitmask_words, logprobs_prim_func, process_logits_prim_func
    from .sampling import sampling_prim_func

    V = vocab_size
    sample_kernel = sampling_prim_func(V, "float32")
    process_kernel = process_logits_prim_func(V)
    logprobs_kernel = logprobs_prim_func(V)

    class Sampler(nn.Module):
        def sample(self, logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor,
                   min_p: Tensor, uniform: Tensor) -> Tensor:
            b = logits.shape[0]
            return op.tensor_ir_op(sample_kernel, "sample_token",
                                   [logits, temperature, top_p, top_k, min_p, uniform],
                                   Tensor.placeholder((b,), "int32"))

        def process_logits(self, logits: Tensor, mask: Tensor, mask_on: Tensor, indptr: Tensor,
                           tokens: Tensor, rep: Tensor, add: Tensor) -> Tensor:
            b = logits.shape[0]
            return op.tensor_ir_op(process_kernel, "apply_logit_rules",
                                   [logits, mask, mask_on, indptr, tokens, rep, add],
                                   Tensor.placeholder((b, V), "float32"))

        def logprobs(self, logits: Tensor, token: Tensor, num_top: Tensor):
            b = logits.shape[0]
            return op.tensor_ir_op(logprobs_kernel, "token_logprobs", [logits, token, num_top],
                                   [Tensor.placeholder((b, MAX_TOP_LOGPROBS + 1), "float32"),
                                    Tensor.placeholder((b, MAX_TOP_LOGPROBS), "int32")])

    rows = {"logits": nn.spec.Tensor(["b", V], "float32")}
    none = {"$": {"param_mode": "none", "effect_mode": "none"}}
    spec = {
        "sample": {**rows, "temperature": nn.spec.Tensor(["b"], "float32"),
                   "top_p": nn.spec.Tensor(["b"], "float32"),
                   "top_k": nn.spec.Tensor(["b"], "int32"),
                   "min_p": nn.spec.Tensor(["b"], "float32"),
                   "uniform": nn.spec.Tensor(["b"], "float32"), **none},
        "process_logits": {**rows, "mask": nn.spec.Tensor(["b", bitmask_words(V)], "int32"),
                           "mask_on": nn.spec.Tensor(["b"], "int32"),
                           "indptr": nn.spec.Tensor(["b1"], "int32"),
                           "tokens": nn.spec.Tensor(["nnz"], "int32"),
                           "rep": nn.spec.Tensor(["nnz"], "float32"),
                           "add": nn.spec.Tensor(["nnz"], "float32"), **none},
        "logprobs": {**rows, "token": nn.spec.Tensor(["b"], "int32"),
                     "num_top": nn.spec.Tensor(["b"], "int32"), **none},
    }
    mod, _ = Sampler().export_tvm(spec=spec)
    return mod


def kernel_twins(module, vocab_size: int | None, decode: bool = False,
                 kinds=("cpu", "cuda")) -> dict[str, dict]:
    """The one twin map: per kernel set (a target's KIND, compiler/targets/), TIR function name
    -> the function that set compiles in its place, same parameters. The CPU set (and the
    WebAssembly sets built from it) takes CPU twins of the GPU-only kernels (attention, RoPE,
    and, given the ``vocab_size`` of a sampler, sampling: compiler/models/paged_attention.py
    ``cpu_twins``, compiler/sampling.py, compiler/logits.py); the CUDA set its own attention
    tiles, and for ``decode`` plans wick's row-per-workgroup decode attention
    (``gpu_twins``). WebGPU's are the plans' own functions. Only ``kinds``' parts are built."""
    twins = {}
    if "cuda" in kinds:
        twins["cuda"] = module.gpu_twins(cuda_target(), decode=decode)
    if "cpu" not in kinds:
        return twins
    cpu = dict(module.cpu_twins())
    if vocab_size is not None:
        from .logits import logprobs_prim_func_cpu, process_logits_prim_func_cpu
        from .sampling import sampling_prim_func_cpu

        cpu.update({"sample_token": sampling_prim_func_cpu(vocab_size, "float32"),
                    "apply_logit_rules": process_logits_prim_func_cpu(vocab_size),
                    "token_logprobs": logprobs_prim_func_cpu(vocab_size)})
    return {**twins, "cpu": cpu}


_PART = re.compile(r"^(.*)\.parts\.(\d+)\.(weight|weight_q|bias)$")


Packing = Callable[[str], Quantization]  # a linear's name -> how its weight is stored


def _linear_of(param: str) -> str:
    """The module a parameter belongs to: ``X.parts.2.weight_q`` and ``X.bias`` -> ``X``."""
    m = _PART.match(param)
    return m.group(1) if m else param.rpartition(".")[0]


def _weight_for(name: str, converted: dict[str, np.ndarray], packing: Packing,
                max_bytes: int) -> np.ndarray:
    """The unquantized weight behind parameter ``name`` (``X.parts.K.weight`` = rows of X)."""
    plain = name.removesuffix("_q")
    if plain in converted:
        return converted[plain]
    m = _PART.match(name)
    if m is None:
        raise KeyError(f"no source weight for parameter {name}")
    weight = converted[f"{m.group(1)}.weight"]
    whole = converted[f"{m.group(1)}.bias"] if m.group(3) == "bias" else weight
    # (stacked experts, ExpertLinears: the same rows of every expert)
    experts = weight.shape[0] if weight.ndim == 3 else 1
    start, stop = row_splits(*weight.shape[-2:], packing(m.group(1)), max_bytes,
                             experts=experts)[int(m.group(2))]
    return whole[..., start:stop, :] if whole.ndim > 1 else whole[start:stop]


class _ReadOnDemand:
    """The converted weights (``LazyArray``s, read from the source when asked), as
    ``_weight_for`` asks for them one parameter after another: each read when first asked
    and kept until a parameter of another module asks (a weight split into parts, and its
    bias, read once), so a compile holds one module's floats at a time."""

    def __init__(self, converted: dict[str, np.ndarray], source: Path) -> None:
        self.converted, self.source = converted, source
        self.module: str | None = None
        self.read: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.converted

    def __getitem__(self, name: str) -> np.ndarray:
        module = name.rpartition(".")[0]
        if module != self.module:
            self.module, self.read = module, {}
        if name not in self.read:
            from .sources import reading

            with reading(self.source):  # (a damaged file shows here now, named)
                self.read[name] = lazy_weights.read(self.converted[name])
        return self.read[name]


def _convert(names: list[str], converted: dict[str, np.ndarray], packing: Packing,
             max_bytes: int, source: Path, dtypes: dict[str, str] | None = None
             ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield the compiled model's parameters in order, quantizing packed weights on the way;
    each source weight is read here (lazy_weights), when its parameter is written. ``dtypes``:
    each parameter's own (a float32 one in an f16 variant, ERNIE's expert bias), else the
    variant's activation type."""
    converted = _ReadOnDemand(converted, source)
    for name in names:
        if name.endswith((".weight_scale", ".weight_min")):
            continue  # produced together with their .weight_q
        weight = _weight_for(name, converted, packing, max_bytes)
        quant = packing(_linear_of(name))
        if name.endswith(".weight_q"):
            # (stacked experts: each expert's rows packed as a linear's)
            packed, scale, minimum = quantize(weight.reshape(-1, weight.shape[-1]), quant)
            if weight.ndim == 3:
                packed, scale, minimum = (a.reshape(*weight.shape[:2], -1)
                                          for a in (packed, scale, minimum))
            base = name.removesuffix("_q")
            yield name, packed
            yield base + "_scale", scale
            yield base + "_min", minimum
            del packed, scale, minimum
        else:
            yield name, weight.astype((dtypes or {}).get(name, quant.dtype))
        del weight  # (not held while the next module's floats are read)


def _model_section(family: str, cfg, hf: dict, tok_cfg: dict, *, context_window: int,
                   prefill_chunk: int, max_batch: int, quant: Quantization,
                   kv_window: int | None = None, kv_window_pool: int | None = None,
                   embedding: dict | None = None, sampling: dict | None = None) -> dict:
    """The manifest's ``model`` section (engine/model_info.py reads it). ``family`` is the
    compiler's family module; ``model_type`` what the checkpoint called itself."""
    eos = hf.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    for extra in tok_cfg.get("eos_token_ids", []):
        if extra not in eos_ids:
            eos_ids.append(extra)
    return {
        "family": family,
        "model_type": hf.get("model_type"),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_hidden_layers,
        "num_kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "dtype": quant.dtype,
        "context_window": context_window,
        "page_size": PAGE_SIZE,
        "prefill_chunk_size": prefill_chunk,
        "max_batch_size": max_batch,
        "bos_token_id": (hf["bos_token_id"] if hf.get("bos_token_id") is not None
                         else tok_cfg.get("bos_token_id")),
        "eos_token_ids": eos_ids,
        "add_bos_token": bool(tok_cfg.get("add_bos_token", False)),
        "chat_template": tok_cfg.get("chat_template"),
        "kv_window": kv_window,
        "kv_window_pool": kv_window_pool,
        "task": "embed" if embedding else "generate",
        "embedding": embedding,
        "sampling_defaults": None if embedding else sampling,
    }


def _sampling_section(model: str, hf: dict) -> dict | None:
    """``model.sampling_defaults``: the checkpoint's generation_config.json, else (a GGUF has
    none) the built-in registry entry's ``sampling``, the model card's recommendation."""
    from ..engine.sampling_defaults import read_values, section
    from .sources import builtin_models

    if hf.get("generation_sampling"):
        return section(hf["generation_sampling"], "generation_config.json")
    entry = builtin_models().get(model) or {}
    return section(read_values(entry.get("sampling")), "model card, wick's registry")


def _embedding_section(module, cfg, hf: dict, tokenizer_json: str,
                       prefill_chunk: int) -> dict | None:
    """An embedding model's ``model.embedding``: how it pools, the vector's size, the longest
    input (sentence-transformers' ``max_seq_length``, special tokens included; an input is
    one step, so at most ``prefill_chunk`` tokens), and the special tokens the engine puts
    around an input."""
    if getattr(module, "task", "generate") != "embed":
        return None
    files = hf.get("embedding") or {}
    prefix, suffix = special_tokens(tokenizer_json)
    most = min(files.get("max_seq_length") or cfg.context_window, cfg.context_window,
               prefill_chunk)
    return {"pooling": files.get("pooling", getattr(cfg, "pooling", None)),
            "normalize": bool(files.get("normalize", getattr(cfg, "normalize", False))),
            "dimensions": cfg.hidden_size, "max_input_tokens": most,
            "prefix_ids": prefix, "suffix_ids": suffix}


def _reusable(out: Path, key: str, quiet: bool = False) -> bool:
    """Whether ``out`` holds an intact artifact for ``key`` (see ``artifact_problems``); why
    not, as a warning unless ``quiet`` (a first look, checked again under the build lock)."""
    try:
        manifest = json.loads((out / MANIFEST_NAME).read_text())
        if manifest.get("cache_key") != key:
            return False
        cpu_set = manifest.get("kernel_sets", {}).get("cpu")
    except (OSError, ValueError, AttributeError):
        return False  # none yet, or an unreadable manifest: build it
    # The key names no CPU: a cache that moved to (or is shared with) a machine lacking
    # features the CPU kernels were built for is rebuilt here, not refused at load.
    misfit = cpu_kernels_misfit(cpu_set) if isinstance(cpu_set, dict) else None
    if misfit:
        if not quiet:
            log.warning("the cached artifact %s cannot run here (%s): rebuilding it",
                        out.name, misfit.split(":")[0])
        return False
    problems = artifact_problems(out)
    if problems:
        if not quiet:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            log.warning("the cached artifact %s is damaged (%s%s): rebuilding it", out.name,
                        problems[0], more)
        return False
    (out / VERIFY_MARKER).unlink(missing_ok=True)  # every hash checked out
    return True


def _note_source(out: Path, model: str) -> None:
    """Keep ``source.model`` at the source's latest location: the same weights compiled from
    another path (a moved or re-created directory) reuse the artifact, and whoever builds a
    sibling variant from it (``wick serve``'s browser twin) must find the source."""
    path = out / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    if manifest.get("source", {}).get("model") == model:
        return
    manifest.setdefault("source", {})["model"] = model
    partial = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}")
    partial.write_text(json.dumps(manifest, indent=1))
    os.replace(partial, path)


def _check_weights(named: list, converted: dict[str, np.ndarray], packing: Packing,
                   max_bytes: int) -> None:
    """Every parameter of the built model has a source weight of its shape, checked before the
    (slow) lowering: a file declaring other shapes than its config fails here, by name."""
    for name, param in named:
        if name.endswith((".weight_scale", ".weight_min")):
            continue
        want = [int(d) for d in param.shape]
        if name.endswith(".weight_q"):
            want[-1] *= packing(_linear_of(name)).values_per_word
        try:
            got = list(_weight_for(name, converted, packing, max_bytes).shape)
        except KeyError:
            raise ValueError(f"no weight for {name}") from None
        if got != want:
            raise ValueError(f"weight {name.removesuffix('_q')} has shape {tuple(got)}; the "
                             f"model's config needs {tuple(want)}")


DEFAULT_QUANTIZATION = "q4f16_1"  # the best on a device with shader-f16


def family_of(model: str):
    """The family module of a built-in name, HF directory or .gguf file, read from its registry
    entry or its config / metadata alone (no weights), or None when that cannot be read."""
    from .models import FAMILIES, GGUF_ARCHITECTURES, HF_MODEL_TYPES
    from .sources import builtin_models

    registry = builtin_models()
    if model in registry:
        return FAMILIES.get(registry[model].get("family"))
    path = Path(model).expanduser()
    try:
        if path.is_file() and path.suffix == ".gguf":
            return GGUF_ARCHITECTURES.get(_gguf_header(path)[0])
        if (path / "config.json").is_file():  # (an image-and-text one's: its text model's)
            from .hf_source import raw_config

            raw = raw_config(json.loads((path / "config.json").read_text()))
            return HF_MODEL_TYPES.get(raw.get("model_type"))
    except Exception:  # noqa: BLE001 - unreadable: compile_model names the problem
        return None
    return None


@functools.lru_cache(maxsize=8)
def _gguf_header_of(path: str, mtime_ns: int) -> tuple[str | None, bool]:
    from gguf import GGMLQuantizationType

    from .gguf_read import open_gguf
    from .quantization import ggml_bits

    reader = open_gguf(path)
    field = reader.fields.get("general.architecture")
    widths = {ggml_bits(GGMLQuantizationType(t.tensor_type).name) for t in reader.tensors}
    widths.discard(None)
    return (field.contents() if field else None,
            any(b <= 4 for b in widths) and any(b > 4 for b in widths))


def _gguf_header(path: Path) -> tuple[str | None, bool]:
    """(architecture, whether its tensors mix widths of at most and over 4 bits, as Q4_K_M
    does), read once per file version."""
    return _gguf_header_of(str(path), path.stat().st_mtime_ns)


_UNREAD = object()


def default_quantization(model: str, family=_UNREAD) -> str:
    """The variant to build when none is asked: a built-in's registry default; else q4f16_1,
    or for a GGUF that mixes widths (Q4_K_M) q4f16_m, which keeps its wide tensors wide; each
    in its float32 activation twin for a family whose activations overflow float16 (Gemma).
    ``family``: what ``family_of(model)`` gave, when the caller already read it."""
    from .sources import builtin_models

    registry = builtin_models()
    if model in registry:
        return registry[model].get("default_quantization", DEFAULT_QUANTIZATION)
    if family is _UNREAD:
        family = family_of(model)
    path = Path(model).expanduser()
    try:
        mixed = path.is_file() and path.suffix == ".gguf" and _gguf_header(path)[1]
    except Exception:  # noqa: BLE001 - unreadable: compile_model names the problem
        mixed = False
    quant = "q4f16_m" if mixed else DEFAULT_QUANTIZATION
    return f32_twin(quant) if getattr(family, "FLOAT16_OVERFLOWS", False) else quant


def _refuse_f16_overflow(family, quant: Quantization) -> None:
    if quant.needs_f16 and getattr(family, "FLOAT16_OVERFLOWS", False):
        from .models.decoder import UnsupportedConfig

        raise UnsupportedConfig(
            f"{family.NAME} models overflow float16 activations, so {quant.name} would "
            "compute inf/NaN; compile a float32 variant (q4f32_1, q8f32_1 or q0f32) instead.",
            param="quantization")


def build_module(family, cfg, quant: Quantization, max_param_bytes: int,
                 packing: Packing | None = None):
    """The family's model for ``cfg``: the module, its three exported Relax modules (prefill
    with the sampler, batched decode, single-sequence decode) and its named parameters.
    ``packing``: each linear's packing, where it is not ``quant`` (a mixed scheme)."""
    module = family.Model(cfg, quant, webgpu_target(), max_param_bytes=max_param_bytes)
    if packing is not None:
        requantize(module, packing)
    prefill_mod, named = module.export_tvm(spec={"forward": module.forward_spec()})
    if getattr(module, "task", "generate") == "embed":
        # an embedding model: forward returns pooled vectors; nothing samples or decodes
        return module, (prefill_mod,), named
    prefill_mod.update(_sampler_module(cfg.vocab_size))
    decode_mod, _ = module.export_tvm(spec={"decode": module.forward_spec(n="b")})
    # decode1 runs b == 1 only but keeps b symbolic, so that dlight pads its GEMVs to one row
    # (decode: to four) and they sum like decode's (lower.schedule_rules): one sequence's
    # tokens do not change when others join. (Run with b > 1, these one-row kernels gave
    # some rows wrong on lavapipe: the bound stays 1.)
    decode1_mod, _ = module.export_tvm(spec={"decode1": module.forward_spec(n="b")})
    return module, (prefill_mod, decode_mod, decode1_mod), named


def lower_module(module, modules, vocab_size: int, prefill_chunk_size: int, max_batch_size: int,
                 report: Progress, extra_tir: dict | None = None,
                 chosen: tuple[str, ...] | None = None):
    """Lower ``build_module``'s modules into the ``chosen`` kernel sets (compiler/targets/
    KERNEL_SETS; every one for None): the lowered plans, and each kernel set as the artifact
    stores it (compiler/targets/ ``build_all``: ``write_artifact``'s ``kernel_sets``).
    ``extra_tir``: TIR functions to compile beside the plans' (called by name)."""
    kinds = tuple(targets(chosen))
    report("lower (TVM)", 0, 3)
    bounds = {"n": prefill_chunk_size, "b": max_batch_size, "b1": max_batch_size + 1}
    if len(modules) == 1:  # an embedding model: its forward plan alone
        lowered = lower(modules[0], {"forward": bounds}, "prefill",
                        kernel_twins(module, None, kinds=kinds), extra_tir=extra_tir,
                        chosen=chosen)
        if "cpu" in lowered.sets:  # (its CPU kernels see batches of whole inputs only:
            lowered.sets["cpu"] = CpuSet({name: f.with_attr(WIDE_BATCHES, True)  # WIDE_BATCHES)
                                          for name, f in lowered.sets["cpu"].functions.items()})
        report("lower (TVM)", 3, 3)
        return lowered, build_all(lowered.sets, report, chosen)
    prefill_mod, decode_mod, decode1_mod = modules
    sampler_bounds = {"b": max_batch_size, "b1": max_batch_size + 1}
    lowered = lower(prefill_mod, {"forward": bounds, "sample": sampler_bounds,
                                  "process_logits": sampler_bounds, "logprobs": sampler_bounds},
                    "prefill", kernel_twins(module, vocab_size, kinds=kinds), extra_tir=extra_tir,
                    chosen=chosen)
    report("lower (TVM)", 1, 3)
    decode_twins = kernel_twins(module, vocab_size, decode=True, kinds=kinds)
    decode = lower(decode_mod, {"decode": {"b": max_batch_size, "b1": max_batch_size + 1}},
                   "decode", decode_twins, chosen=chosen)
    lowered = merge(lowered, decode, prefix="decode_")
    report("lower (TVM)", 2, 3)
    lowered = merge(lowered, lower(decode1_mod, {"decode1": {"b": 1, "b1": 2}}, "decode1",
                                   decode_twins, chosen=chosen), prefix="decode1_")
    report("lower (TVM)", 3, 3)
    return lowered, build_all(lowered.sets, report, chosen)


def artifact_header(*, model_id: str, quant: Quantization, key: str, model: dict, source: dict,
                    options: dict) -> dict:
    """The manifest fields beside kernels, plans and weights."""
    return {
        "model_id": model_id,
        "quantization": quant.name,
        "cache_key": key,
        "model": model,
        # what a device needs to run it, and the variants of the same weights that need less
        # (the engines name them in MissingFeatureError)
        "requires": {"features": ["shader-f16"] if quant.needs_f16 else [],
                     "fallback": [f32_twin(quant.name)] if quant.needs_f16 else []},
        "source": source,
        "compile_options": options,  # what `wick serve` reuses to build a sibling variant
        "compiler": compiler_stamp(),
    }


def _fetched_from_hub(model: str):
    """``model``'s files when it is an ``hf://`` URI or a built-in name whose registry entry
    names one (``"hf"``), downloaded or found in the cache; else None. A repo holding a
    compiled artifact is not compiled again."""
    from .hub import fetch, is_hub_uri
    from .sources import builtin_models

    uri = model if is_hub_uri(model) else builtin_models().get(model, {}).get("hf")
    if uri is None:
        return None
    fetched = fetch(uri)
    if fetched.kind == "artifact":
        raise InvalidRequestError(f"{model} holds a compiled wick artifact: `wick serve {model}` "
                                  "or `wick chat` runs it as it is", param="model")
    return fetched


def kernel_set_choice(kernel_sets) -> tuple[str, ...] | None:
    """A compile's ``kernel_sets`` as compiler/targets/ KERNEL_SETS names (None: every one),
    or an error naming the unknown one."""
    try:
        return chosen_kernel_sets(kernel_sets)
    except ValueError as e:
        raise InvalidRequestError(str(e), param="kernel_sets", code="unknown_kernel_set") from None


@readers_shared_within  # (a GGUF parsed once per compile, not kept after it)
def compile_model(
    model: str,
    quantization: str | None,
    *,
    output: Path | None = None,
    context_window: int | None = None,
    prefill_chunk_size: int = DEFAULT_PREFILL_CHUNK,
    max_batch_size: int = DEFAULT_MAX_BATCH,
    max_param_bytes: int = MAX_BINDING_BYTES,
    shard_max_bytes: int = SHARD_MAX_BYTES,
    force: bool = False,
    progress: Progress | None = None,
    kernel_sets=None,
) -> Path:
    """Compile ``model`` (built-in name, HF dir or .gguf) and return the artifact directory.
    ``quantization=None`` builds ``default_quantization(model)``.
    ``shard_max_bytes`` bounds the weight files (the unit a browser downloads, verifies and
    caches). ``kernel_sets``: build only these (compiler/targets/ KERNEL_SETS: e.g. webgpu
    and wasm for the browser alone; every one for None); a backend whose set is missing
    refuses the artifact with an error that says so."""
    chosen = kernel_set_choice(kernel_sets)
    from .sources import builtin_models, reading, resolve_source

    report = progress or (lambda stage, done, total: None)
    fetched = _fetched_from_hub(model)
    # a built-in's registry entry (default variant, sampling card) is found by its name
    entry_name = model if model in builtin_models() else None
    if fetched is not None:
        model = str(fetched.path)  # (its snapshot in huggingface_hub's cache, from now on)
    family = family_of(entry_name or model)  # (config or metadata only: read once)
    quant = get_quantization(quantization or default_quantization(entry_name or model, family))
    _refuse_f16_overflow(family, quant)  # before any download or hashing
    sweep_stale_builds(paths.artifacts_dir())
    if output is not None:
        sweep_stale_builds(Path(output).parent)
    report("resolve source", 0, 1)
    source = resolve_source(model, progress=progress)
    if fetched is not None:  # named by its repo, not by its snapshot's commit directory
        source = dataclasses.replace(source, name=fetched.repo_id)
    with reading(source.path):
        source_hash = source.content_hash()
    report("resolve source", 1, 1)
    options = {"context_window": context_window, "prefill_chunk_size": prefill_chunk_size,
               "max_batch_size": max_batch_size, "max_param_bytes": max_param_bytes,
               "shard_max_bytes": shard_max_bytes}
    if chosen is not None:  # (every set: the key artifacts compiled before had)
        options["kernel_sets"] = list(chosen)
    key = cache_key(source_hash, quant.name, options)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source.name).name.removesuffix(".gguf"))
    out = Path(output) if output else paths.artifacts_dir() / f"{slug}-{quant.name}-{key}"
    # where to find the source again (a sibling variant is built from it): a path, absolute
    origin = (fetched.origin if fetched is not None else model if model in builtin_models()
              else str(Path(model).expanduser().resolve()))
    if not force and _reusable(out, key, quiet=True):
        _note_source(out, origin)
        report("cached", 1, 1)
        return out
    with build_lock(out, lambda: log.warning("%s: another process is compiling it; waiting",
                                             out.name)):
        if not force and _reusable(out, key):  # (built by the one we waited for)
            _note_source(out, origin)
            report("cached", 1, 1)
            return out
        with reading(source.path):
            loaded = source.load(progress=progress)
            hf = loaded.config
            family = family_for(hf.get("model_type", "llama"))
            cfg = family.Config.from_hf(hf)
            _refuse_f16_overflow(family, quant)  # (a source family_of could not read ahead)
            converted = family.convert_weights(cfg, loaded.weights)
        window = min(context_window or cfg.context_window, cfg.context_window)

        report("build model", 0, 1)
        packing = mixed_plan(quant, loaded.source_dtypes) if quant.mixed else None
        module, modules, named = build_module(family, cfg, quant, max_param_bytes, packing)
        packing = packing or (lambda linear: quant)
        with reading(source.path):
            _check_weights(named, converted, packing, max_param_bytes)
        report("build model", 1, 1)
        lowered, built_sets = lower_module(module, modules, cfg.vocab_size, prefill_chunk_size,
                                           max_batch_size, report, chosen=chosen)
        names = [name for name, _ in named]
        header = artifact_header(
            model_id=source.name, quant=quant, key=key,
            model=_model_section(family.NAME, cfg, hf, loaded.tokenizer_config,
                                 context_window=window, prefill_chunk=prefill_chunk_size,
                                 max_batch=max_batch_size, quant=quant, kv_window=module.kv_window(),
                                 kv_window_pool=module.window_pool(),
                                 embedding=_embedding_section(module, cfg, hf, loaded.tokenizer_json,
                                                              prefill_chunk_size),
                                 sampling=_sampling_section(entry_name or model, hf)),
            source={"model": origin, "sha256": source_hash}, options=options)
        return write_artifact(out, header=header, lowered=lowered, params=_convert(names, converted, packing, max_param_bytes,
                                                                   source.path,
                                                                   {n: str(p.dtype) for n, p in named}),
                              num_params=len(names), tokenizer_json=loaded.tokenizer_json, progress=progress,
                              shard_max_bytes=shard_max_bytes, kernel_sets=built_sets)
