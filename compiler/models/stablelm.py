"""StableLM (StableLM 2 1.6B/12B, StableLM-3B-4E1T, their Zephyr chat models): the Llama decoder
with LayerNorms (mean, variance and a bias) instead of RMSNorms, RoPE on the first quarter of
each head (``partial_rotary_factor``), biases on q, k and v where ``use_qkv_bias`` says, and,
where the config asks:

- ``use_parallel_residual`` (12B): attention and MLP read the same normed input and both add to
  the residual (``h + attn(ln(h)) + mlp(ln(h))``; no second norm) — ``ParallelLayer``, also
  Phi-2's layer;
- ``qk_layernorm`` (12B): a LayerNorm without bias over each head of q and k, each head with
  its own weights, before RoPE.

Semantics: HF transformers ``models/stablelm/modeling_stablelm.py``.

GGUF: llama.cpp's ``stablelm`` architecture (norm biases as ``*_norm.bias``; the per-head q/k
norm weights stacked into one (heads, head_dim) tensor, as its converter writes them).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, GatedMLP, Layer, block_norm,
                      fuse_layer_weights, layer_norm_eps, with_partial_rotary)
from .qwen2 import check_no_window

NAME = "stablelm"
HF_MODEL_TYPES = ("stablelm",)
GGUF_ARCHITECTURES = ("stablelm",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {
    "attn_q_norm.weight": "self_attn.q_layernorm.weight",
    "attn_k_norm.weight": "self_attn.k_layernorm.weight",
}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    # (llama.cpp's converter writes true where a config has no such key, and its loader goes by
    # whether the layers have a second norm: so does this)
    return {"use_parallel_residual": "blk.0.ffn_norm.weight" not in tensors,
            "layer_norm_eps": key("attention.layer_norm_epsilon"),
            "use_qkv_bias": "blk.0.attn_q.bias" in tensors,
            "qk_layernorm": "blk.0.attn_q_norm.weight" in tensors}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        c = super().from_hf(with_partial_rotary(hf, 0.25), layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "layer_norm_eps"),
                            qkv_bias=bool(hf.get("use_qkv_bias", False)))
        c.extra.update(parallel=bool(hf.get("use_parallel_residual", False)),
                       head_norms=bool(hf.get("qk_layernorm", False)))
        return c


class HeadLayerNorm(nn.Module):
    """A LayerNorm without bias over each head, every head with weights of its own."""

    def __init__(self, heads: int, head_dim: int, eps: float, dtype: str) -> None:
        self.head_dim, self.eps = head_dim, eps
        self.weight = nn.Parameter((heads, head_dim), dtype)

    def forward(self, x: Tensor) -> Tensor:  # (n, heads, head_dim)
        # (by hand: op.layer_norm without weights would put a vector of ones in the module as a
        # constant, which the step's plan cannot pass; in float32, as transformers' Cohere
        # computes it: a head's sum of squares can outgrow float16)
        x32 = op.astype(x, "float32")
        centered = x32 - op.sum(x32, axis=-1, keepdims=True) / self.head_dim
        variance = op.sum(centered * centered, axis=-1, keepdims=True) / self.head_dim
        normed = centered / op.sqrt(variance + self.eps)
        return op.astype(normed * op.astype(self.weight, "float32"), x.dtype)


class StableLmAttention(Attention):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, attn, quant)
        self.head_norms = c.extra["head_norms"]
        if self.head_norms:
            self.q_layernorm = HeadLayerNorm(self.num_q, c.head_dim, c.rms_norm_eps, quant.dtype)
            self.k_layernorm = HeadLayerNorm(self.num_kv, c.head_dim, c.rms_norm_eps, quant.dtype)

    def project(self, x: Tensor) -> Tensor:
        qkv = super().project(x)
        if not self.head_norms:
            return qkv
        q, k, v = op.split(qkv, [self.num_q, self.num_q + self.num_kv], axis=1)
        return op.concat([self.q_layernorm(q), self.k_layernorm(k), v], dim=1)


class ParallelLayer(nn.Module):
    """``h + attention(norm(h)) + mlp(norm(h))``: one norm, both blocks on its output."""

    def __init__(self, c: DecoderConfig, self_attn: nn.Module, mlp: nn.Module, dtype: str) -> None:
        self.input_layernorm = block_norm(c.hidden_size, c, dtype)
        self.self_attn = self_attn
        self.mlp = mlp

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        x = self.input_layernorm(h)
        return h + self.self_attn(x, pages, step) + self.mlp(x)


class StableLmLayer(Layer):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, attn, quant)
        self.self_attn = StableLmAttention(c, attn, quant)


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        if c.extra["parallel"]:
            return ParallelLayer(c, StableLmAttention(c, attn, quant), GatedMLP(c, quant),
                                 quant.dtype)
        return StableLmLayer(c, attn, quant)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    norms = ("input_layernorm.weight",) if c.extra["parallel"] else None
    out = fuse_layer_weights(c, weights, **({"norms": norms} if norms else {}))
    if c.extra["head_norms"]:
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}.self_attn."
            for name in ("q_layernorm", "k_layernorm"):
                out[p + name + ".weight"] = head_norm_weights(weights, p + name)
    return out


def head_norm_weights(weights: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """(heads, head_dim): HF's one LayerNorm a head (``.norms.H.weight``), or llama.cpp's
    stacked tensor under the module's name."""
    if prefix + ".weight" in weights:
        return weights[prefix + ".weight"]
    heads = sorted(int(n[len(prefix) + 7:].split(".")[0]) for n in weights
                   if n.startswith(prefix + ".norms."))
    return np.stack([weights[f"{prefix}.norms.{h}.weight"] for h in heads])
