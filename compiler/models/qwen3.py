"""Qwen3 (dense): the Llama decoder with an RMSNorm over each head of q and k before RoPE
(``q_norm``, ``k_norm``, weights of head_dim), no biases, head_dim independent of hidden size.
Chat checkpoints think in ``<think>...</think>`` first; the engine returns that part as
``reasoning_content`` (engine/reasoning.py).

Semantics: HF transformers ``models/qwen3/modeling_qwen3.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import DecoderConfig, DecoderForCausalLM, fuse_layer_weights
from .qwen2 import check_no_window

NAME = "qwen3"
HF_MODEL_TYPES = ("qwen3",)
GGUF_ARCHITECTURES = ("qwen3", "qwen3vl")  # (qwen3vl: Qwen3-VL's text model)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        bias = bool(hf.get("attention_bias", False))
        return super().from_hf(hf, qkv_bias=bias, o_bias=bias, qk_norm=True)


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights, extra=tuple(GGUF_LAYER_NAMES.values()))
