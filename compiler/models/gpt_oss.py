"""GPT-OSS (OpenAI's gpt-oss-20b and gpt-oss-120b): a mixture-of-experts decoder whose layers
alternate between a 128-token sliding window and global attention (``layer_types``), with

* an attention sink per head: a learned logit in every query's softmax that takes a share of
  the weight and gives no value (paged_attention.py ``AttentionSpec.sinks``; every layer runs
  window_attention.py's kernel, which has it);
* biases on q, k, v and o, YaRN RoPE (rotate-half) on every layer;
* a router with a bias; the top ``num_experts_per_tok`` of its scores, weighted by the softmax
  of those scores alone (= the softmax over all, renormalized over the chosen);
* experts with biases and a clamped gate: ``(clip(up, -L, L) + 1) * g * sigmoid(1.702 g)``,
  ``g = min(gate, L)``, L = ``swiglu_limit`` (moe.py ``clamped_swiglu``). A checkpoint
  interleaves each expert's gate and up columns (gate at even ones); they are split here.

Checkpoints: OpenAI's store the experts in MXFP4 (``*_blocks``: two 4-bit E2M1 codes a byte,
32 a block; ``*_scales``: one power-of-two exponent a block, biased by 127), read here into
floats (``mxfp4_floats``, the same values as transformers' ``convert_moe_packed_tensors``);
transformers' own saves hold them as float matrices ``(E, in, out)``. Semantics: HF transformers
``models/gpt_oss/modeling_gpt_oss.py``.

GGUF: llama.cpp's ``gpt-oss`` (its converter's names: the sinks ``attn_sinks``, the router
``ffn_gate_inp`` with a bias, gate and up split into ``ffn_gate_exps`` / ``ffn_up_exps`` with
their biases, or fused gate-then-up as ``ffn_gate_up_exps``; MXFP4 experts dequantized by
gguf-py). Windowed layers are the even ones, as llama.cpp takes them; YaRN without truncation,
as the model's own config has it (a GGUF cannot say).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from tvm.relax.frontend import nn

from ..lazy_weights import LazyArray, read
from .decoder import (Attention, LayerwiseConfig, config_value, fuse_layer_weights,
                      with_default_theta)
from .gemma2 import layer_types
from .moe import MoeModel, MoeSettings

NAME = "gpt_oss"
HF_MODEL_TYPES = ("gpt_oss",)
GGUF_ARCHITECTURES = ("gpt-oss",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES = {  # (biases: named after their weights' modules)
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",  # (E, out, in), as wick stacks
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
    "ffn_gate_up_exps.weight": "mlp.experts.gate_up_proj.weight",  # gate rows, then up
}


def gguf_config(key, tensors: set[str]) -> dict[str, Any]:
    return {"sliding_window": key("attention.sliding_window", None),
            "num_local_experts": key("expert_count"),
            "num_experts_per_tok": key("expert_used_count"),
            "intermediate_size": key("expert_feed_forward_length", None)
            or key("feed_forward_length")}

# E2M1's sixteen codes (sign bit, two exponent bits, one mantissa bit) as numbers
MXFP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                         -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
MXFP4_BLOCK = 32  # values a scale covers (16 bytes)


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        # (OpenAI's configs name the experts a token takes ``experts_per_token`` too)
        hf = with_default_theta({"num_experts_per_tok": hf.get("experts_per_token"), **hf},
                                150000.0)
        for name in ("rope_scaling", "rope_parameters"):  # (YaRN untruncated: GPT-OSS's own)
            scaling = hf.get(name)
            if isinstance(scaling, dict) and scaling.get("rope_type") == "yarn":
                hf = {**hf, name: {"truncate": False, **scaling}}
        bias = config_value(hf, "attention_bias", True, bool)
        c = super().from_hf({**hf, "rms_norm_eps": config_value(hf, "rms_norm_eps", 1e-5)},
                            qkv_bias=bias, o_bias=bias,
                            sliding_window=config_value(hf, "sliding_window", 128, int))
        c.extra["sliding"] = layer_types(hf, lambda i: i % 2 == 0)
        settings = MoeSettings.from_hf(hf, expert_size_key="intermediate_size",
                                       expert_size_default=2880, normalize=True)
        c.extra["moe"] = replace(settings, router_bias=True, expert_biases=True,
                                 clamped_swiglu=(config_value(hf, "swiglu_alpha", 1.702),
                                                 config_value(hf, "swiglu_limit", 7.0)))
        return c

    def attention(self, layer: int, dtype: str):
        return replace(super().attention(layer, dtype), sinks=True)


class SinkAttention(Attention):
    """The decoder's attention with each head's sink logit (``sinks``, (heads,))."""

    def __init__(self, c, attn, quant) -> None:
        super().__init__(c, attn, quant)
        self.sinks = nn.Parameter((c.num_attention_heads,), quant.dtype)

    def forward(self, x, pages, step):
        return self.o_proj(self.attn(self.project(x), pages, step, sinks=self.sinks))


class Model(MoeModel):
    attention = SinkAttention


def mxfp4_floats(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 blocks (..., G, 16) uint8 (code ``2t`` in byte ``t``'s low nibble, ``2t + 1`` in its
    high one) and scales (..., G) uint8 (exponent + 127) -> float32 (..., G * 32)."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not match")
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1)  # (..., G, 16, 2): value order
    values = MXFP4_VALUES[codes].reshape(*scales.shape, MXFP4_BLOCK)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*scales.shape[:-1], scales.shape[-1] * MXFP4_BLOCK)


def _expert_matrix(weights: dict[str, Any], name: str) -> Any:
    """An expert stack ``name`` as (E, out, in): from MXFP4 (stored (E, out, G, 16)) or from
    transformers' float layout (E, in, out)."""
    if name + "_blocks" in weights:
        blocks, scales = weights[name + "_blocks"], weights[name + "_scales"]
        shape = (*scales.shape[:-1], scales.shape[-1] * MXFP4_BLOCK)
        return LazyArray(lambda: mxfp4_floats(read(blocks), read(scales)), shape, np.float32)
    return weights[name].transpose(0, 2, 1)


def _gate_then_up(stack: Any) -> Any:
    """Rows (axis 1) of interleaved gate/up outputs (gate at even ones) as gate rows, then up."""
    return np.concatenate([stack[:, 0::2], stack[:, 1::2]], axis=1)


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = fuse_layer_weights(c, weights, extra=("self_attn.sinks",))
    for i in range(c.num_hidden_layers):
        mlp = f"model.layers.{i}.mlp."
        ex = mlp + "experts."
        out[mlp + "gate.weight"] = weights[mlp + "router.weight"]
        out[mlp + "gate.bias"] = weights[mlp + "router.bias"]
        if ex + "gate_proj.weight" in weights:  # a GGUF's stacks, gate and up apart
            for kind, ours in (("weight", "gate_up_proj.weight"), ("bias", "gate_up_bias")):
                out[ex + ours] = np.concatenate([weights[f"{ex}gate_proj.{kind}"],
                                                 weights[f"{ex}up_proj.{kind}"]], axis=1)
            out[ex + "down_proj.weight"] = weights[ex + "down_proj.weight"]
            out[ex + "down_bias"] = weights[ex + "down_proj.bias"]
            continue
        if ex + "gate_up_proj.weight" in weights:  # a GGUF's fused stack: gate, then up
            out[ex + "gate_up_proj.weight"] = weights[ex + "gate_up_proj.weight"]
            out[ex + "gate_up_bias"] = weights[ex + "gate_up_proj.bias"]
            out[ex + "down_proj.weight"] = weights[ex + "down_proj.weight"]
            out[ex + "down_bias"] = weights[ex + "down_proj.bias"]
            continue
        out[ex + "gate_up_proj.weight"] = _gate_then_up(_expert_matrix(weights, ex + "gate_up_proj"))
        out[ex + "gate_up_bias"] = _gate_then_up(weights[ex + "gate_up_proj_bias"])
        out[ex + "down_proj.weight"] = _expert_matrix(weights, ex + "down_proj")
        out[ex + "down_bias"] = weights[ex + "down_proj_bias"]
    return out
