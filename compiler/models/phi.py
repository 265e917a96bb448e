"""Phi-1, Phi-1.5 and Phi-2 (Microsoft; ``model_type: phi``): a parallel block (attention and MLP
both read one LayerNorm's output and add to the residual: stablelm.ParallelLayer), RoPE on the
first part of each head (``partial_rotary_factor``, 0.4 in Phi-2), biases on every projection
and on the LM head, and a plain MLP (``fc2(gelu(fc1(x)))``, GELU with the tanh approximation
for ``gelu_new``), with a LayerNorm at the end.

Semantics: HF transformers ``models/phi/modeling_phi.py``. Its modules are renamed to the
decoder's as the weights are read (``dense`` -> ``o_proj``, ``fc1``/``fc2`` -> ``up_proj``/
``down_proj``, ``final_layernorm`` -> ``norm``), so that a GGUF's common names fit too.

GGUF: llama.cpp's ``phi2`` architecture (biases under llama.cpp's names; q/k/v separate, or the
original checkpoint's fused ``attn_qkv``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn

from ..model_config import UnsupportedConfig
from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, PlainMLP, fuse_layer_weights,
                      layer_norm_eps, plain_activation, renamed_weights, with_partial_rotary)
from .qwen2 import check_no_window
from .stablelm import ParallelLayer

NAME = "phi"
HF_MODEL_TYPES = ("phi",)
GGUF_ARCHITECTURES = ("phi2",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
}
# transformers' module names -> the decoder's (the GGUF names already map to the latter)
RENAMED = {".self_attn.dense.": ".self_attn.o_proj.", ".mlp.fc1.": ".mlp.up_proj.",
           ".mlp.fc2.": ".mlp.down_proj.", "model.final_layernorm.": "model.norm."}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"hidden_act": "gelu_new", "layer_norm_eps": key("attention.layer_norm_epsilon")}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        if hf.get("qk_layernorm"):
            raise UnsupportedConfig("qk_layernorm=true in a Phi config (no released Phi-1/1.5/2 "
                                    "checkpoint sets it) is not supported")
        act = plain_activation(hf.get("hidden_act", "gelu_new"), "hidden_act", "Phi")
        c = super().from_hf(with_partial_rotary(hf, 0.5), layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "layer_norm_eps"), qkv_bias=True,
                            o_bias=True, mlp_bias=True, head_bias=True)
        c.extra["act"] = act
        return c


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return ParallelLayer(c, Attention(c, attn, quant),
                             PlainMLP(c, quant, c.extra["act"], bias=c.mlp_bias), quant.dtype)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, renamed_weights(weights, RENAMED),
                              norms=("input_layernorm.weight",))
