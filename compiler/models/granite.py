"""Granite (IBM Granite 3.x, dense): the Llama decoder with four scalars of its own, each
matching HF transformers ``models/granite/modeling_granite.py``:

- the embedding is multiplied by ``embedding_multiplier``;
- attention scores are scaled by ``attention_multiplier`` (instead of ``head_dim ** -0.5``);
- each block's output is multiplied by ``residual_multiplier`` before the residual add;
- the logits are divided by ``logits_scaling``.

GGUF (llama.cpp's ``granite`` architecture) stores the four as ``embedding_scale``,
``attention.scale``, ``residual_scale`` and ``logit_scale``, and interleaves q/k rows as for
Llama.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, GatedMLP, SequentialLayer,
                      fuse_layer_weights)
from .paged_attention import AttentionSpec

NAME = "granite"
HF_MODEL_TYPES = ("granite",)
GGUF_ARCHITECTURES = ("granite",)
GGUF_PERMUTED_QK = True
GGUF_LAYER_NAMES: dict[str, str] = {}
# config.json key -> (GGUF key under "granite.", transformers' default)
MULTIPLIERS = {"embedding_multiplier": ("embedding_scale", 1.0),
               "attention_multiplier": ("attention.scale", 1.0),
               "residual_multiplier": ("residual_scale", 1.0),
               "logits_scaling": ("logit_scale", 1.0)}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {name: key(gguf_name, default) for name, (gguf_name, default) in MULTIPLIERS.items()}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        bias = bool(hf.get("attention_bias", False))
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias,
                            mlp_bias=bool(hf.get("mlp_bias", False)))
        c.extra.update({name: float(hf.get(name, default))
                        for name, (_, default) in MULTIPLIERS.items()})
        return c

    def attention(self, layer: int, dtype: str) -> AttentionSpec:
        return replace(super().attention(layer, dtype), scale=self.extra["attention_multiplier"])


class GraniteLayer(SequentialLayer):
    """``mlp``: the layer's MLP where it is not the gated one (Granite MoE's experts)."""

    def __init__(self, c: DecoderConfig, attn, quant, mlp: nn.Module | None = None) -> None:
        super().__init__(c, Attention(c, attn, quant), mlp or GatedMLP(c, quant), quant.dtype)
        self.residual_multiplier = c.extra["residual_multiplier"]

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        scale = self.residual_multiplier
        h = h + self.self_attn(self.input_layernorm(h), pages, step) * scale
        return h + self.mlp(self.post_attention_layernorm(h)) * scale


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return GraniteLayer(c, attn, quant)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids) * self.config.extra["embedding_multiplier"]

    def final_logits(self, logits: Tensor) -> Tensor:
        return logits / self.config.extra["logits_scaling"]


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
