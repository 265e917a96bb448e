"""OLMoE (AllenAI, OLMoE-1B-7B): the pre-norm Llama layer with OLMo 2's q/k norms over all
heads at once, q, k and v then clamped by ``clip_qkv`` where set, and a mixture-of-experts MLP
(compiler/models/moe.py): 64 experts of ``intermediate_size``, the top 8 of a softmax, not
renormalized unless ``norm_topk_prob``.

Semantics: HF transformers ``models/olmoe/modeling_olmoe.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import DecoderConfig, config_value, fuse_layer_weights, with_default_theta
from .moe import GGUF_EXPERT_NAMES, MoeModel, MoeSettings, gguf_moe_config, moe_weights
from .olmo import ClampedAttention
from .olmo2 import Olmo2Attention
from .qwen2 import check_no_window

NAME = "olmoe"
HF_MODEL_TYPES = ("olmoe",)
GGUF_ARCHITECTURES = ("olmoe",)
GGUF_PERMUTED_QK = False
QK_NORMS = {"attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight"}
GGUF_LAYER_NAMES = {**QK_NORMS, **GGUF_EXPERT_NAMES}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """The experts (of feed_forward_length); not renormalized (llama.cpp's olmoe graph)."""
    return {**gguf_moe_config(key, tensors, key("block_count")), "norm_topk_prob": False}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        hf = with_default_theta(hf, 10000.0)
        bias = bool(hf.get("attention_bias", False))
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias,
                            rms_norm_eps=config_value(hf, "rms_norm_eps", 1e-5))
        clip = hf.get("clip_qkv")
        c.extra["clip_qkv"] = None if clip is None else float(clip)
        c.extra["moe"] = MoeSettings.from_hf(hf, expert_size_key="intermediate_size",
                                             expert_size_default=2048)
        return c


class OlmoeAttention(ClampedAttention, Olmo2Attention):
    """OLMo 2's q/k norms, then the clamp (ClampedAttention's ``project`` around Olmo2's)."""


class Model(MoeModel):
    attention = OlmoeAttention


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**fuse_layer_weights(c, weights, extra=tuple(QK_NORMS.values())),
            **moe_weights(c, c.extra["moe"], weights)}
