"""Qwen2 / Qwen2.5 (and Qwen2.5-Coder): the Llama decoder with biases on q, k and v (not o),
usually an untied LM head, and a large (151,936) vocabulary.

Semantics: HF transformers ``models/qwen2/modeling_qwen2.py``. Its sliding window applies only
when ``use_sliding_window`` is true (no released checkpoint sets it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import DecoderConfig, DecoderForCausalLM, UnsupportedConfig, fuse_layer_weights

NAME = "qwen2"
HF_MODEL_TYPES = ("qwen2",)
GGUF_ARCHITECTURES = ("qwen2", "qwen2vl")  # (qwen2vl: Qwen2-VL/2.5-VL's text model)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}  # the q/k/v biases are common names


def check_no_window(hf: dict[str, Any]) -> None:
    if hf.get("use_sliding_window") and hf.get("sliding_window"):
        raise UnsupportedConfig("use_sliding_window=true (Qwen2-style per-layer windows) is "
                                "not supported yet")


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        return super().from_hf(hf, qkv_bias=True)


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
