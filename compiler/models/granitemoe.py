"""Granite MoE (IBM Granite 3.0/3.1 1B-A400M and 3B-A800M): Granite's decoder and its four
multipliers (granite.py) with a mixture-of-experts MLP (compiler/models/moe.py): the top
``num_experts_per_tok`` of ``num_local_experts`` experts of ``intermediate_size``, weighted by
a softmax over the chosen ones' logits (the softmax over all, renormalized: the same). Its
checkpoints stack the experts already: ``block_sparse_moe.input_linear`` (gate rows, then up
rows, per expert), ``output_linear`` and the router ``router.layer``.

Semantics: HF transformers ``models/granitemoe/modeling_granitemoe.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn

from . import granite
from .decoder import fuse_layer_weights, renamed_weights
from .moe import GGUF_EXPERT_NAMES, MoeSettings, gguf_moe_config, layer_mlp, moe_weights

NAME = "granitemoe"
HF_MODEL_TYPES = ("granitemoe",)
GGUF_ARCHITECTURES = ("granitemoe",)
GGUF_PERMUTED_QK = True  # (llama.cpp's GraniteMoeModel is LlamaModel's)
GGUF_LAYER_NAMES = GGUF_EXPERT_NAMES
# the checkpoint's expert modules -> the names moe_weights reads (stacked as transformers 5's)
RENAMES = {"block_sparse_moe.input_linear.weight": "mlp.experts.gate_up_proj",
           "block_sparse_moe.output_linear.weight": "mlp.experts.down_proj",
           "block_sparse_moe.router.layer.weight": "mlp.gate.weight"}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {**granite.gguf_config(key, tensors),
            **gguf_moe_config(key, tensors, key("block_count"))}


class Config(granite.Config):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf)
        c.extra["moe"] = MoeSettings.from_hf(hf, expert_size_key="intermediate_size",
                                             expert_size_default=1024, normalize=True)
        return c


class Model(granite.Model):
    def layer_for(self, index, c, attn, quant) -> nn.Module:
        mlp = layer_mlp(c, c.extra["moe"], index, quant, max_bytes=self.max_param_bytes)
        return granite.GraniteLayer(c, attn, quant, mlp)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    weights = renamed_weights(weights, RENAMES)
    return {**fuse_layer_weights(c, weights), **moe_weights(c, c.extra["moe"], weights)}
