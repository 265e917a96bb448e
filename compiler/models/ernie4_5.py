"""ERNIE 4.5 (Baidu; the dense models, e.g. ERNIE-4.5-0.3B): the Llama decoder whose RoPE
rotates adjacent pairs of a head's dimensions (0 with 1, 2 with 3, ...; GPT-J's and GLM's
"interleaved" layout) instead of its two halves, and ``use_bias`` on every projection.
Semantics: HF transformers ``models/ernie4_5/modeling_ernie4_5.py``.

The interleaved rotation is the usual one on a permuted head: ``convert_weights`` reorders each
q/k head's rows (and biases) even dimensions first, then odd ones (compiler/rope_rows.py, as
for llama.cpp's Llama files), and the attention scores, sums over a head's dimensions, are
the same in either order. GGUF (llama.cpp's ``ernie4_5``) stores the rows in the checkpoint's
order, so they go through the same conversion.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rope_rows import qk_pairs_to_halves
from .decoder import DecoderConfig, DecoderForCausalLM, fuse_layer_weights, tied_head

NAME = "ernie4_5"
HF_MODEL_TYPES = ("ernie4_5",)
GGUF_ARCHITECTURES = ("ernie4_5",)
GGUF_PERMUTED_QK = False  # (the rows are the checkpoint's: convert_weights reorders them)
GGUF_LAYER_NAMES: dict[str, str] = {}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        bias = bool(hf.get("use_bias", False))
        return super().from_hf(hf, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
                               tie_word_embeddings=tied_head(hf, True))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(
        c, qk_pairs_to_halves(weights, c.num_attention_heads, c.num_key_value_heads))
