"""Helium (Kyutai: Helium-1 2B): the Llama decoder with RoPE on adjacent pairs of each head's
dimensions (as GLM and ERNIE 4.5: the rows are reordered to halves, compiler/rope_rows.py),
``attention_bias`` on q, k and v only, and an RMSNorm whose default epsilon is 1e-8.
Semantics: HF transformers ``models/helium/modeling_helium.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rope_rows import qk_pairs_to_halves
from .decoder import (DecoderConfig, DecoderForCausalLM, config_value, fuse_layer_weights,
                      with_default_theta)

NAME = "helium"
HF_MODEL_TYPES = ("helium",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_EPS = 1e-8  # transformers' HeliumConfig default
DEFAULT_HEAD_DIM = 128  # transformers' HeliumConfig default
DEFAULT_THETA = 100000.0  # transformers' HeliumConfig default


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if not hf.get("head_dim"):
            hf = {**hf, "head_dim": DEFAULT_HEAD_DIM}
        return super().from_hf(with_default_theta(hf, DEFAULT_THETA),
                               rms_norm_eps=config_value(hf, "rms_norm_eps", DEFAULT_EPS),
                               qkv_bias=config_value(hf, "attention_bias", False, bool),
                               mlp_bias=config_value(hf, "mlp_bias", False, bool))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(
        c, qk_pairs_to_halves(weights, c.num_attention_heads, c.num_key_value_heads))
