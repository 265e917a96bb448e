"""GPT-J (EleutherAI's GPT-J-6B and its fine-tunes: GPT4All-J, Pygmalion-6B): one LayerNorm
feeding a parallel attention and plain MLP (``h + attn(ln(h)) + mlp(ln(h))``,
Phi-2's layer), RoPE on adjacent pairs of each head's first ``rotary_dim``
dimensions (rows reordered to halves, compiler/rope_rows.py) at base 10000, no biases on the
attention, biases on the MLP and the LM head, GELU-tanh, an untied head. Semantics: HF
transformers ``models/gptj/modeling_gptj.py``; GPT-2-style config keys (``n_embd``...) are read
under the usual names (hf_source.with_aliases).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rope_rows import qk_pairs_to_halves
from .decoder import (DecoderConfig, fuse_layer_weights, layer_norm_eps, plain_activation,
                      renamed_weights, tied_head)
from .phi import Model as PhiModel

NAME = "gptj"
HF_MODEL_TYPES = ("gptj",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()  # (llama.cpp's converter has none)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_ROTARY_DIM = 64  # transformers' GPTJConfig default
# the checkpoint's module names -> the decoder's (applied in order)
RENAMED = {"transformer.wte.": "model.embed_tokens.", "transformer.h.": "model.layers.",
           "transformer.ln_f.": "model.norm.", ".ln_1.": ".input_layernorm.",
           ".attn.out_proj.": ".self_attn.o_proj.", ".attn.": ".self_attn.",
           ".mlp.fc_in.": ".mlp.up_proj.", ".mlp.fc_out.": ".mlp.down_proj."}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        act = plain_activation(hf.get("activation_function") or "gelu_new",
                               "activation_function", "GPT-J")
        head_dim = int(hf["hidden_size"]) // int(hf["num_attention_heads"])
        rotary = hf.get("rotary_dim", DEFAULT_ROTARY_DIM)
        # (exact: the usual key holds a factor; null rotates the whole head)
        hf = {**hf, "gguf_rotary_dim": head_dim if rotary is None else int(rotary)}
        c = super().from_hf(hf, layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "layer_norm_epsilon"),
                            mlp_bias=True, head_bias=True, tie_word_embeddings=tied_head(hf, False))
        c.extra["act"] = act
        return c


Model = PhiModel  # (Phi-2's: one norm before a parallel attention and plain MLP)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    named = renamed_weights(weights, RENAMED)
    halves = qk_pairs_to_halves(named, c.num_attention_heads, c.num_key_value_heads,
                                c.rotary_dim)
    return fuse_layer_weights(c, halves, norms=("input_layernorm.weight",))
