"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): Qwen3's attention (per-head
q/k norms) with a mixture-of-experts MLP in each layer (compiler/models/moe.py): softmax over
``num_experts``, the top ``num_experts_per_tok``, renormalized by ``norm_topk_prob``; the
layers ``mlp_only_layers`` names (and those off ``decoder_sparse_step``) a dense MLP of
``intermediate_size``.

Semantics: HF transformers ``models/qwen3_moe/modeling_qwen3_moe.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import qwen3
from .moe import GGUF_EXPERT_NAMES, MoeModel, MoeSettings, gguf_moe_config, moe_weights

NAME = "qwen3_moe"
HF_MODEL_TYPES = ("qwen3_moe",)
GGUF_ARCHITECTURES = ("qwen3moe",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {**qwen3.GGUF_LAYER_NAMES, **GGUF_EXPERT_NAMES}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """The experts; renormalized, as llama.cpp's qwen3moe graph always does (the file has no
    norm_topk_prob: Qwen3-MoE's configs set it)."""
    return {**gguf_moe_config(key, tensors, key("block_count")), "norm_topk_prob": True}


class Config(qwen3.Config):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf)
        c.extra["moe"] = MoeSettings.from_hf(hf, expert_size_key="moe_intermediate_size",
                                             expert_size_default=768)
        return c


Model = MoeModel


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**qwen3.convert_weights(c, weights), **moe_weights(c, c.extra["moe"], weights)}
