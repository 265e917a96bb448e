"""Hunyuan dense (Tencent's Hunyuan-0.5B/1.8B/4B/7B): the Llama decoder with an RMSNorm over
each head of q and k *after* RoPE (``query_layernorm``, ``key_layernorm``; Qwen3's come
before it), and RoPE's base stretched by a fixed NTK ``alpha``: the checkpoints say
``rope_scaling: {"type": "dynamic", "alpha": A}``, which transformers reads as the static base
``rope_theta * A ** (head_dim / (head_dim - 2))`` (its ``ntk_alpha``), plain RoPE at that base.

GGUF: llama.cpp's ``hunyuan-dense``, whose converter writes the stretched base itself as
``rope.freq_base`` (no alpha key): plain RoPE at that base, the q/k norms as ``attn_q_norm`` /
``attn_k_norm``, the rows as the checkpoint has them (NEOX RoPE, no permutation).

Semantics: HF transformers ``models/hunyuan_v1_dense/modular_hunyuan_v1_dense.py``. Not read:
cross-layer attention (``use_cla``, refused).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..hf_source import rope_settings
from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, GatedMLP, SequentialLayer,
                      UnsupportedConfig, fuse_layer_weights, rms_norm)

NAME = "hunyuan_v1_dense"
HF_MODEL_TYPES = ("hunyuan_v1_dense",)
GGUF_ARCHITECTURES = ("hunyuan-dense",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {
    "attn_q_norm.weight": "self_attn.query_layernorm.weight",
    "attn_k_norm.weight": "self_attn.key_layernorm.weight",
}
QK_NORMS = tuple(GGUF_LAYER_NAMES.values())


def ntk_alpha_theta(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` with a fixed-alpha "dynamic" scaling turned into the plain RoPE base it stands
    for (transformers' ``compute_ntk_alpha_rope_parameters``)."""
    theta, scaling = rope_settings(hf)
    if not scaling or scaling.get("rope_type") != "dynamic" or not scaling.get("alpha"):
        return hf
    heads = int(hf["num_attention_heads"])
    dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    base = theta * float(scaling["alpha"]) ** (dim / (dim - 2))
    return {**hf, "rope_theta": base, "rope_scaling": None, "rope_parameters": None}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if hf.get("use_cla"):
            raise UnsupportedConfig("Hunyuan's cross-layer attention (use_cla) is not supported")
        bias = bool(hf.get("attention_bias", False))
        # (transformers' Hunyuan MLP has no biases, whatever mlp_bias says)
        return super().from_hf(ntk_alpha_theta(hf), qkv_bias=bias, o_bias=bias, mlp_bias=False)


class HunyuanAttention(Attention):
    """Llama's attention, each q and k head RMS-normed after RoPE."""

    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, attn, quant)
        self.query_layernorm = rms_norm(c.head_dim, c, quant.dtype)
        self.key_layernorm = rms_norm(c.head_dim, c, quant.dtype)

    def forward(self, x, pages, step):
        normed = lambda q, k: (self.query_layernorm(q), self.key_layernorm(k))  # noqa: E731
        return self.o_proj(self.attn(self.project(x), pages, step, after_rope=normed))


class HunyuanLayer(SequentialLayer):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, HunyuanAttention(c, attn, quant), GatedMLP(c, quant), quant.dtype)


class Model(DecoderForCausalLM):
    def make_layer(self, c: DecoderConfig, attn, quant) -> HunyuanLayer:
        return HunyuanLayer(c, attn, quant)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights, extra=QK_NORMS)
