"""GLM-4 (Zhipu AI / THUDM, the ``-hf`` checkpoints: glm-4-9b-chat-hf, GLM-Edge): the Llama
decoder with q/k/v biases, RoPE on adjacent pairs of the first half of each head
(``partial_rotary_factor`` 0.5 by default), and gate|up stored fused (``gate_up_proj``, as
Phi-3). Semantics: HF transformers ``models/glm/modeling_glm.py``.

The pairs become halves by reordering each q/k head's rotary rows (compiler/rope_rows.py), as
for ERNIE 4.5; the dimensions past the rotary ones stay in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rope_rows import qk_pairs_to_halves
from .decoder import (DecoderConfig, DecoderForCausalLM, config_value, fuse_layer_weights,
                      with_partial_rotary)

NAME = "glm"
HF_MODEL_TYPES = ("glm",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_PARTIAL_ROTARY = 0.5  # transformers' GlmConfig default
DEFAULT_HEAD_DIM = 128  # transformers' GlmConfig default
DEFAULT_EPS = 1.5625e-7  # transformers' GlmConfig default


def glm_config(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` with GLM's defaults where it is silent (head_dim, partial rotary)."""
    hf = with_partial_rotary(hf, DEFAULT_PARTIAL_ROTARY)
    return hf if hf.get("head_dim") else {**hf, "head_dim": DEFAULT_HEAD_DIM}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        hf = glm_config(hf)
        return super().from_hf(hf, qkv_bias=config_value(hf, "attention_bias", True, bool),
                               rms_norm_eps=config_value(hf, "rms_norm_eps", DEFAULT_EPS))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray], norms: tuple[str, ...] | None = None
                    ) -> dict[str, np.ndarray]:
    halves = qk_pairs_to_halves(weights, c.num_attention_heads, c.num_key_value_heads,
                                c.rotary_dim)
    return fuse_layer_weights(c, halves) if norms is None else fuse_layer_weights(c, halves,
                                                                                   norms=norms)
