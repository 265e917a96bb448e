"""GLM-4-0414 (Zhipu AI: GLM-4-9B/32B-0414, GLM-Z1): GLM's layer (q/k/v biases, RoPE on
adjacent pairs of half of each head, gate|up fused) with a norm after each block as well as
before it: ``h + post_self_attn_layernorm(attention(input_layernorm(h)))``, then
``h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))``. Semantics: HF transformers
``models/glm4/modeling_glm4.py``.

GGUF: llama.cpp's ``glm4`` (rows in the checkpoint's order, gate|up as ``ffn_up``, the norms
after the blocks as ``post_attention_norm`` and ``post_ffw_norm``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from . import glm
from .decoder import Attention, DecoderForCausalLM, GatedMLP, rms_norm

NAME = "glm4"
HF_MODEL_TYPES = ("glm4",)
GGUF_ARCHITECTURES = ("glm4",)
GGUF_PERMUTED_QK = False  # (the rows are the checkpoint's: convert_weights reorders them)
GGUF_LAYER_NAMES = {
    "ffn_up.weight": "mlp.gate_up_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "post_attention_norm.weight": "post_self_attn_layernorm.weight",
    "post_ffw_norm.weight": "post_mlp_layernorm.weight",
}
LAYER_NORMS = ("input_layernorm.weight", "post_self_attn_layernorm.weight",
               "post_attention_layernorm.weight", "post_mlp_layernorm.weight")


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"attention_bias": "blk.0.attn_q.bias" in tensors}


class Config(glm.Config):
    pass


class Glm4Layer(nn.Module):
    def __init__(self, c, attn, quant) -> None:
        dtype = quant.dtype
        self.input_layernorm = rms_norm(c.hidden_size, c, dtype)
        self.self_attn = Attention(c, attn, quant)
        self.post_self_attn_layernorm = rms_norm(c.hidden_size, c, dtype)
        self.post_attention_layernorm = rms_norm(c.hidden_size, c, dtype)
        self.mlp = GatedMLP(c, quant)
        self.post_mlp_layernorm = rms_norm(c.hidden_size, c, dtype)

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        attended = self.self_attn(self.input_layernorm(h), pages, step)
        h = h + self.post_self_attn_layernorm(attended)
        return h + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(h)))


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return Glm4Layer(c, attn, quant)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return glm.convert_weights(c, weights, norms=LAYER_NORMS)
