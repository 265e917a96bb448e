"""Mistral: the Llama decoder with sliding-window attention (``sliding_window``; v0.1: 4096
in a 32k context; later versions set none).

Semantics: HF transformers ``models/mistral/modeling_mistral.py``. Windowed layers run
window_attention.py's kernel; a sequence gives back the KV pages that fall behind the window
(every layer is windowed: engine/kv_cache.py).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import DecoderConfig, DecoderForCausalLM, fuse_layer_weights

NAME = "mistral"
HF_MODEL_TYPES = ("mistral",)
GGUF_ARCHITECTURES = ()  # llama.cpp writes Mistral checkpoints as "llama"
GGUF_PERMUTED_QK = True
GGUF_LAYER_NAMES: dict[str, str] = {}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        return super().from_hf(hf, sliding_window=hf.get("sliding_window"))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
