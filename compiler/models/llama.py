"""Llama family: Llama 2/3.x, TinyLlama, SmolLM2, InternLM3, and Llama-shaped checkpoints.

Semantics: HF transformers ``models/llama/modeling_llama.py``. ``attention_bias`` puts biases on
q, k, v and o; ``mlp_bias`` on the MLP; ``rope_type: "llama3"`` scales RoPE frequencies by band
(TVM's ``rope_freq_llama3``, the same formula as transformers' ``_compute_llama3_parameters``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import DecoderConfig, DecoderForCausalLM, fuse_layer_weights

NAME = "llama"
HF_MODEL_TYPES = ("llama", "smollm", "internlm3")  # (InternLM3: transformers runs it as Llama)
GGUF_ARCHITECTURES = ("llama",)
# llama.cpp's converter interleaves each head's q/k rows for Llama (gguf_source undoes it)
GGUF_PERMUTED_QK = True
GGUF_LAYER_NAMES: dict[str, str] = {}
# a "llama" file with experts is Mixtral (as llama.cpp's converter writes it)
GGUF_WITH_EXPERTS = "mixtral"


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if hf.get("model_type") == "internlm3":  # (its checkpoints name them qkv_bias, bias)
            hf = {"attention_bias": hf.get("qkv_bias", False), "mlp_bias": hf.get("bias", False),
                  **hf}
        bias = bool(hf.get("attention_bias", False))
        return super().from_hf(hf, qkv_bias=bias, o_bias=bias,
                               mlp_bias=bool(hf.get("mlp_bias", False)))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights)
