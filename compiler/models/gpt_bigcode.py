"""GPT-BigCode (StarCoder 1, StarCoderBase-1B/3B/7B, SantaCoder, tiny_starcoder, WizardCoder):
GPT-2 (gpt2.py: learned positions, LayerNorms, biases, plain GELU MLP, tied head) with
multi-query attention (``multi_query``: one key/value head for all query heads) and ``Linear``
projections (stored (out, in), unlike GPT-2's Conv1D).

With ``multi_query`` the fused projection is q | k | v already; without it, q, k and v are
interleaved per head (as GPT-NeoX's) and regrouped.

Semantics: HF transformers ``models/gpt_bigcode/modeling_gpt_bigcode.py``.

GGUF: llama.cpp's ``starcoder`` architecture (multi-query only, as its converter writes it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import gpt2
from .gpt_neox import regroup_qkv

NAME = "gpt_bigcode"
HF_MODEL_TYPES = ("gpt_bigcode",)
GGUF_ARCHITECTURES = ("starcoder",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = gpt2.GGUF_LAYER_NAMES
GGUF_GLOBAL_NAMES = gpt2.GGUF_GLOBAL_NAMES
QKV = (".attn.c_attn.weight", ".attn.c_attn.bias")


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {**gpt2.gguf_config(key, tensors), "activation_function": "gelu_pytorch_tanh",
            "multi_query": True}


class Config(gpt2.Config):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        hf = {"activation_function": "gelu_pytorch_tanh", **hf}
        c = super().from_hf(hf)
        c.extra["multi_query"] = bool(hf.get("multi_query", True))
        if c.extra["multi_query"]:
            c.num_key_value_heads = 1
        return c


Model = gpt2.Model


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not c.extra["multi_query"]:
        weights = {name: regroup_qkv(w, c.num_attention_heads) if name.endswith(QKV) else w
                   for name, w in weights.items()}
    return gpt2.convert_weights(c, weights, conv1d=False)
