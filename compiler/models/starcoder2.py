"""StarCoder2 (BigCode's 3B/7B/15B code models): the Mistral-style decoder (GQA, RoPE on whole
heads, a sliding window on every layer) with GPT-NeoX's sequential layer: LayerNorms with
biases, biases on every projection (``use_bias``) and a plain MLP (``c_proj(gelu(c_fc(x)))``,
GELU with the tanh approximation).

Semantics: HF transformers ``models/starcoder2/modeling_starcoder2.py`` (``norm_epsilon``).

GGUF: llama.cpp's ``starcoder2`` architecture (its loader keeps no window: a GGUF's window is
read where the file has one).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .decoder import (DecoderConfig, fuse_layer_weights, layer_norm_eps,
                      plain_activation, renamed_weights, tied_head)
from .gpt_neox import Model as NeoXModel

NAME = "starcoder2"
HF_MODEL_TYPES = ("starcoder2",)
GGUF_ARCHITECTURES = ("starcoder2",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
RENAMED = {".mlp.c_fc.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"sliding_window": key("attention.sliding_window", None) or None,
            "use_bias": "blk.0.attn_q.bias" in tensors, "hidden_act": "gelu_pytorch_tanh",
            "norm_epsilon": key("attention.layer_norm_epsilon")}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        act = plain_activation(hf.get("hidden_act", "gelu_pytorch_tanh"), "hidden_act",
                               "StarCoder2")
        bias = bool(hf.get("use_bias", True))
        c = super().from_hf(hf, layer_norm=True, rms_norm_eps=layer_norm_eps(hf, "norm_epsilon"),
                            qkv_bias=bias,
                            o_bias=bias, mlp_bias=bias, sliding_window=hf.get("sliding_window"),
                            tie_word_embeddings=tied_head(hf, True))
        c.extra.update(act=act, parallel=False)
        return c


Model = NeoXModel  # (GPT-NeoX's: the decoder with its layer)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, renamed_weights(weights, RENAMED))
