"""Arcee (Arcee AI's AFM-4.5B): the Llama decoder with a plain MLP, ``down(relu(up(x))^2)``
(Nemotron's squared ReLU, no gate). Semantics: HF transformers ``models/arcee/modular_arcee.py``.

GGUF: llama.cpp's ``arcee`` (its converter is Llama's: q/k rows interleaved per head, undone by
gguf_source).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import DecoderConfig, config_value, fuse_layer_weights, plain_activation
from .gpt_neox import Model as NeoXModel

NAME = "arcee"
HF_MODEL_TYPES = ("arcee",)
GGUF_ARCHITECTURES = ("arcee",)
GGUF_PERMUTED_QK = True
GGUF_LAYER_NAMES: dict[str, str] = {}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"hidden_act": "relu2"}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        act = plain_activation(hf.get("hidden_act") or "relu2", "hidden_act", "Arcee")
        bias = config_value(hf, "attention_bias", False, bool)
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias,
                            mlp_bias=config_value(hf, "mlp_bias", False, bool),
                            rms_norm_eps=config_value(hf, "rms_norm_eps", 1e-5))
        c.extra.update(act=act, parallel=False)
        return c


Model = NeoXModel  # (GPT-NeoX's decoder: a sequential layer with a plain MLP, RMSNorms here)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
