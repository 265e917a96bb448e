"""Llama family: Llama-2/3, TinyLlama, Mistral-shaped GQA, SmolLM2.

References: HF transformers ``models/llama/modeling_llama.py`` (the semantics we must match),
MLC-LLM ``model/llama/llama_model.py`` (fused qkv and gate_up projections).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from ..quantization import Quantization
from .layers import MAX_BINDING_BYTES, QEmbedding, QLinear, take_rows
from .paged_attention import STEP_INPUTS, AttentionShape, PagedAttention


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    context_window: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "LlamaConfig":
        heads = hf["num_attention_heads"]
        scaling = hf.get("rope_scaling") or None
        if scaling and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
            scaling = None
        if scaling and "rope_type" not in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        theta = hf.get("rope_theta")
        if theta is None:  # transformers 5 moved it into rope_parameters
            theta = (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            context_window=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
        )


class LlamaAttention(nn.Module):
    def __init__(self, c: LlamaConfig, attn: PagedAttention, quant: Quantization) -> None:
        self.attn = attn
        self.qkv_heads = c.num_attention_heads + 2 * c.num_key_value_heads
        self.head_dim = c.head_dim
        self.qkv_proj = QLinear(c.hidden_size, self.qkv_heads * c.head_dim, quant)
        self.o_proj = QLinear(c.num_attention_heads * c.head_dim, c.hidden_size, quant)

    def forward(self, x: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        qkv = op.reshape(self.qkv_proj(x), (x.shape[0], self.qkv_heads, self.head_dim))
        return self.o_proj(self.attn(qkv, pages, step))


class LlamaMLP(nn.Module):
    def __init__(self, c: LlamaConfig, quant: Quantization) -> None:
        self.intermediate = c.intermediate_size
        self.gate_up_proj = QLinear(c.hidden_size, 2 * c.intermediate_size, quant)
        self.down_proj = QLinear(c.intermediate_size, c.hidden_size, quant)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(gate) * up)


class LlamaLayer(nn.Module):
    def __init__(self, c: LlamaConfig, attn: PagedAttention, quant: Quantization) -> None:
        self.input_layernorm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False, dtype=quant.dtype)
        self.self_attn = LlamaAttention(c, attn, quant)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False, dtype=quant.dtype)
        self.mlp = LlamaMLP(c, quant)

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), pages, step)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c: LlamaConfig, attn: PagedAttention, quant: Quantization,
                 max_param_bytes: int) -> None:
        # Only the vocabulary-sized tables can outgrow a storage binding in practice.
        self.embed_tokens = QEmbedding(c.vocab_size, c.hidden_size, quant, max_param_bytes)
        self.layers = nn.ModuleList([LlamaLayer(c, attn, quant) for _ in range(c.num_hidden_layers)])
        self.norm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False, dtype=quant.dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c: LlamaConfig, quant: Quantization, target,
                 max_param_bytes: int = MAX_BINDING_BYTES) -> None:
        self.config, self.quant = c, quant
        self.attn = PagedAttention(
            AttentionShape(c.num_attention_heads, c.num_key_value_heads, c.head_dim, quant.dtype,
                           c.rope_theta, c.rope_scaling),
            target,
        )
        self.model = LlamaModel(c, self.attn, quant, max_param_bytes)
        if not c.tie_word_embeddings:
            self.lm_head = QLinear(c.hidden_size, c.vocab_size, quant, max_param_bytes)

    def forward(self, input_ids: Tensor, q_positions: Tensor, append_slots: Tensor, qo_indptr: Tensor,
                page_indptr: Tensor, page_values: Tensor, last_page_len: Tensor,
                k_rope_pos_offset: Tensor, logit_positions: Tensor, kv_pages: list[Tensor]) -> Tensor:
        """One engine step over a ragged batch -> logits (b, vocab) float32."""
        step = dict(input_ids=input_ids, q_positions=q_positions, append_slots=append_slots,
                    qo_indptr=qo_indptr, page_indptr=page_indptr, page_values=page_values,
                    last_page_len=last_page_len, k_rope_pos_offset=k_rope_pos_offset,
                    logit_positions=logit_positions)
        pages = kv_pages
        h = self.model.embed_tokens(step["input_ids"])  # (n, hidden)
        for layer, layer_pages in zip(self.model.layers, pages):
            h = layer(h, layer_pages, step)
        h = self.model.norm(take_rows(h, step["logit_positions"]))  # (b, hidden)
        head = self.model.embed_tokens.lm_head if self.config.tie_word_embeddings else self.lm_head
        return op.astype(head(h), "float32")

    decode = forward  # the same step compiled for one token per sequence (n == b)
    decode1 = forward  # ... and for a single sequence (static shapes: GEMV kernels)

    def forward_spec(self, **sizes: int | str) -> dict[str, Any]:
        """Input specs of one step. ``n="b"`` gives the decode variant (one new token per
        sequence); ``n=1, b=1, b1=2`` the single-sequence decode with static shapes."""
        rename = sizes
        spec = {name: nn.spec.Tensor([rename.get(d, d) for d in shape], dtype)
                for name, shape, dtype in STEP_INPUTS}
        spec["kv_pages"] = [self.attn.page_spec() for _ in range(self.config.num_hidden_layers)]
        return spec


def convert_weights(c: LlamaConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF parameter names -> this module's unquantized parameter names (fused qkv, gate_up)."""
    out: dict[str, np.ndarray] = {"model.embed_tokens.table.weight": weights["model.embed_tokens.weight"],
                                  "model.norm.weight": weights["model.norm.weight"]}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = weights["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        hf, me = f"model.layers.{i}.", f"model.layers.{i}."
        attn = hf + "self_attn."
        out[me + "self_attn.qkv_proj.weight"] = np.concatenate(
            [weights[attn + "q_proj.weight"], weights[attn + "k_proj.weight"], weights[attn + "v_proj.weight"]]
        )
        out[me + "self_attn.o_proj.weight"] = weights[attn + "o_proj.weight"]
        out[me + "mlp.gate_up_proj.weight"] = np.concatenate(
            [weights[hf + "mlp.gate_proj.weight"], weights[hf + "mlp.up_proj.weight"]]
        )
        out[me + "mlp.down_proj.weight"] = weights[hf + "mlp.down_proj.weight"]
        out[me + "input_layernorm.weight"] = weights[hf + "input_layernorm.weight"]
        out[me + "post_attention_layernorm.weight"] = weights[hf + "post_attention_layernorm.weight"]
    return out


Config = LlamaConfig
Model = LlamaForCausalLM
