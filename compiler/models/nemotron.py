"""Nemotron (NVIDIA's Nemotron-3/4, Minitron, Nemotron-Mini): the Llama decoder with LayerNorms
whose weights are stored as offsets from one (``LayerNorm1P``: ``convert_weights`` adds the one,
as for Gemma's norms), a plain MLP with squared ReLU (``down(relu(up(x))^2)``), RoPE on part of
each head (``partial_rotary_factor``, 0.5) and an untied head.

Semantics: HF transformers ``models/nemotron/modeling_nemotron.py`` (``norm_eps``).

GGUF: llama.cpp's ``nemotron`` architecture, which stores the norms already as ``1 + w``
(``gguf_tensor`` takes the one off, as for Gemma).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import (DecoderConfig, fuse_layer_weights, layer_norm_eps,
                      plain_activation, with_partial_rotary)
from .gemma import gguf_tensor, norms_plus_one  # noqa: F401 (gguf_tensor: the same undoing)
from .gpt_neox import Model as NeoXModel
from .qwen2 import check_no_window

NAME = "nemotron"
HF_MODEL_TYPES = ("nemotron",)
GGUF_ARCHITECTURES = ("nemotron",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"hidden_act": "relu2", "norm_eps": key("attention.layer_norm_epsilon")}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        act = plain_activation(hf.get("hidden_act", "relu2"), "hidden_act", "Nemotron")
        bias = bool(hf.get("attention_bias", False))
        c = super().from_hf(with_partial_rotary(hf, 0.5), layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "norm_eps"), qkv_bias=bias,
                            o_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)))
        c.extra.update(act=act, parallel=False)
        return c


Model = NeoXModel  # (GPT-NeoX's: the decoder with its layer)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return norms_plus_one(fuse_layer_weights(c, weights))
