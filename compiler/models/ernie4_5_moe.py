"""ERNIE 4.5 MoE (Baidu's ERNIE-4.5-21B-A3B, -300B-A47B, their -Base and -Thinking): ERNIE 4.5's
attention (RoPE on adjacent pairs, ``use_bias``) with mixture-of-experts MLPs
(compiler/models/moe.py) from layer ``moe_layer_start_index`` to ``moe_layer_end_index``, every
``moe_layer_interval``-th (dense MLPs elsewhere). The router chooses the top ``moe_k`` of the
softmax probabilities plus a per-expert ``e_score_correction_bias``, weighs them by the
probabilities alone, renormalized; ``moe_num_shared_experts`` shared experts (one MLP of that
many experts' width) run on every token, unscaled. ``use_bias`` puts a bias on the LM head too
(the dense ERNIE's has none), the head tied to the embedding or not.

GGUF: llama.cpp's ``ernie4_5-moe``: the experts stacked, the correction bias as ``exp_probs_b``,
the sparse layers by ``leading_dense_block_count`` and ``interleave_moe_layer_step`` (to the
last layer: no end key, as llama.cpp's graph), the shared experts as one ``*_shexp`` MLP.

Semantics: HF transformers ``models/ernie4_5_moe/modular_ernie4_5_moe.py``. Not read: the
multi-token-prediction layers (unused, as in transformers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from . import ernie4_5
from .decoder import config_value
from .moe import GGUF_EXPERT_NAMES, MoeModel, MoeSettings, moe_weights

NAME = "ernie4_5_moe"
HF_MODEL_TYPES = ("ernie4_5_moe",)
GGUF_ARCHITECTURES = ("ernie4_5-moe",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {**GGUF_EXPERT_NAMES,
                    "exp_probs_b.bias": "mlp.moe_statics.e_score_correction_bias"}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """ERNIE's config from llama.cpp's keys (Ernie4_5MoeModel.set_gguf_parameters; the expert
    counts under the common names, which Config reads too)."""
    config = {"num_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
              "moe_layer_start_index": key("leading_dense_block_count", 0),
              "moe_layer_interval": key("interleave_moe_layer_step", 1),
              "moe_num_shared_experts": key("expert_shared_count", 0)}
    if (width := key("expert_feed_forward_length", None)) is not None:
        config["moe_intermediate_size"] = width
    return config


class Config(ernie4_5.Config):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf)
        c.head_bias = bool(hf.get("use_bias", False))
        # (its own config names; transformers' attribute_map reads them as num_experts/_per_tok)
        named = {**hf, "num_experts": hf.get("moe_num_experts", hf.get("num_experts", 64)),
                 "num_experts_per_tok": hf.get("moe_k", hf.get("num_experts_per_tok", 6))}
        width = config_value(hf, "moe_intermediate_size", 1536, int)
        shared = config_value(hf, "moe_num_shared_experts", 2, int)
        settings = MoeSettings.from_hf(named, expert_size_key="moe_intermediate_size",
                                       expert_size_default=1536, normalize=True,
                                       shared_expert_size=width * shared)
        layers = c.num_hidden_layers
        start = config_value(hf, "moe_layer_start_index", 1, int)
        end = config_value(hf, "moe_layer_end_index", -1, int)
        end = layers - 1 if end == -1 else end
        interval = config_value(hf, "moe_layer_interval", 1, int)
        sparse = tuple((i + 1) % interval == 0 and start <= i <= end for i in range(layers))
        c.extra["moe"] = replace(settings, sparse_layers=sparse, shared_gated=False,
                                 selection_bias=True)
        return c


class Model(MoeModel):
    """With a tied head and ``use_bias``: the head's bias a parameter of its own (an untied
    head's is its linear's)."""

    def __init__(self, c, quant, target, **kwargs) -> None:
        super().__init__(c, quant, target, **kwargs)
        if c.tie_word_embeddings and c.head_bias:
            self.lm_head_bias = nn.Parameter((c.vocab_size,), quant.dtype)

    def final_logits(self, logits: Tensor) -> Tensor:
        if self.config.tie_word_embeddings and self.config.head_bias:
            return logits + op.astype(self.lm_head_bias, "float32")
        return logits


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {**ernie4_5.convert_weights(c, weights), **moe_weights(c, c.extra["moe"], weights)}
    if c.tie_word_embeddings and c.head_bias:
        out["lm_head_bias"] = weights["lm_head.bias"]
    return out
