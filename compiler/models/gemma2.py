"""Gemma 2: Gemma's decoder (gemma.py: norms scaled by ``1 + w``, the embedding by
``sqrt(hidden_size)``, GELU-tanh) with these changes, each matching HF transformers
``models/gemma2/modeling_gemma2.py``:

- four norms a layer: after attention and after the MLP too (``post_*``), before the residual;
- attention scores are scaled by ``query_pre_attn_scalar ** -0.5`` and soft-capped
  (``attn_logit_softcapping``), the final logits too (``final_logit_softcapping``);
- layers alternate sliding-window (even) and global (odd) attention (``layer_types``).

GGUF (llama.cpp) stores the norms already as ``1 + w``: ``gguf_tensor`` takes the one off so
that both sources reach ``convert_weights`` in HF's convention.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .decoder import (Attention, DecoderConfig, GatedMLP, effective_window, fuse_layer_weights,
                      rms_norm, tied_head)
from .gemma import Model as GemmaModel
from .gemma import gelu_tanh, gguf_tensor, norms_plus_one  # noqa: F401 (gguf_tensor: Gemma's)
from .paged_attention import AttentionSpec

NAME = "gemma2"
HF_MODEL_TYPES = ("gemma2",)
GGUF_ARCHITECTURES = ("gemma2",)
GGUF_PERMUTED_QK = False
# Gemma's residual stream outgrows float16 (Gemma-3-270m reaches ~1e5 by layer 12; transformers
# runs it in bf16 or f32): f16 variants would give inf/NaN, so compile refuses them
FLOAT16_OVERFLOWS = True
GGUF_LAYER_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight",
         "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")


def layer_types(hf: dict[str, Any], default: Callable[[int], bool]) -> list[bool]:
    """Per layer: True when it is a sliding-window layer (``layer_types``, else ``default``)."""
    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types:
        return [t == "sliding_attention" for t in types[:n]]
    return [default(i) for i in range(n)]


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"sliding_window": key("attention.sliding_window", None),
            "query_pre_attn_scalar": key("attention.key_length", None),
            "attn_logit_softcapping": key("attn_logit_softcapping", None),
            "final_logit_softcapping": key("final_logit_softcapping", None)}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf, sliding_window=hf.get("sliding_window"),
                            tie_word_embeddings=tied_head(hf, True))
        head_dim = c.head_dim
        c.extra.update(
            scale=float(hf.get("query_pre_attn_scalar") or head_dim) ** -0.5,
            attn_softcap=hf.get("attn_logit_softcapping"),
            final_softcap=hf.get("final_logit_softcapping"),
            sliding=layer_types(hf, lambda i: i % 2 == 0),
        )
        return c

    def attention(self, layer: int, dtype: str) -> AttentionSpec:
        sliding = self.extra["sliding"][layer]
        window = effective_window(self.sliding_window, self.context_window) if sliding else None
        return AttentionSpec(self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                             dtype, self.rope_theta, self.rope_scaling, scale=self.extra["scale"],
                             window=window, softcap=self.extra["attn_softcap"] or None)


class GemmaLayer(nn.Module):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        dtype = quant.dtype
        self.input_layernorm = rms_norm(c.hidden_size, c, dtype)
        self.self_attn = Attention(c, attn, quant)
        self.post_attention_layernorm = rms_norm(c.hidden_size, c, dtype)
        self.pre_feedforward_layernorm = rms_norm(c.hidden_size, c, dtype)
        self.mlp = GatedMLP(c, quant, act=gelu_tanh)
        self.post_feedforward_layernorm = rms_norm(c.hidden_size, c, dtype)

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), pages, step))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Model(GemmaModel):
    def make_layer(self, c, attn, quant):
        return GemmaLayer(c, attn, quant)

    def final_logits(self, logits: Tensor) -> Tensor:
        cap = self.config.extra.get("final_softcap")
        if not cap:
            return logits
        return op.tanh(logits / cap) * cap


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    extra = tuple(n for n in NORMS[2:]) + tuple(
        n for n in ("self_attn.q_norm.weight", "self_attn.k_norm.weight") if c.qk_norm)
    return norms_plus_one(fuse_layer_weights(c, weights, extra=extra))
