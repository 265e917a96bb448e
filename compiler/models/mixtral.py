"""Mixtral (8x7B, 8x22B): Mistral's decoder with a mixture-of-experts MLP in every layer
(compiler/models/moe.py): ``num_local_experts`` experts of ``intermediate_size``, the top
``num_experts_per_tok`` (2) of a softmax over them, renormalized. Its checkpoints name a layer's
MLP ``block_sparse_moe`` and an expert's gate, down and up projections ``w1``, ``w2``, ``w3``.

Semantics: HF transformers ``models/mixtral/modeling_mixtral.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import mistral
from .decoder import fuse_layer_weights, renamed_weights
from .moe import GGUF_EXPERT_NAMES, MoeModel, MoeSettings, gguf_moe_config, moe_weights

NAME = "mixtral"
HF_MODEL_TYPES = ("mixtral",)
GGUF_ARCHITECTURES = ()  # llama.cpp writes Mixtral as "llama" with experts (llama.py)
GGUF_PERMUTED_QK = True
GGUF_LAYER_NAMES = GGUF_EXPERT_NAMES


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """The experts (of feed_forward_length; renormalized, as llama.cpp's graph and Mixtral
    always do). LlamaModel's converter writes no window."""
    return gguf_moe_config(key, tensors, key("block_count"))

# the checkpoint's MLP and expert projections -> the names the other MoE families have
RENAMES = {"block_sparse_moe.": "mlp.", ".w1.": ".gate_proj.", ".w2.": ".down_proj.",
           ".w3.": ".up_proj."}


class Config(mistral.Config):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf)
        c.extra["moe"] = MoeSettings.from_hf(hf, expert_size_key="intermediate_size",
                                             expert_size_default=14336, normalize=True)
        return c


Model = MoeModel


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    weights = renamed_weights(weights, RENAMES)
    return {**fuse_layer_weights(c, weights), **moe_weights(c, c.extra["moe"], weights)}
