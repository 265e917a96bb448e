"""Jais 2 (Inception and MBZUAI's Arabic-English Jais-2 models): the Llama decoder with
LayerNorms (with biases), a plain squared-ReLU MLP ``down(relu(up(x))^2)`` and biases on every
projection by default (``attention_bias``, ``mlp_bias``). Semantics: HF transformers
``models/jais2/modular_jais2.py``.

GGUF: llama.cpp's ``jais2`` (its converter is the plain TextModel's: q/k rows as the checkpoint
has them, the LayerNorm epsilon and every bias under the usual names).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import (DecoderConfig, config_value, fuse_layer_weights, layer_norm_eps,
                      plain_activation)
from .gpt_neox import Model as NeoXModel

NAME = "jais2"
HF_MODEL_TYPES = ("jais2",)
GGUF_ARCHITECTURES = ("jais2",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"hidden_act": "relu2", "layer_norm_eps": key("attention.layer_norm_epsilon"),
            "attention_bias": "blk.0.attn_q.bias" in tensors,
            "mlp_bias": "blk.0.ffn_up.bias" in tensors}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        act = plain_activation(hf.get("hidden_act") or "relu2", "hidden_act", "Jais 2")
        bias = config_value(hf, "attention_bias", True, bool)
        c = super().from_hf(hf, layer_norm=True, rms_norm_eps=layer_norm_eps(hf, "layer_norm_eps"),
                            qkv_bias=bias, o_bias=bias,
                            mlp_bias=config_value(hf, "mlp_bias", True, bool))
        c.extra.update(act=act, parallel=False)
        return c


Model = NeoXModel  # (GPT-NeoX's decoder: a sequential layer with a plain MLP)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
