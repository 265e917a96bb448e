"""Phi-3 / Phi-3.5 (mini): the Llama decoder whose checkpoints already store q|k|v fused
(``qkv_proj``) and gate|up fused (``gate_up_proj``), exactly the layout wick compiles.

Semantics: HF transformers ``models/phi3/modeling_phi3.py``. Its ``sliding_window`` (2047 in
Phi-3-mini-4k) masks every layer (window_attention.py). The 128k checkpoints and Phi-3.5 use
``longrope`` scaling (longrope.py); ``partial_rotary_factor`` (Phi-4-mini: 0.75) rotates the
first dimensions of each head only. Both come through DecoderConfig.from_hf; from GGUF, llama.cpp's
``rope_factors_long/short`` tensors and ``rope.dimension_count`` (gguf_source.py).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import DecoderConfig, DecoderForCausalLM, fuse_layer_weights

NAME = "phi3"
HF_MODEL_TYPES = ("phi3",)
GGUF_ARCHITECTURES = ("phi3",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {  # llama.cpp keeps Phi-3's fused projections fused
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    # llama.cpp writes 0 for "no window" (Phi-4)
    return {"sliding_window": key("attention.sliding_window", None) or None}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        return super().from_hf(hf, sliding_window=hf.get("sliding_window"))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
