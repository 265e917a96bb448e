"""OLMo (AllenAI's first: OLMo-1B/7B-hf, OLMo-7B-0424/0724-hf): the Llama decoder whose norms
are LayerNorms without weights or biases (epsilon 1e-5: run as LayerNorms of ones and zeros,
which ``convert_weights`` supplies), and whose q, k and v are clamped to ``clip_qkv`` where the
config sets it. Semantics: HF transformers ``models/olmo/modular_olmo.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, GatedMLP, SequentialLayer,
                      fuse_layer_weights)

NAME = "olmo"
HF_MODEL_TYPES = ("olmo",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
NORM_EPS = 1e-5  # OlmoLayerNorm's, fixed
NORMS = ("input_layernorm", "post_attention_layernorm")


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        bias = bool(hf.get("attention_bias", False))
        c = super().from_hf(hf, layer_norm=True, rms_norm_eps=NORM_EPS, qkv_bias=bias,
                            o_bias=bias)
        clip = hf.get("clip_qkv")
        c.extra["clip_qkv"] = None if clip is None else float(clip)
        return c


class ClampedAttention(Attention):
    """q, k and v clamped to [-clip, clip] after their projections, before RoPE."""

    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, attn, quant)
        self.clip = c.extra["clip_qkv"]

    def project(self, x: Tensor) -> Tensor:
        qkv = super().project(x)
        if self.clip is None:
            return qkv
        high = Tensor.from_scalar(self.clip, qkv.dtype)
        low = Tensor.from_scalar(-self.clip, qkv.dtype)
        return op.maximum(op.minimum(qkv, high), low)


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return SequentialLayer(c, ClampedAttention(c, attn, quant), GatedMLP(c, quant),
                               quant.dtype)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint has no norm parameters: each norm's weight is ones and its bias zeros."""
    ones = np.ones(c.hidden_size, np.float32)
    zeros = np.zeros(c.hidden_size, np.float32)
    with_norms = dict(weights)
    with_norms.update({"model.norm.weight": ones, "model.norm.bias": zeros})
    for i in range(c.num_hidden_layers):
        for norm in NORMS:
            with_norms[f"model.layers.{i}.{norm}.weight"] = ones
            with_norms[f"model.layers.{i}.{norm}.bias"] = zeros
    return fuse_layer_weights(c, with_norms)
