"""Artifacts of real model shapes without real weights (``wick compile --synthetic CONFIG``).

Benchmarks need a model's shapes, not its knowledge: an 8B model's kernels, plan and KV cache
are the same whatever its weights hold. A synthetic artifact is compiled from an HF
``config.json`` alone, like any other (every kernel set, the same plans), but carries no weight
shards: each parameter's manifest entry says how to fill it (``fill``: seed, low, high) and the
engine fills it on the device at load with ``synthetic_fill_<dtype>``, a kernel compiled into
every kernel set. So the artifact is a few MB to carry whatever the model's size, and a 16 GB
model loads in the time its memory takes to write.

The values are deterministic (a hash of the element's index and the parameter's seed) and
scaled so that activations stay finite through any number of layers: dense weights uniform with
variance 1/in (std 0.02 for embedding tables), quantized ones random codes whose scale and
minimum give the same mean 0 and variance, norms 1, biases 0. What such a model writes is noise
(its tokenizer is 256 bytes and three ChatML specials, so most ids it samples print nothing);
its speed is the real model's.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib
from pathlib import Path

from tvm.script import tirx as T

from ..engine.errors import InvalidRequestError
from . import paths
from .artifact_writer import write_artifact
from .quantization import GROUP_SIZE, Quantization, get_quantization

FILL_PREFIX = "synthetic_fill_"
EMBEDDING_STD = 0.02
# a ChatML template and a byte-level vocabulary: enough for `wick chat` and the API to run
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def fill_prim_func(dtype: str):
    """``synthetic_fill_<dtype>(out: (n,) dtype, spec: (4,) f32)``: element i gets
    ``low + (high - low) * u`` (``spec`` = seed, low, high), u in [0, 1) from a 32-bit hash of
    (i, seed); a uint32 output gets the hash's bits (random quantized codes). The hash is the
    same integer arithmetic on every target, so every backend fills the same values."""

    def hashed(i, seed):
        # (lowbias32 on index * golden ratio + seed * another odd constant)
        x = T.Cast("uint32", i) * T.uint32(0x9E3779B1) + seed * T.uint32(0x85EBCA77)
        x = T.bitwise_xor(x, T.shift_right(x, T.uint32(16))) * T.uint32(0x7FEB352D)
        x = T.bitwise_xor(x, T.shift_right(x, T.uint32(15))) * T.uint32(0x846CA68B)
        return T.bitwise_xor(x, T.shift_right(x, T.uint32(16)))

    @T.prim_func(s_tir=True)
    def fill(out_handle: T.handle, spec: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        n = T.int32()
        out = T.match_buffer(out_handle, (n,), dtype)
        for i in range(n):
            with T.sblock("fill"):
                vi = T.axis.spatial(n, i)
                T.reads(spec[0:3])
                T.writes(out[vi])
                if dtype == "uint32":
                    out[vi] = hashed(vi, T.Cast("uint32", spec[0]))
                else:
                    out[vi] = T.Cast(dtype, spec[1] + (spec[2] - spec[1]) * (
                        T.Cast("float32", T.shift_right(hashed(vi, T.Cast("uint32", spec[0])),
                                                        T.uint32(8))) * T.float32(1.0 / (1 << 24))))

    return fill.with_attr("global_symbol", FILL_PREFIX + dtype)


def fill_spec(name: str, shape: list[int], quant: Quantization) -> list[float]:
    """[seed, low, high] of one parameter (see the module's docstring)."""
    seed = float(zlib.crc32(name.encode()) & 0xFFFFFF)  # (exact in float32)
    if name.endswith(".weight_q"):
        return [seed, 0.0, 0.0]  # random codes 0..levels
    if name.endswith((".weight_scale", ".weight_min")):
        levels = quant.levels
        code_std = math.sqrt(((levels + 1) ** 2 - 1) / 12)  # of codes uniform in 0..levels
        fan_in = shape[-1] * GROUP_SIZE
        scale = 1.0 / (code_std * math.sqrt(fan_in))
        if "embed" in name:
            scale = EMBEDDING_STD / code_std
        value = scale if name.endswith("_scale") else -scale * levels / 2
        return [seed, value, value]
    if name.endswith(".bias"):
        return [seed, 0.0, 0.0]
    if len(shape) == 1:  # norm weights: the compiled norms multiply by w (Gemma's 1 + w too)
        return [seed, 1.0, 1.0]
    if len(shape) == 2:
        half = math.sqrt(3.0) * (EMBEDDING_STD if "embed" in name else 1 / math.sqrt(shape[1]))
        return [seed, -half, half]
    raise ValueError(f"no synthetic fill for parameter {name} of shape {shape}")


def _tokenizer_json() -> str:
    """Every byte a token, then the ChatML specials (ids 256..258)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return tok.to_str()


def read_config(config: str | Path) -> tuple[dict, str]:
    """The HF config (a config.json, or a directory holding one) and a name for it."""
    path = Path(config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        hf = json.loads(path.read_text())
    except OSError as e:
        raise InvalidRequestError(f"--synthetic needs an HF config.json: {config} "
                                  f"({e.strerror})", param="model") from None
    except ValueError as e:
        raise InvalidRequestError(f"{path} is not valid JSON: {e}", param="model") from None
    if not isinstance(hf, dict) or "model_type" not in hf:
        raise InvalidRequestError(f"{path} is not an HF model config (no model_type)",
                                  param="model")
    name = path.parent.name if path.name == "config.json" else path.stem
    return hf, re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def compile_synthetic(config: str | Path, quantization: str | None = None, *,
                      output: Path | None = None, context_window: int | None = None,
                      prefill_chunk_size: int = 256, max_batch_size: int = 32,
                      max_param_bytes: int | None = None, force: bool = False,
                      progress=None, kernel_sets=None) -> Path:
    """Compile the model ``config`` describes, with weights generated at load (only the
    ``kernel_sets`` given, as compile_model)."""
    from .compile import (DEFAULT_QUANTIZATION, _model_section, _reusable, artifact_header,
                          build_module, kernel_set_choice, lower_module)
    from .hf_source import raw_config
    from .models import family_for
    from .models.layers import MAX_BINDING_BYTES

    report = progress or (lambda stage, done, total: None)
    chosen = kernel_set_choice(kernel_sets)
    hf, name = read_config(config)
    hf = raw_config(hf)  # (an image-and-text config: its text model's; aliases read)
    quant = get_quantization(quantization or DEFAULT_QUANTIZATION)
    family = family_for(hf["model_type"])
    cfg = family.Config.from_hf(hf)
    if cfg.vocab_size < 256 + len(SPECIALS):
        raise InvalidRequestError(f"a synthetic model needs a vocabulary of at least "
                         f"{256 + len(SPECIALS)} tokens (its byte-level tokenizer)",
                                  param="model")
    max_param_bytes = max_param_bytes or MAX_BINDING_BYTES
    options = {"context_window": context_window, "prefill_chunk_size": prefill_chunk_size,
               "max_batch_size": max_batch_size, "max_param_bytes": max_param_bytes,
               "synthetic": True}
    if chosen is not None:
        options["kernel_sets"] = list(chosen)
    from .source_digest import compiler_digest

    key = hashlib.sha256(json.dumps([hf, quant.name, options, compiler_digest()],
                                    sort_keys=True).encode()).hexdigest()[:16]
    out = Path(output) if output else paths.artifacts_dir() / f"synthetic-{name}-{quant.name}-{key}"
    if not force and _reusable(out, key):  # (an intact artifact of this config and compiler)
        report("cached", 1, 1)
        return out

    report("build model", 0, 1)
    module, modules, named = build_module(family, cfg, quant, max_param_bytes)
    report("build model", 1, 1)
    dtypes = sorted({str(p.dtype) for _, p in named})
    lowered, built_sets = lower_module(module, modules, cfg.vocab_size, prefill_chunk_size,
                                       max_batch_size, report, chosen=chosen,
                                       extra_tir={FILL_PREFIX + d: fill_prim_func(d) for d in dtypes})
    fills = {n: fill_spec(n, [int(d) for d in p.shape], quant) for n, p in named}
    im_end = 256 + SPECIALS.index("<|im_end|>")
    window = min(context_window or cfg.context_window, cfg.context_window)
    model = _model_section(family.NAME, cfg, {**hf, "eos_token_id": im_end, "bos_token_id": None},
                           {"chat_template": CHATML}, context_window=window,
                           prefill_chunk=prefill_chunk_size, max_batch=max_batch_size,
                           quant=quant, kv_window=module.kv_window(),
                           kv_window_pool=module.window_pool())
    header = artifact_header(model_id=f"synthetic-{name}", quant=quant, key=key, model=model,
                             source={"model": str(Path(config).expanduser().resolve()),
                                     "synthetic": True},
                             options=options)
    header["synthetic"] = {"fill_functions": {d: FILL_PREFIX + d for d in dtypes}}
    return write_artifact(out, header=header, lowered=lowered, params=(), fills=fills,
                          num_params=len(named), tokenizer_json=_tokenizer_json(),
                          progress=progress, kernel_sets=built_sets)
