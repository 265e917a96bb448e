"""OLMo 2 (AllenAI): the Llama decoder with its norms moved after each block: a layer is
``h + norm(attention(h))``, then ``h + norm(mlp(h))`` (no norm before either), and q and k
each go through an RMSNorm over all their heads at once (``q_norm`` of num_heads * head_dim,
not Qwen3's per head) before RoPE. Semantics: HF transformers ``models/olmo2/modeling_olmo2.py``.

GGUF: llama.cpp's ``olmo2`` architecture (q/k rows as in the checkpoint; the norms as
``post_attention_norm`` and ``post_ffw_norm``). llama.cpp writes OLMo 3 under it too, with a
``sliding_window`` and a per-layer ``sliding_window_pattern``: such a file gets OLMo 3's
windowed layers (``Config`` takes the window wherever a config has one; olmo3.py).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, GatedMLP, LayerwiseConfig,
                      config_value, fuse_layer_weights, rms_norm, rope_by_kind, with_default_theta)
from .gemma2 import layer_types
from .qwen2 import check_no_window

NAME = "olmo2"
HF_MODEL_TYPES = ("olmo2",)
GGUF_ARCHITECTURES = ("olmo2",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
# a layer's norms (gguf_source checks a file has them; convert_weights copies them)
LAYER_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """An OLMo 3 file's window and which layers have it (none in an OLMo 2 file)."""
    pattern = key("attention.sliding_window_pattern", None)
    return {"sliding_window": key("attention.sliding_window", None),
            "layer_types": None if pattern is None else [
                "sliding_attention" if windowed else "full_attention" for windowed in pattern]}


class Config(LayerwiseConfig):
    """OLMo 2's layers are all global; with a ``sliding_window`` (OLMo 3), the layers
    ``layer_types`` names (else three of every four) are windowed, and RoPE scaling applies to
    the global layers only (``rope_by_kind``)."""

    DEFAULT_THETA = 10000.0  # transformers' (its config class's) where a config names none

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_no_window(hf)
        hf = with_default_theta(hf, cls.DEFAULT_THETA)
        bias = bool(hf.get("attention_bias", False))
        window = hf.get("sliding_window")
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias, sliding_window=window,
                            rms_norm_eps=config_value(hf, "rms_norm_eps", 1e-5))
        # each layer's kind (its RoPE); without a window no layer is masked
        # (LayerwiseConfig.attention), as transformers with sliding_window null
        c.extra.update(sliding=layer_types(hf, lambda i: window is not None and (i + 1) % 4 != 0),
                       rope_by_kind=rope_by_kind(hf, c.rotary_dim or c.head_dim,
                                                 default_theta=cls.DEFAULT_THETA))
        return c


class Olmo2Attention(Attention):
    def __init__(self, c: DecoderConfig, attn, quant) -> None:
        super().__init__(c, attn, quant)  # (qk_norm off: no per-head norms)
        self.q_norm = rms_norm(c.num_attention_heads * c.head_dim, c, quant.dtype)
        self.k_norm = rms_norm(c.num_key_value_heads * c.head_dim, c, quant.dtype)

    def project(self, x: Tensor) -> Tensor:
        n, d = x.shape[0], self.head_dim
        q, k, v = op.split(self.qkv_proj(x), [self.num_q * d, (self.num_q + self.num_kv) * d],
                           axis=1)
        qkv = op.concat([self.q_norm(q), self.k_norm(k), v], dim=1)
        return op.reshape(qkv, (n, self.num_q + 2 * self.num_kv, d))


class Olmo2Layer(nn.Module):
    """``attention``: the attention module's class (EXAONE 4 norms q/k per head)."""

    def __init__(self, c: DecoderConfig, attn, quant, attention: type = Olmo2Attention) -> None:
        self.self_attn = attention(c, attn, quant)
        self.post_attention_layernorm = rms_norm(c.hidden_size, c, quant.dtype)
        self.mlp = GatedMLP(c, quant)
        self.post_feedforward_layernorm = rms_norm(c.hidden_size, c, quant.dtype)

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(h, pages, step))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return Olmo2Layer(c, attn, quant)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, weights, norms=LAYER_NORMS,
                              extra=("self_attn.q_norm.weight", "self_attn.k_norm.weight"))
