"""Gemma 3 (text): Gemma 2's layer (norms scaled by 1 + w, four norms a layer, GELU-tanh,
scaled embedding, ``query_pre_attn_scalar``) with an RMSNorm over each head of q and k, no
soft-capping, and five sliding-window layers to one global layer, each kind with its own RoPE
base (local ``rope_local_base_freq``, 10k; global ``rope_theta``, with ``rope_scaling``).

Semantics: HF transformers ``models/gemma3/modeling_gemma3.py`` (``Gemma3ForCausalLM``).
llama.cpp's GGUF has no key for the local base or the 5:1 pattern; it uses 10k and every
sixth layer global, as does ``gguf_config`` here.
"""

from __future__ import annotations

from typing import Any, Callable


# (Gemma 2's model, weight conversion and GGUF tensor reader, as they are)
from .gemma2 import GGUF_LAYER_NAMES as GEMMA2_LAYER_NAMES
from .gemma2 import Model, convert_weights, gguf_tensor, layer_types  # noqa: F401
from .decoder import DecoderConfig, effective_window, rope_by_kind, tied_head
from .paged_attention import AttentionSpec

NAME = "gemma3"
GLOBAL_THETA = 1_000_000.0  # transformers' for the global layers where a config names none
HF_MODEL_TYPES = ("gemma3_text",)
GGUF_ARCHITECTURES = ("gemma3",)
GGUF_PERMUTED_QK = False
# Gemma's residual stream outgrows float16 (Gemma-3-270m reaches ~1e5 by layer 12; transformers
# runs it in bf16 or f32): f16 variants would give inf/NaN, so compile refuses them
FLOAT16_OVERFLOWS = True
GGUF_LAYER_NAMES = {
    **GEMMA2_LAYER_NAMES,
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"sliding_window": key("attention.sliding_window", None),
            "query_pre_attn_scalar": key("attention.key_length", None),
            "rope_local_base_freq": 10000.0}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf, sliding_window=hf.get("sliding_window"), qk_norm=True,
                            tie_word_embeddings=tied_head(hf, True))
        pattern = int(hf.get("sliding_window_pattern") or 6)
        c.extra.update(
            scale=float(hf.get("query_pre_attn_scalar") or c.head_dim) ** -0.5,
            sliding=layer_types(hf, lambda i: (i + 1) % pattern != 0),
            rope=rope_by_kind(hf, c.rotary_dim or c.head_dim,
                              float(hf.get("rope_local_base_freq", 10000.0)),
                              default_theta=GLOBAL_THETA),
        )
        return c

    def attention(self, layer: int, dtype: str) -> AttentionSpec:
        sliding = self.extra["sliding"][layer]
        theta, scaling = self.extra["rope"][sliding]
        window = effective_window(self.sliding_window, self.context_window) if sliding else None
        return AttentionSpec(self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                             dtype, theta, scaling, scale=self.extra["scale"], window=window)
