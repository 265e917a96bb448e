"""Command R7B (``cohere2``): Cohere's layer (cohere.py: a parallel block, LayerNorms without
bias, RoPE on adjacent pairs, ``logit_scale``) with windowed and global layers, three to one by
default (``layer_types``, else ``sliding_window_pattern``), RoPE on the windowed layers only.

Semantics: HF transformers ``models/cohere2/modeling_cohere2.py``.

GGUF: llama.cpp's ``cohere2`` architecture (the window as ``attention.sliding_window``; its
loader takes every fourth layer as global, as ``gguf_config`` does here).
"""

from __future__ import annotations

from typing import Any, Callable

from .cohere import GGUF_LAYER_NAMES, Model, cohere_config, convert_weights  # noqa: F401
from .decoder import DecoderConfig, LayerwiseConfig, config_value
from .gemma2 import layer_types

NAME = "cohere2"
HF_MODEL_TYPES = ("cohere2",)
GGUF_ARCHITECTURES = ("cohere2",)
GGUF_PERMUTED_QK = False  # (the rows are the checkpoint's: convert_weights reorders them)
PATTERN = 4  # a global layer after every three windowed ones


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"logit_scale": key("logit_scale", 1.0),
            "layer_norm_eps": key("attention.layer_norm_epsilon"),
            "sliding_window": key("attention.sliding_window", None),
            "sliding_window_pattern": PATTERN}


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> DecoderConfig:
        # (no sliding_window: transformers' 4096)
        window = config_value(hf, "sliding_window", 4096, int)
        c = cohere_config(super().from_hf, hf, sliding_window=window)
        pattern = int(hf.get("sliding_window_pattern") or PATTERN)
        sliding = layer_types(hf, lambda i: (i + 1) % pattern != 0)
        c.extra.update(sliding=sliding, rope=sliding)  # (no RoPE on the global layers)
        return c
