"""OPT (Meta's OPT-125m ... 66B, and their fine-tunes; vLLM's quick-start model): GPT-2's shape
(learned positions, no RoPE, LayerNorms with biases, a plain MLP, the head tied to the
embedding) with ReLU in the MLP, separate q/k/v projections and Linear weights. Its position
table has two rows before position 0 (transformers offsets the positions by 2): they are
dropped as the weights are read, so position p reads row p as GPT-2's does.

Semantics: HF transformers ``models/opt/modeling_opt.py``. Not supported: OPT-350m's layout
(norms after the blocks, ``do_layer_norm_before: false``, and an embedding narrower than the
model, ``word_embed_proj_dim``), and norms without weights. llama.cpp has no OPT architecture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model_config import UnsupportedConfig
from .decoder import (LayerwiseConfig, fuse_layer_weights, plain_activation, renamed_weights,
                      tied_head)
from .gpt2 import POSITIONS
from .gpt2 import Model as GPT2Model

NAME = "opt"
HF_MODEL_TYPES = ("opt",)
GGUF_ARCHITECTURES = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
POSITION_OFFSET = 2
# transformers' names -> the decoder's (the global final norm before the layers' own)
RENAMED = {"model.decoder.final_layer_norm.": "model.norm.", "model.decoder.": "model.",
           ".self_attn_layer_norm.": ".input_layernorm.",
           ".final_layer_norm.": ".post_attention_layernorm.", ".self_attn.out_proj.":
           ".self_attn.o_proj.", ".fc1.": ".mlp.up_proj.", ".fc2.": ".mlp.down_proj."}


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if not hf.get("do_layer_norm_before", True):
            raise UnsupportedConfig("OPT with its norms after the blocks (do_layer_norm_before: "
                                    "false, OPT-350m) is not supported")
        if (hf.get("word_embed_proj_dim") or hf["hidden_size"]) != hf["hidden_size"]:
            raise UnsupportedConfig("an OPT embedding narrower than the model "
                                    "(word_embed_proj_dim) is not supported")
        if not hf.get("layer_norm_elementwise_affine", True):
            raise UnsupportedConfig("OPT norms without weights are not supported")
        act = plain_activation(hf.get("activation_function", "relu"), "activation_function",
                               "OPT")
        bias = bool(hf.get("enable_bias", True))
        heads = int(hf["num_attention_heads"])
        c = super().from_hf(hf, layer_norm=True, rms_norm_eps=1e-5, qkv_bias=bias, o_bias=bias,
                            mlp_bias=bias, num_key_value_heads=heads,
                            tie_word_embeddings=tied_head(hf, True))
        n = c.num_hidden_layers
        c.extra.update(act=act, parallel=False, rope=[False] * n, sliding=[False] * n)
        return c


Model = GPT2Model


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # (files saved from OPTModel have no "model." prefix)
    named = {("model." + n if n.startswith("decoder.") else n): w for n, w in weights.items()}
    hf = renamed_weights(named, RENAMED)
    out = fuse_layer_weights(c, hf)
    out[POSITIONS] = hf[POSITIONS][POSITION_OFFSET:]
    return out
