"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with a
mixture-of-experts MLP (compiler/models/moe.py) beside a shared expert every token runs, scaled
by ``sigmoid(shared_expert_gate(x))``; the top ``num_experts_per_tok`` of a softmax, not
renormalized unless ``norm_topk_prob``.

Semantics: HF transformers ``models/qwen2_moe/modeling_qwen2_moe.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import qwen2
from .decoder import config_value, fuse_layer_weights
from .moe import GGUF_EXPERT_NAMES, MoeModel, MoeSettings, gguf_moe_config, moe_weights

NAME = "qwen2_moe"
HF_MODEL_TYPES = ("qwen2_moe",)
GGUF_ARCHITECTURES = ("qwen2moe",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = GGUF_EXPERT_NAMES


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """The experts and the shared one; not renormalized (llama.cpp's qwen2moe graph)."""
    return {**gguf_moe_config(key, tensors, key("block_count")), "norm_topk_prob": False}


class Config(qwen2.Config):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf)
        # (transformers' Qwen2MoeConfig defaults where a config names no width)
        c.extra["moe"] = MoeSettings.from_hf(
            hf, expert_size_key="moe_intermediate_size", expert_size_default=1408,
            shared_expert_size=config_value(hf, "shared_expert_intermediate_size", 5632, int))
        return c


Model = MoeModel


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**fuse_layer_weights(c, weights), **moe_weights(c, c.extra["moe"], weights)}
