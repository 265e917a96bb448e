"""GPT-NeoX (EleutherAI's Pythia and GPT-NeoX-20B, RedPajama-INCITE, Dolly v2, the first
StableLM): LayerNorms with biases, RoPE on the first quarter of each head (``rotary_pct``),
biases on every projection, a plain MLP (``dense_4h_to_h(gelu(dense_h_to_4h(x)))``, GELU exact
for ``gelu``), an untied LM head, and by default a parallel block with two norms:
``h + attention(ln1(h)) + mlp(ln2(h))`` (``use_parallel_residual``; else the usual sequence).

The checkpoint's ``query_key_value`` holds q, k and v interleaved per head (head 0's q, k, v,
then head 1's...): ``convert_weights`` regroups it into wick's q|k|v, as llama.cpp's converter
does. Module names are the decoder's (``gpt_neox.embed_in`` -> ``model.embed_tokens``,
``attention.dense`` -> ``self_attn.o_proj``, ``embed_out`` -> ``lm_head``...).

Semantics: HF transformers ``models/gpt_neox/modeling_gpt_neox.py`` (the older config keys
``rotary_pct`` and ``rotary_emb_base`` read as it reads them).

GGUF: llama.cpp's ``gptneox`` architecture (q|k|v already regrouped in ``attn_qkv``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from ..model_config import UnsupportedConfig
from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, PlainMLP, block_norm,
                      fuse_layer_weights, layer_norm_eps, plain_activation, renamed_weights,
                      with_partial_rotary)

NAME = "gpt_neox"
HF_MODEL_TYPES = ("gpt_neox",)
GGUF_ARCHITECTURES = ("gptneox",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
}
# transformers' names (and the checkpoints' older ones) -> the decoder's
RENAMED = {"gpt_neox.embed_in.": "model.embed_tokens.", "gpt_neox.final_layer_norm.": "model.norm.",
           "gpt_neox.layers.": "model.layers.", "embed_out.": "lm_head.",
           ".attention.query_key_value.": ".self_attn.qkv_proj.",
           ".attention.dense.": ".self_attn.o_proj.", ".mlp.dense_h_to_4h.": ".mlp.up_proj.",
           ".mlp.dense_4h_to_h.": ".mlp.down_proj."}
INTERLEAVED_QKV = ".attention.query_key_value."


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"use_parallel_residual": bool(key("use_parallel_residual", True)),
            "layer_norm_eps": key("attention.layer_norm_epsilon"),
            "hidden_act": "gelu", "attention_bias": "blk.0.attn_qkv.bias" in tensors}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        hf = with_partial_rotary(hf, 0.25)  # (rotary_pct: hf_source.with_aliases)
        if hf.get("rope_scaling"):
            raise UnsupportedConfig("rope_scaling in a GPT-NeoX config is not supported")
        act = plain_activation(hf.get("hidden_act", "gelu"), "hidden_act", "GPT-NeoX")
        bias = bool(hf.get("attention_bias", True))
        heads = int(hf["num_attention_heads"])  # (no grouped heads: any other count is not its)
        c = super().from_hf(hf, layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "layer_norm_eps"), qkv_bias=bias,
                            o_bias=bias, mlp_bias=True, num_key_value_heads=heads)
        c.extra.update(act=act, parallel=bool(hf.get("use_parallel_residual", True)))
        return c


class NeoXLayer(nn.Module):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        self.parallel = c.extra["parallel"]
        self.input_layernorm = block_norm(c.hidden_size, c, quant.dtype)
        self.self_attn = Attention(c, attn, quant)
        self.post_attention_layernorm = block_norm(c.hidden_size, c, quant.dtype)
        self.mlp = PlainMLP(c, quant, c.extra["act"], bias=c.mlp_bias)

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        attended = self.self_attn(self.input_layernorm(h), pages, step)
        if self.parallel:
            return h + attended + self.mlp(self.post_attention_layernorm(h))
        h = h + attended
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return NeoXLayer(c, attn, quant)


def regroup_qkv(w: np.ndarray, heads: int) -> np.ndarray:
    """Per-head interleaved q|k|v rows (heads, 3, head_dim, ...) -> all q, all k, all v."""
    # (.copy(), C order: np.ascontiguousarray would read a lazy weight now)
    return w.reshape(heads, 3, -1, *w.shape[1:]).swapaxes(0, 1).copy().reshape(w.shape)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    regrouped = {name: regroup_qkv(w, c.num_attention_heads) if INTERLEAVED_QKV in name else w
                 for name, w in weights.items()}
    return fuse_layer_weights(c, renamed_weights(regrouped, RENAMED))
