"""LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): RoPE whose frequencies are divided by a
per-dimension factor, ``short_factor`` for positions the model was pretrained on and
``long_factor`` past them, with cos/sin multiplied by an attention factor.

TVM has a longrope kernel, but it picks the factors by how many tokens the *step* has, which
in a batched engine is unrelated to where a sequence is. transformers picks them by the
sequence's length: a step whose highest position is ``>= original_max_position_embeddings``
uses the long factors. wick picks them per token by that token's own position, which gives
transformers' numbers whenever the prompt fits the pretrained length (prefill short, every
later token long, earlier keys staying as they were written: exactly what ``generate`` does
with a cache). A prompt already longer than that gets long factors from the pretrained length
on instead of for all its tokens: vLLM's trade-off as well, since the cache is never rewritten.

The factors are baked into the kernel as constants (a binary tree of selects over the
dimension: a table lookup without a buffer argument), so the kernel keeps ``fused_rope``'s
signature: (qkv: (n, hq + 2*hkv, d), positions: (n,)) -> q, k, v. Only the first
``rotary_dim`` dimensions rotate (partial rotary); the rest pass through.

YaRN (``rope_type: "yarn"``: OLMo 3, Qwen's long-context settings, gpt-oss, Ministral 3) is the
same kernel with one factor table for every position: each frequency is divided by 1 where it
turns often enough within the pretrained length to extrapolate, by ``factor`` where it turns
too rarely, and by a blend on a linear ramp between (``yarn_settings``); cos/sin are multiplied
by its attention factor.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from tvm import tirx
from tvm.script import tirx as T
from tvm.tirx import PrimFunc

from ..kernel_memo import built_once
from ..model_config import UnsupportedConfig


def longrope_settings(scaling: dict[str, Any], hf: dict[str, Any], rotary_dim: int
                      ) -> dict[str, Any]:
    """transformers' longrope parameters from a config: factors, the pretrained length (a
    top-level ``original_max_position_embeddings`` wins, as in transformers), and the attention
    factor (given, or sqrt(1 + ln(factor) / ln(pretrained length)))."""
    original = int(hf.get("original_max_position_embeddings")
                   or scaling.get("original_max_position_embeddings")
                   or hf.get("max_position_embeddings", 4096))
    factor = scaling.get("factor") or int(hf.get("max_position_embeddings", original)) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    short, long = scaling.get("short_factor"), scaling.get("long_factor")
    for name, values in (("short_factor", short), ("long_factor", long)):
        if not isinstance(values, (list, tuple)) or len(values) != rotary_dim // 2:
            raise UnsupportedConfig(f"longrope {name} must list {rotary_dim // 2} numbers "
                                    f"(half the rotary dimensions)")
    return {"rope_type": "longrope", "short_factor": tuple(float(f) for f in short),
            "long_factor": tuple(float(f) for f in long),
            "original_max_position_embeddings": original, "attention_factor": float(attention)}


def yarn_settings(scaling: dict[str, Any], hf: dict[str, Any], rotary_dim: int, theta: float
                  ) -> dict[str, Any]:
    """transformers' YaRN parameters from a config as this kernel's: one per-dimension factor
    table (the divisor its blended inverse frequency amounts to: 1 / (e + (1 - e) / factor),
    ``e`` the extrapolation ramp over ``beta_fast``..``beta_slow`` rotations) for short and long
    positions alike, and the attention factor (given, else from ``mscale``/``mscale_all_dim``,
    else 0.1 ln(factor) + 1)."""
    # (a top-level original_max_position_embeddings wins, as transformers' standardized
    # rope parameters have it)
    original = int(hf.get("original_max_position_embeddings")
                   or scaling.get("original_max_position_embeddings")
                   or hf.get("max_position_embeddings", 4096))
    factor = float(scaling.get("factor")
                   or int(hf.get("max_position_embeddings", original)) / original)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (rotary_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # (as transformers: no division by zero)
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolated = 1.0 - ramp.astype(np.float64)
    table = tuple(float(1.0 / (e + (1.0 - e) / factor)) for e in extrapolated)
    return {"rope_type": "yarn", "short_factor": table, "long_factor": table,
            "original_max_position_embeddings": original, "attention_factor": float(attention)}


def inverse_frequencies(theta: float, rotary_dim: int, factors: Sequence[float]) -> np.ndarray:
    """1 / (factor_i * theta^(2i / rotary_dim)) in float32, as transformers computes them."""
    exponent = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(rotary_dim)
    base = np.power(np.float32(theta), exponent, dtype=np.float32)
    return (np.float32(1.0) / (np.asarray(factors, np.float32) * base)).astype(np.float32)


def _lookup(index: tirx.PrimExpr, values: np.ndarray, lo: int = 0, hi: int | None = None):
    """values[index] for an index in [lo, hi) as a balanced tree of selects."""
    hi = len(values) if hi is None else hi
    if hi - lo == 1:
        return tirx.FloatImm("float32", float(values[lo]))
    mid = (lo + hi) // 2
    return tirx.Select(index < mid, _lookup(index, values, lo, mid), _lookup(index, values, mid, hi))


@built_once
def longrope_prim_func(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                       theta: float, rotary_dim: int, scaling: dict[str, Any]) -> PrimFunc:
    HQ, HKV, D, R = int(num_q_heads), int(num_kv_heads), int(head_dim), int(rotary_dim)
    HALF = R // 2
    FUSED = HQ + 2 * HKV
    ORIGINAL = int(scaling["original_max_position_embeddings"])
    ATTN = float(scaling["attention_factor"])
    short = inverse_frequencies(theta, R, scaling["short_factor"])
    long = inverse_frequencies(theta, R, scaling["long_factor"])

    def rope(x, s, h, d, pos):
        i = d % HALF
        inv = tirx.Select(pos >= ORIGINAL, _lookup(i, long), _lookup(i, short))
        angle = pos.astype("float32") * inv
        rotated = tirx.if_then_else(d < HALF, -x[s, h, d + HALF], x[s, h, d - HALF])
        value = (tirx.cos(angle) * ATTN) * x[s, h, d].astype("float32") + (
            tirx.sin(angle) * ATTN) * rotated.astype("float32")
        return value.astype(dtype)

    @T.prim_func(s_tir=True)
    def fused_rope_longrope(var_qkv: T.handle, var_positions: T.handle, var_q: T.handle,
                            var_k: T.handle, var_v: T.handle):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})
        n = T.int32()
        qkv = T.match_buffer(var_qkv, (n, FUSED, D), dtype)
        positions = T.match_buffer(var_positions, (n,), "int32")
        q = T.match_buffer(var_q, (n, HQ, D), dtype)
        k = T.match_buffer(var_k, (n, HKV, D), dtype)
        v = T.match_buffer(var_v, (n, HKV, D), dtype)
        for iters in T.grid(n, FUSED, D):
            with T.sblock("longrope"):
                s, h, d = T.axis.remap("SSS", iters)
                if h < HQ:
                    q[s, h, d] = T.if_then_else(d < R, rope(qkv, s, h, d, positions[s]),
                                                qkv[s, h, d])
                elif h < HQ + HKV:
                    k[s, h - HQ, d] = T.if_then_else(d < R, rope(qkv, s, h, d, positions[s]),
                                                     qkv[s, h, d])
                else:
                    v[s, h - HQ - HKV, d] = qkv[s, h, d]

    return fused_rope_longrope
