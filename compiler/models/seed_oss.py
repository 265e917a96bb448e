"""Seed-OSS (ByteDance Seed: Seed-OSS-36B Base/Instruct): the Llama decoder with biases on q, k
and v (``attention_bias``, on by default) but not on the output projection unless
``attention_out_bias`` says so, and ``mlp_bias``. Semantics: HF transformers
``models/seed_oss/modeling_seed_oss.py``.

GGUF: llama.cpp's ``seed_oss`` (q/k rows in the checkpoint's order; the norm before the MLP
under ``post_attention_norm``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import DecoderConfig, DecoderForCausalLM, config_value, fuse_layer_weights

NAME = "seed_oss"
HF_MODEL_TYPES = ("seed_oss",)
GGUF_ARCHITECTURES = ("seed_oss",)
GGUF_PERMUTED_QK = False
# (gguf-py's SEED_OSS names the norm before the MLP post_attention_norm, not ffn_norm)
GGUF_LAYER_NAMES = {"post_attention_norm.weight": "post_attention_layernorm.weight"}
DEFAULT_HEAD_DIM = 128  # transformers' SeedOssConfig default


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"attention_bias": "blk.0.attn_q.bias" in tensors,
            "attention_out_bias": "blk.0.attn_output.bias" in tensors}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if not hf.get("head_dim"):
            hf = {**hf, "head_dim": DEFAULT_HEAD_DIM}
        return super().from_hf(hf, qkv_bias=config_value(hf, "attention_bias", True, bool),
                               o_bias=config_value(hf, "attention_out_bias", False, bool),
                               mlp_bias=config_value(hf, "mlp_bias", False, bool))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
