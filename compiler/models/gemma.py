"""Gemma (the first generation, and CodeGemma): the Llama decoder with Gemma's three changes,
each matching HF transformers ``models/gemma/modeling_gemma.py``:

- RMSNorm scales by ``1 + w`` (the weights are stored as offsets from one): ``convert_weights``
  adds the one, so the compiled norm is the usual ``x * rsqrt(mean(x^2) + eps) * w``;
- the embedding is multiplied by ``sqrt(hidden_size)`` (rounded to the activations' dtype);
- the MLP's activation is GELU with the tanh approximation (a config's legacy ``"gelu"`` means
  it too, as transformers reads it).

The LM head is the embedding. Gemma 2 and 3 build on these pieces (gemma2.py).

GGUF: llama.cpp's ``gemma`` architecture stores the norms already as ``1 + w``: ``gguf_tensor``
takes the one off so that both sources reach ``convert_weights`` in HF's convention.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from .decoder import (DecoderConfig, DecoderForCausalLM, GatedMLP, Layer, fuse_layer_weights,
                      gelu_tanh, tied_head)
from .qwen2 import check_no_window

NAME = "gemma"
HF_MODEL_TYPES = ("gemma",)
GGUF_ARCHITECTURES = ("gemma",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}  # a pre-norm layer's two norms: the common names
# Gemma's residual stream outgrows float16 (transformers runs it in bf16 or f32): f16 variants
# would give inf/NaN, so compile refuses them
FLOAT16_OVERFLOWS = True


def gguf_tensor(name: str, array: np.ndarray) -> np.ndarray:
    return array - 1.0 if name.endswith("norm.weight") else array


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        return super().from_hf(hf, tie_word_embeddings=tied_head(hf, True))


class GemmaLayer(Layer):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, attn, quant)
        self.mlp = GatedMLP(c, quant, act=gelu_tanh)


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return GemmaLayer(c, attn, quant)

    def embed(self, input_ids: Tensor) -> Tensor:
        # HF multiplies by sqrt(hidden) rounded to the activations' dtype
        scale = float(np.array(self.config.hidden_size**0.5, dtype=self.quant.dtype))
        return self.model.embed_tokens(input_ids) * scale


def norms_plus_one(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``weights`` with every norm's ``w`` made ``1 + w`` (Gemma's norms scale by it)."""
    return {name: w.astype(np.float32) + np.float32(1.0) if name.endswith("norm.weight") else w
            for name, w in weights.items()}


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return norms_plus_one(fuse_layer_weights(c, weights))
