"""Cohere's Command R family (``cohere``: Command R, Aya 23 and Aya Expanse): a parallel block
(attention and gated SiLU MLP both read one norm's output: stablelm.ParallelLayer), LayerNorms
without a bias, RoPE on adjacent pairs of each head's dimensions, logits multiplied by
``logit_scale``, the LM head tied to the embedding; with ``use_qk_norm`` a LayerNorm without
bias over each q and k head, each head with weights of its own (stablelm.HeadLayerNorm).

The pairs' rotation is the usual one on each q/k head's rows reordered even dimensions first
(rope_rows.qk_pairs_to_halves, as ERNIE 4.5's; the per-head norm weights move with them). The
norms run as LayerNorms whose bias is zero.

Semantics: HF transformers ``models/cohere/modeling_cohere.py``. Command R7B (``cohere2``)
builds on this module (cohere2.py).

GGUF: llama.cpp's ``command-r`` architecture (rows in the checkpoint's order; ``logit_scale``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from ..rope_rows import qk_pairs_to_halves
from .decoder import (DecoderConfig, DecoderForCausalLM, GatedMLP, fuse_layer_weights,
                      layer_norm_eps, tied_head)
from .qwen2 import check_no_window
from .stablelm import ParallelLayer, StableLmAttention

NAME = "cohere"
HF_MODEL_TYPES = ("cohere",)
GGUF_ARCHITECTURES = ("command-r",)
GGUF_PERMUTED_QK = False  # (the rows are the checkpoint's: convert_weights reorders them)
GGUF_LAYER_NAMES = {"attn_q_norm.weight": "self_attn.q_norm.weight",
                    "attn_k_norm.weight": "self_attn.k_norm.weight"}
NORMS = ("input_layernorm.weight",)


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"logit_scale": key("logit_scale", 1.0),
            "use_qk_norm": "blk.0.attn_q_norm.weight" in tensors,
            "layer_norm_eps": key("attention.layer_norm_epsilon")}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        return cohere_config(super().from_hf, hf)


def cohere_config(from_hf: Callable[..., DecoderConfig], hf: dict[str, Any],
                  **overrides: Any) -> DecoderConfig:
    """The config of Cohere's layer (Cohere 2's too), built by the base class's ``from_hf``."""
    bias = bool(hf.get("attention_bias", False))
    c = from_hf(hf, layer_norm=True, rms_norm_eps=layer_norm_eps(hf, "layer_norm_eps"),
                qkv_bias=bias, o_bias=bias,
                tie_word_embeddings=tied_head(hf, True),
                **overrides)
    c.extra.update(logit_scale=float(hf.get("logit_scale", 0.0625)),
                   head_norms=bool(hf.get("use_qk_norm", False)))
    return c


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return ParallelLayer(c, StableLmAttention(c, attn, quant), GatedMLP(c, quant),
                             quant.dtype)

    def final_logits(self, logits: Tensor) -> Tensor:
        return logits * self.config.extra["logit_scale"]


def convert_weights(c: DecoderConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    halves = qk_pairs_to_halves(weights, c.num_attention_heads, c.num_key_value_heads)
    for name, w in list(halves.items()):  # LayerNorms without a bias: a zero one
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            halves[name.removesuffix("weight") + "bias"] = np.zeros_like(w)
    out = fuse_layer_weights(c, halves, norms=NORMS)
    if c.extra["head_norms"]:
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}.self_attn."
            out[p + "q_layernorm.weight"] = halves[p + "q_norm.weight"]
            out[p + "k_layernorm.weight"] = halves[p + "k_norm.weight"]
    return out
