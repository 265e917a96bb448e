"""SmolLM3: the Llama decoder where some layers have no RoPE ("NoPE": by default every fourth,
``no_rope_layers[i] == 0``), and, with ``use_sliding_window``, a window on the layers
``layer_types`` marks ``sliding_attention``. Semantics: HF transformers
``models/smollm3/modeling_smollm3.py``.

GGUF (llama.cpp's ``smollm3`` architecture) interleaves q/k rows as for Llama and stores no
layer list: llama.cpp takes every fourth layer as NoPE, transformers' default too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import DecoderForCausalLM, LayerwiseConfig, fuse_layer_weights, tied_head

NAME = "smollm3"
HF_MODEL_TYPES = ("smollm3",)
GGUF_ARCHITECTURES = ("smollm3",)
GGUF_PERMUTED_QK = True
GGUF_LAYER_NAMES: dict[str, str] = {}
NO_ROPE_INTERVAL = 4  # transformers' and llama.cpp's default: layers 3, 7, 11, ... have no RoPE


def rope_layers(hf: dict[str, Any]) -> list[bool]:
    """Per layer: whether it applies RoPE."""
    n = int(hf["num_hidden_layers"])
    listed = hf.get("no_rope_layers")
    if listed is not None:
        if len(listed) < n:
            from ..model_config import InvalidConfig

            raise InvalidConfig(f"'no_rope_layers' lists {len(listed)} layers; the model has {n}")
        return [bool(v) for v in listed[:n]]
    interval = int(hf.get("no_rope_layer_interval") or NO_ROPE_INTERVAL)
    return [(i + 1) % interval != 0 for i in range(n)]


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        bias = bool(hf.get("attention_bias", False))
        windowed = bool(hf.get("use_sliding_window")) and hf.get("sliding_window") is not None
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias,
                            mlp_bias=bool(hf.get("mlp_bias", False)),
                            sliding_window=hf.get("sliding_window") if windowed else None,
                            tie_word_embeddings=tied_head(hf, True))
        rope = rope_layers(hf)
        types = hf.get("layer_types")
        if types and len(types) < len(rope):
            from ..model_config import InvalidConfig

            raise InvalidConfig(f"'layer_types' lists {len(types)} layers; the model has "
                                f"{len(rope)}")
        # transformers' default: the NoPE layers are the windowed ones
        sliding = ([t == "sliding_attention" for t in types[:len(rope)]] if types
                   else [not r for r in rope])
        c.extra.update(rope=rope, sliding=[windowed and s for s in sliding])
        return c


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
