"""Falcon (TII's Falcon-7B/40B/180B and their instruct models, Falcon2-11B): LayerNorms with
biases, RoPE over the whole head, a plain MLP (GELU exact by default), biases on every
projection only where ``bias`` says so (no released checkpoint), a tied LM head by default,
and three layer shapes:

- Falcon-7B (``multi_query``, ``parallel_attn``): one key/value head, one norm feeding a
  parallel attention and MLP (``h + attn(ln(h)) + mlp(ln(h))``, Phi-2's layer);
- Falcon-40B/180B (``new_decoder_architecture``): grouped key/value heads (``num_kv_heads``),
  a parallel block with a norm each (``ln_attn``, ``ln_mlp``: gpt_neox.NeoXLayer); Falcon2-11B's
  has one norm (``num_ln_in_parallel_attn`` 1);
- without ``parallel_attn``, the usual sequence of two blocks (gpt_neox.NeoXLayer).

The checkpoint's ``query_key_value`` holds, per key/value group, its query heads then its key
and its value head (the new layout; Falcon-7B's is the same with one group), or q, k and v
interleaved per head (the old layout without ``multi_query``): ``convert_weights`` regroups it
into wick's q|k|v. ALiBi (Falcon-RW) is refused.

Semantics: HF transformers ``models/falcon/modeling_falcon.py`` (``_split_heads``,
``FalconDecoderLayer``). GGUF: llama.cpp's ``falcon`` architecture.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn

from ..model_config import UnsupportedConfig
from .decoder import (DecoderConfig, fuse_layer_weights, layer_norm_eps, plain_activation,
                      renamed_weights, tied_head)
from .gpt_neox import NeoXLayer, regroup_qkv
from .phi import Model as PhiModel

NAME = "falcon"
HF_MODEL_TYPES = ("falcon",)
GGUF_ARCHITECTURES = ("falcon",)
GGUF_PERMUTED_QK = False
# (llama.cpp's converter writes q|k|v already ungrouped in attn_qkv. A 40B/180B file's two norms
# are gguf-py's: ln_mlp as attn_norm, ln_attn as attn_norm_2; gguf_norms puts them in place)
GGUF_SECOND_NORM = "gguf_attn_norm_2"
GGUF_LAYER_NAMES = {
    "attn_norm_2.weight": f"{GGUF_SECOND_NORM}.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
}
# the checkpoint's module names -> the decoder's (applied in order); the 40B's two norms are the
# NeoX layer's
RENAMED = {"transformer.word_embeddings.": "model.embed_tokens.",
           "transformer.h.": "model.layers.", "transformer.ln_f.": "model.norm.",
           ".ln_attn.": ".input_layernorm.", ".ln_mlp.": ".post_attention_layernorm.",
           ".self_attention.query_key_value.": ".self_attn.qkv_proj.",
           ".self_attention.dense.": ".self_attn.o_proj.",
           ".mlp.dense_h_to_4h.": ".mlp.up_proj.", ".mlp.dense_4h_to_h.": ".mlp.down_proj."}
FUSED_QKV = ".self_attention.query_key_value."  # (the checkpoint's layout, regrouped)


def layer_shape(hf: dict[str, Any]) -> str:
    """"one_norm" (a parallel block on one norm), "two_norms" (a parallel block, a norm each)
    or "sequential", as transformers' FalconDecoderLayer decides."""
    if hf.get("new_decoder_architecture"):
        norms = hf.get("num_ln_in_parallel_attn")
        return "one_norm" if norms is not None and int(norms) == 1 else "two_norms"
    return "one_norm" if hf.get("parallel_attn", True) else "sequential"


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """As llama.cpp's graph reads a falcon file: the key/value heads from head_count_kv (one
    for Falcon-7B), a second norm where the file has attn_norm_2 (40B/180B), else one."""
    return {"new_decoder_architecture": True,
            "num_kv_heads": int(key("attention.head_count_kv", 1)),
            "num_ln_in_parallel_attn": 2 if "blk.0.attn_norm_2.weight" in tensors else 1,
            "layer_norm_epsilon": key("attention.layer_norm_epsilon"),
            "bias": "blk.0.attn_qkv.bias" in tensors}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if hf.get("alibi"):
            raise UnsupportedConfig("Falcon with ALiBi positions (alibi: true, Falcon-RW) is not "
                                    "supported: wick's attention applies RoPE")
        act = plain_activation(hf.get("activation") or "gelu", "activation", "Falcon")
        heads = int(hf["num_attention_heads"])
        new_layout = bool(hf.get("new_decoder_architecture"))
        if new_layout or not hf.get("multi_query", True):
            kv_heads = int(hf.get("num_kv_heads") or heads)
        else:
            kv_heads = 1
        bias = bool(hf.get("bias", False))
        c = super().from_hf(hf, layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "layer_norm_epsilon"),
                            qkv_bias=bias, o_bias=bias, mlp_bias=bias,
                            num_key_value_heads=kv_heads, tie_word_embeddings=tied_head(hf, True))
        shape = layer_shape(hf)
        c.extra.update(act=act, shape=shape, parallel=shape != "sequential",
                       grouped_qkv=new_layout or bool(hf.get("multi_query", True)))
        return c


class Model(PhiModel):
    def make_layer(self, c, attn, quant) -> nn.Module:
        if c.extra["shape"] == "one_norm":  # (Phi-2's layer)
            return super().make_layer(c, attn, quant)
        return NeoXLayer(c, attn, quant)


def ungroup_qkv(w: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """Rows per key/value group (its ``heads / kv_heads`` query heads, its key, its value) ->
    all q, all k, all v."""
    group = w.reshape(kv_heads, heads // kv_heads + 2, -1, *w.shape[1:])
    q = group[:, :-2].reshape(-1, *w.shape[1:])
    k = group[:, -2].reshape(-1, *w.shape[1:])
    v = group[:, -1].reshape(-1, *w.shape[1:])
    return np.concatenate([q, k, v])


def gguf_norms(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A GGUF with two norms a layer: its attn_norm (read as input_layernorm) is the MLP's, its
    attn_norm_2 the attention's, as llama.cpp's falcon graph uses them."""
    if not any(f".{GGUF_SECOND_NORM}." in name for name in weights):
        return weights
    out = {}
    for name, w in weights.items():
        if ".input_layernorm." in name:
            name = name.replace(".input_layernorm.", ".post_attention_layernorm.")
        out[name.replace(f".{GGUF_SECOND_NORM}.", ".input_layernorm.")] = w
    return out


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    weights = gguf_norms(weights)
    regrouped = {name: (w if FUSED_QKV not in name
                        else ungroup_qkv(w, c.num_attention_heads, c.num_key_value_heads)
                        if c.extra["grouped_qkv"] else regroup_qkv(w, c.num_attention_heads))
                 for name, w in weights.items()}
    named = renamed_weights(regrouped, RENAMED)
    norms = ("input_layernorm.weight",) if c.extra["shape"] == "one_norm" else None
    return fuse_layer_weights(c, named, **({"norms": norms} if norms else {}))
