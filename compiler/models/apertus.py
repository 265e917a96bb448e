"""Apertus (the Swiss AI Initiative's Apertus-8B/70B): the Llama decoder with an RMSNorm over
each head of q and k before RoPE (Qwen3's), a plain MLP ``down(xielu(up(x)))`` without
biases, llama3 RoPE scaling at base 12M by default, and its norms named
``attention_layernorm`` / ``feedforward_layernorm``.

xIELU (transformers' ``XIELUActivation``) has four scalars per layer in the checkpoint:
``alpha_p`` and ``alpha_n`` (trained, through a softplus), ``beta`` and ``eps``. They are
parameters of the compiled model (one value each a layer), the softplus taken at conversion:

    xielu(x) = a_p * x^2 + beta * x                              for x > 0
               (exp(min(x, eps)) - 1 - x) * a_n + beta * x        otherwise
    a_p = softplus(alpha_p),  a_n = beta + softplus(alpha_n)

Semantics: HF transformers ``models/apertus/modular_apertus.py`` and
``activations.XIELUActivation`` (its Python path). GGUF: llama.cpp's ``apertus`` (q/k rows as
the checkpoint has them), the scalars as per-layer arrays under ``apertus.xielu.*``, as stored
(ggml_xielu takes the softplus).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from ..model_config import UnsupportedConfig
from ..quantization import Quantization
from .decoder import (Attention, DecoderConfig, DecoderForCausalLM, SequentialLayer,
                      config_value, fuse_layer_weights, renamed_weights, with_default_theta)
from .layers import QLinear

NAME = "apertus"
HF_MODEL_TYPES = ("apertus",)
GGUF_ARCHITECTURES = ("apertus",)
GGUF_PERMUTED_QK = False  # (its converter is Llama's with undo_permute off)
GGUF_LAYER_NAMES = {
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
DEFAULT_THETA = 12000000.0  # transformers' ApertusConfig.default_theta
# ApertusConfig's RoPE where a config names none
DEFAULT_ROPE = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}
XIELU_SCALARS = ("alpha_p", "alpha_n", "beta", "eps")
RENAMED = {".attention_layernorm.": ".input_layernorm.",
           ".feedforward_layernorm.": ".post_attention_layernorm.", ".mlp.act_fn.": ".mlp.act."}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    """The xIELU scalars as the checkpoint stores them: an array of one value a layer, or one
    value for every layer (llama.cpp broadcasts it)."""
    layers = int(key("block_count"))
    scalars = {}
    for name in XIELU_SCALARS:
        value = key(f"xielu.{name}")
        scalars[name] = ([float(v) for v in value] if isinstance(value, (list, tuple))
                         else [float(value)] * layers)
    # (a file without rope_freqs has no scaling: llama.cpp applies none)
    return {"hidden_act": "xielu", "gguf_xielu": scalars, "names_rope": True}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if (hf.get("hidden_act") or "xielu") != "xielu":
            raise UnsupportedConfig(f"hidden_act {hf['hidden_act']!r} in an Apertus config is not "
                                    "supported (wick has xielu)")
        if not hf.get("names_rope"):  # (transformers then ignores a top-level rope_theta)
            hf = {**hf, "rope_scaling": DEFAULT_ROPE, "rope_theta": DEFAULT_THETA}
        hf = with_default_theta(hf, DEFAULT_THETA)
        bias = config_value(hf, "attention_bias", False, bool)
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias, qk_norm=True,
                            rms_norm_eps=config_value(hf, "rms_norm_eps", 1e-5))
        if hf.get("gguf_xielu"):
            c.extra["gguf_xielu"] = hf["gguf_xielu"]
        return c


class XIELU(nn.Module):
    """transformers' XIELUActivation, its scalars parameters (softplus taken at conversion)."""

    def __init__(self, dtype: str) -> None:
        self.alpha_p = nn.Parameter((1,), dtype)
        self.alpha_n = nn.Parameter((1,), dtype)
        self.beta = nn.Parameter((1,), dtype)
        self.eps = nn.Parameter((1,), dtype)

    def forward(self, x: Tensor) -> Tensor:
        linear = self.beta * x
        positive = self.alpha_p * x * x + linear
        clipped = op.minimum(x, op.broadcast_to(self.eps, x.shape))
        negative = (expm1(clipped) - x) * self.alpha_n + linear
        return op.where(op.greater(x, Tensor.from_scalar(0.0, x.dtype)), positive, negative)


def expm1(y: Tensor) -> Tensor:
    """exp(y) - 1 without exp(y) - 1's cancellation near 0 (y <= 0 here): 2t / (1 - t) with
    t = tanh(y / 2), as accurate as torch.expm1 in float16 too."""
    t = op.tanh(y * 0.5)
    return (t + t) / (t * -1.0 + 1.0)


class XIELUMLP(nn.Module):
    def __init__(self, c: DecoderConfig, quant: Quantization) -> None:
        self.up_proj = QLinear(c.hidden_size, c.intermediate_size, quant, bias=False)
        self.act = XIELU(quant.dtype)
        self.down_proj = QLinear(c.intermediate_size, c.hidden_size, quant, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return SequentialLayer(c, Attention(c, attn, quant), XIELUMLP(c, quant), quant.dtype)


def softplus(x: float) -> float:
    return float(np.logaddexp(0.0, x))


def xielu_scalars(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer's four xIELU parameters as the compiled model takes them, from the
    checkpoint's tensors or the GGUF's arrays (both as trained: the softplus taken here)."""
    out = {}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp.act."
        if "gguf_xielu" in c.extra:
            raw = {name: c.extra["gguf_xielu"][name][i] for name in XIELU_SCALARS}
        else:
            raw = {name: float(weights[p + name].reshape(-1)[0]) for name in XIELU_SCALARS}
        values = {"alpha_p": softplus(raw["alpha_p"]),
                  "alpha_n": raw["beta"] + softplus(raw["alpha_n"]),
                  "beta": raw["beta"], "eps": raw["eps"]}
        out.update({p + name: np.array([value], np.float32) for name, value in values.items()})
    return out


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    named = renamed_weights(weights, RENAMED)
    out = fuse_layer_weights(c, named, extra=tuple(GGUF_LAYER_NAMES.values()))
    out.update(xielu_scalars(c, named))
    return out
