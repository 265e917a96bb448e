"""Mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Granite MoE, ERNIE 4.5 MoE,
GPT-OSS): a
router scores each token against ``num_experts`` gated MLPs, the ``top_k`` best run on it (ERNIE:
best by probability plus a per-expert bias), and their outputs are summed weighted by the
router's softmax probabilities (renormalized over the chosen ones where the family does: Mixtral,
Granite MoE and ERNIE always, Qwen and OLMoE by ``norm_topk_prob``).

Every step runs the same kernels whatever the router chooses (the engine's plans are data, with
no branches): the top-k is computed as each expert's rank among the token's scores (how many
score higher, ties to the lower index, as one reduction), a slot's expert is the one of that
rank, and ``ExpertLinears`` reads only the chosen experts' weights. A one-token decode step
thus reads top_k experts' weights per layer, not all of them (Qwen3-30B-A3B: 8 of 128).

Semantics: HF transformers ``models/{mixtral,qwen2_moe,qwen3_moe,olmoe,granitemoe}/modeling_*.py``
(softmax over all experts in float32, ``torch.topk``, then the optional renormalization).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from tvm import relax, te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from ..model_config import UnsupportedConfig
from ..quantization import Quantization
from .decoder import Attention, DecoderConfig, DecoderForCausalLM, GatedMLP, SequentialLayer
from .layers import MAX_BINDING_BYTES, ExpertLinears


# the router's kernels' blocks (the GPU kernel sets schedule them: compiler/expert_gemv.py)
ROUTER_BLOCKS = ("expert_rank", "slot_expert", "slot_weight")


@dataclass(frozen=True)
class MoeSettings:
    num_experts: int
    top_k: int
    expert_size: int  # each expert's intermediate size
    normalize: bool  # renormalize the chosen experts' probabilities to sum to one
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP
    shared_expert_size: int = 0  # Qwen2-MoE: a gated MLP every token also runs (0: none)
    shared_gated: bool = True  # the shared expert scaled by sigmoid(its gate) (ERNIE's: not)
    # ERNIE 4.5: a per-expert bias added to the probabilities to choose the experts (not to
    # weight them)
    selection_bias: bool = False
    # GPT-OSS: a bias on the router's scores and on each expert's projections, and its
    # clamped gate, (alpha, limit): (clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g)
    # with g = min(gate, limit)
    router_bias: bool = False
    expert_biases: bool = False
    clamped_swiglu: tuple[float, float] | None = None

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, expert_size_key: str, expert_size_default: int,
                normalize: bool | None = None, shared_expert_size: int = 0) -> "MoeSettings":
        """``normalize``: the family's fixed choice, else the config's ``norm_topk_prob``;
        ``expert_size_default``: the family's transformers default where a config names no
        width. Which layers have experts: every ``decoder_sparse_step``-th but those in
        ``mlp_only_layers`` (Qwen's keys; every layer where a config has neither)."""
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedConfig(f"hidden_act {hf['hidden_act']!r} in a mixture-of-experts "
                                    "config is not supported (wick's experts are SiLU-gated)")
        experts = hf.get("num_experts") or hf.get("num_local_experts")
        if not experts or not hf.get("num_experts_per_tok"):
            raise UnsupportedConfig("a mixture-of-experts config needs num_experts (or "
                                    "num_local_experts) and num_experts_per_tok")
        top_k = int(hf["num_experts_per_tok"])
        if not 0 < top_k <= int(experts):
            raise UnsupportedConfig(f"num_experts_per_tok {top_k} is not between 1 and "
                                    f"num_experts {experts}")
        layers = int(hf["num_hidden_layers"])
        step = int(hf.get("decoder_sparse_step") or 1)
        dense = set(hf.get("mlp_only_layers") or ())
        return cls(int(experts), top_k, int(hf.get(expert_size_key) or expert_size_default),
                   bool(hf.get("norm_topk_prob", False)) if normalize is None else normalize,
                   tuple(i not in dense and (i + 1) % step == 0 for i in range(layers)),
                   int(shared_expert_size or 0))


class Router(nn.Module):
    """Scores (n, out) in float32 of x (n, in) against an unquantized weight (out, in) in the
    variant's float type, whatever the experts are packed in: a router's choice is discrete
    (llama.cpp's converter keeps ``ffn_gate_inp`` in F32 for the same reason). Also Qwen2-MoE's
    one-row shared expert gate. ``bias``: a bias (out,) of the same type, added in float32
    (GPT-OSS's router)."""

    def __init__(self, in_features: int, out_features: int, dtype: str,
                 bias: bool = False) -> None:
        self.weight = nn.Parameter((out_features, in_features), dtype)
        self.bias = nn.Parameter((out_features,), dtype) if bias else None
        self.out_features = out_features

    def forward(self, x: Tensor) -> Tensor:
        if self.out_features == 1:  # (a sum of products: dlight's GEMV rule fails on one column)
            scores = op.sum(op.astype(x, "float32") * op.astype(self.weight, "float32"),
                            axis=-1, keepdims=True)
        else:
            scores = op.matmul(x, op.permute_dims(self.weight), out_dtype="float32")
        return scores if self.bias is None else scores + op.astype(self.bias, "float32")


def _expert_ranks(scores: te.Tensor, bias: te.Tensor | None = None) -> te.Tensor:
    """(n, E) int32: how many of the token's experts score higher (on ties: the lower index
    first); with ``bias`` (E,), scores + bias (added here, in the one kernel). A token's top-k
    are its experts of rank < k, in order."""
    other = te.reduce_axis((0, scores.shape[1]), name="other")

    def score(r, e):
        return scores[r, e] if bias is None else scores[r, e] + bias[e].astype("float32")

    def rank(r, e):
        ahead = tirx.any(score(r, other) > score(r, e),
                         tirx.all(score(r, other) == score(r, e), other < e))
        return te.sum(tirx.Select(ahead, tirx.const(1, "int32"), tirx.const(0, "int32")),
                      axis=other)

    return te.compute(scores.shape, rank, name="expert_rank")


def _slot_experts(ranks: te.Tensor, top_k: int) -> te.Tensor:
    """(n, top_k) int32: the expert of each rank. (A NaN score makes no rank hold and the sum
    of several experts' numbers: ``ExpertLinears`` clamps the index it reads a weight at.)"""
    e = te.reduce_axis((0, ranks.shape[1]), name="e")
    return te.compute((ranks.shape[0], top_k), lambda r, s: te.sum(
        tirx.Select(ranks[r, e] == s.astype("int32"), e.var.astype("int32"),
                    tirx.const(0, "int32")), axis=e), name="slot_expert")


def _slot_weights(ranks: te.Tensor, probs: te.Tensor, top_k: int) -> te.Tensor:
    """(n, top_k) float32: each slot's expert's probability."""
    e = te.reduce_axis((0, ranks.shape[1]), name="e")
    return te.compute((ranks.shape[0], top_k), lambda r, s: te.sum(
        tirx.Select(ranks[r, e] == s.astype("int32"), probs[r, e], tirx.const(0.0, "float32")),
        axis=e),
        name="slot_weight")


def route(scores: Tensor, top_k: int, normalize: bool,
          bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Router scores (n, E) float32 -> each token's top-k experts (n, top_k) int32 and their
    weights (n, top_k) float32: softmax probabilities, renormalized over the chosen ones with
    ``normalize``. ``bias`` (E,), any float type: the experts are the top-k of probability + bias
    (ERNIE 4.5's ``e_score_correction_bias``), weighted by their probabilities alone."""
    probs = op.softmax(scores, axis=-1)
    if bias is None:
        ranks = op.tensor_expr_op(_expert_ranks, "expert_rank", [scores])
    else:
        ranks = op.tensor_expr_op(_expert_ranks, "expert_rank", [probs, bias])
    experts = op.tensor_expr_op(lambda r: _slot_experts(r, top_k), "slot_expert", [ranks])
    weights = op.tensor_expr_op(lambda r, p: _slot_weights(r, p, top_k), "slot_weight",
                                [ranks, probs])
    if normalize:
        weights = weights / op.sum(weights, axis=1, keepdims=True)
    return experts, weights


def clamped_swiglu(gate: Tensor, up: Tensor, alpha: float, limit: float) -> Tensor:
    """GPT-OSS's gated activation: ``(clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``,
    ``g = min(gate, limit)``."""
    dtype = gate.dtype
    g = op.minimum(gate, Tensor.from_scalar(limit, dtype))
    up = op.maximum(op.minimum(up, Tensor.from_scalar(limit, dtype)),
                    Tensor.from_scalar(-limit, dtype))
    return (up + Tensor.from_scalar(1.0, dtype)) * (g * op.sigmoid(g * alpha))


def _expert_rows(table: Tensor, experts: Tensor) -> Tensor:
    """Each slot's expert's row of a per-expert table (E, d) -> (n, k, d); the index clamped
    into the table, as ExpertLinears clamps it (a NaN score can make it a sum of experts'
    numbers)."""
    return op.wrap_nested(relax.op.take(table._expr, experts._expr, axis=0, mode="clip"),
                          name="expert_rows")


class Experts(nn.Module):
    """``num_experts`` gated MLPs, each ``down(act(gate(x)) * up(x))``, gate and up fused per
    expert as the decoder fuses them (``gate_up_proj``: gate rows, then up rows). With
    ``expert_biases`` (GPT-OSS) each expert's projections add its own bias (``*_bias``, (E,
    out)) and the gate is ``clamped_swiglu``'s."""

    def __init__(self, hidden_size: int, s: MoeSettings, quant: Quantization,
                 max_bytes: int = MAX_BINDING_BYTES) -> None:
        self.settings = s
        self.gate_up_proj = ExpertLinears(s.num_experts, hidden_size, 2 * s.expert_size, quant,
                                          max_bytes)
        self.down_proj = ExpertLinears(s.num_experts, s.expert_size, hidden_size, quant,
                                       max_bytes)
        if s.expert_biases:
            self.gate_up_bias = nn.Parameter((s.num_experts, 2 * s.expert_size), quant.dtype)
            self.down_bias = nn.Parameter((s.num_experts, hidden_size), quant.dtype)

    def forward(self, x: Tensor, experts: Tensor, act: Callable[[Tensor], Tensor]) -> Tensor:
        """x (n, hidden), experts (n, k) -> each slot's expert output (n, k, hidden)."""
        s = self.settings
        gate_up = self.gate_up_proj(x, experts)
        if s.expert_biases:
            gate_up = gate_up + _expert_rows(self.gate_up_bias, experts)
        gate, up = op.split(gate_up, 2, axis=-1)
        if s.clamped_swiglu is None:
            hidden = act(gate) * up
        else:
            hidden = clamped_swiglu(gate, up, *s.clamped_swiglu)
        out = self.down_proj(hidden, experts)
        if s.expert_biases:
            out = out + _expert_rows(self.down_bias, experts)
        return out


class SparseMoE(nn.Module):
    """The MLP of a mixture-of-experts layer: ``gate`` (the router), ``experts``, and
    Qwen2-MoE's ``shared_expert`` scaled by ``sigmoid(shared_expert_gate(x))`` (ERNIE's
    unscaled), ERNIE's ``expert_bias`` for choosing the experts."""

    def __init__(self, c: DecoderConfig, s: MoeSettings, quant: Quantization,
                 act: Callable[[Tensor], Tensor] = op.silu,
                 max_bytes: int = MAX_BINDING_BYTES) -> None:
        self.settings, self.act, self.dtype = s, act, quant.dtype
        self.gate = Router(c.hidden_size, s.num_experts, quant.dtype, bias=s.router_bias)
        self.experts = Experts(c.hidden_size, s, quant, max_bytes)
        if s.shared_expert_size:
            self.shared_expert = GatedMLP(replace(c, intermediate_size=s.shared_expert_size),
                                          quant, act)
            if s.shared_gated:
                self.shared_expert_gate = Router(c.hidden_size, 1, quant.dtype)
        if s.selection_bias:
            # (float32 whatever the variant, as transformers keeps it: added to probabilities
            # of about 1/E, a rounded bias could change which experts are chosen)
            self.expert_bias = nn.Parameter((s.num_experts,), "float32")

    def forward(self, x: Tensor) -> Tensor:
        s = self.settings
        bias = self.expert_bias if s.selection_bias else None  # (cast in the rank kernel)
        experts, weights = route(self.gate(x), s.top_k, s.normalize, bias)
        y = self.experts(x, experts, self.act)  # (n, k, hidden)
        weights = op.reshape(op.astype(weights, self.dtype), (x.shape[0], s.top_k, 1))
        out = op.sum(y * weights, axis=1)
        if s.shared_expert_size and s.shared_gated:
            gate = op.astype(op.sigmoid(self.shared_expert_gate(x)), self.dtype)
            out = out + gate * self.shared_expert(x)
        elif s.shared_expert_size:
            out = out + self.shared_expert(x)
        return out


def layer_mlp(c: DecoderConfig, s: MoeSettings, layer: int, quant: Quantization,
              act: Callable[[Tensor], Tensor] = op.silu,
              max_bytes: int = MAX_BINDING_BYTES) -> nn.Module:
    """Layer ``layer``'s MLP: the experts (stacks split to bindings of ``max_bytes``), or the
    dense gated MLP of ``intermediate_size`` (Qwen's ``mlp_only_layers``)."""
    if s.sparse_layers[layer]:
        return SparseMoE(c, s, quant, act, max_bytes)
    return GatedMLP(c, quant, act)


class MoeModel(DecoderForCausalLM):
    """The pre-norm decoder with ``layer_mlp``'s MLPs (``c.extra["moe"]``: MoeSettings) and
    the family's ``attention`` class."""

    attention: type = Attention

    def layer_for(self, index, c, attn, quant) -> nn.Module:
        mlp = layer_mlp(c, c.extra["moe"], index, quant, max_bytes=self.max_param_bytes)
        return SequentialLayer(c, self.attention(c, attn, quant), mlp, quant.dtype)


# ----------------------------------------------------------------------------- weights

# llama.cpp's names of a layer's expert tensors (gguf-py's MODEL_TENSOR FFN_*_EXP/SHEXP): each
# projection's experts stacked in one tensor (experts, out, in), the router ``ffn_gate_inp``
GGUF_EXPERT_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}


# llama.cpp's names before it stacked the experts (files converted before April 2024, most of
# the Mixtral GGUFs on the Hub among them): one tensor an expert, ``ffn_gate.{expert}.weight``
_LEGACY_EXPERT = re.compile(r"(ffn_gate|ffn_up|ffn_down)\.(\d+)\.weight")
_LEGACY_PROJECTIONS = {"ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


def gguf_legacy_expert_name(layer_name: str) -> str | None:
    """An older GGUF's per-expert tensor name within a layer (``ffn_up.3.weight``) as the
    checkpoint's (``mlp.experts.3.up_proj.weight``), else None."""
    m = _LEGACY_EXPERT.fullmatch(layer_name)
    if m is None:
        return None
    return f"mlp.experts.{m.group(2)}.{_LEGACY_PROJECTIONS[m.group(1)]}.weight"


def gguf_moe_config(key: Callable[..., Any], tensors: set[str], layers: int) -> dict[str, Any]:
    """The experts' config keys from a GGUF's ``<arch>.expert_*`` metadata (their widths where
    the file names them: Qwen's; OLMoE's and Mixtral's are ``feed_forward_length``), and as
    ``mlp_only_layers`` the layers without a router (a dense MLP)."""
    config = {"num_experts": key("expert_count"),
              "num_experts_per_tok": key("expert_used_count"),
              "mlp_only_layers": [i for i in range(layers)
                                  if f"blk.{i}.ffn_gate_inp.weight" not in tensors]}
    if (width := key("expert_feed_forward_length", None)) is not None:
        config["moe_intermediate_size"] = width
    if any(name.endswith(".ffn_gate_shexp.weight") for name in tensors):
        # (required where the file has a shared expert: without it, its weights would go
        # unread and the model wrong)
        config["shared_expert_intermediate_size"] = key("expert_shared_feed_forward_length")
    return config


def moe_weights(c: DecoderConfig, s: MoeSettings, weights: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """The experts' parameters of every sparse layer from HF names: each expert's
    ``mlp.experts.{e}.{gate,up,down}_proj.weight`` stacked (or transformers 5's stacked
    ``mlp.experts.gate_up_proj`` / ``down_proj`` as they are), the router ``mlp.gate.weight``,
    and Qwen2-MoE's shared expert (fused gate|up) and its gate."""
    out: dict[str, np.ndarray] = {}
    for i, sparse in enumerate(s.sparse_layers):
        if not sparse:
            continue
        mlp = f"model.layers.{i}.mlp."
        ex = mlp + "experts."
        out[mlp + "gate.weight"] = weights[mlp + "gate.weight"]
        if ex + "gate_up_proj" in weights:  # stacked already (transformers 5's own names)
            out[ex + "gate_up_proj.weight"] = weights[ex + "gate_up_proj"]
            out[ex + "down_proj.weight"] = weights[ex + "down_proj"]
        elif ex + "gate_proj.weight" in weights:  # stacked, gate and up apart (a GGUF's)
            out[ex + "gate_up_proj.weight"] = np.concatenate(
                [weights[ex + "gate_proj.weight"], weights[ex + "up_proj.weight"]], axis=1)
            out[ex + "down_proj.weight"] = weights[ex + "down_proj.weight"]
        else:
            out[ex + "gate_up_proj.weight"] = np.stack([np.concatenate(
                [weights[f"{ex}{e}.gate_proj.weight"], weights[f"{ex}{e}.up_proj.weight"]])
                for e in range(s.num_experts)])
            out[ex + "down_proj.weight"] = np.stack(
                [weights[f"{ex}{e}.down_proj.weight"] for e in range(s.num_experts)])
        if s.shared_expert_size:
            # (ERNIE's checkpoints: shared_experts, with biases where use_bias)
            theirs = mlp + ("shared_experts." if mlp + "shared_experts.down_proj.weight"
                            in weights else "shared_expert.")
            ours = mlp + "shared_expert."
            for kind in ("weight", "bias"):
                if theirs + "down_proj." + kind in weights:
                    out[ours + "gate_up_proj." + kind] = np.concatenate(
                        [weights[theirs + "gate_proj." + kind],
                         weights[theirs + "up_proj." + kind]])
                    out[ours + "down_proj." + kind] = weights[theirs + "down_proj." + kind]
            if s.shared_gated:  # ((1, hidden); a GGUF's is one row, (hidden,))
                out[mlp + "shared_expert_gate.weight"] = weights[
                    mlp + "shared_expert_gate.weight"].reshape(1, -1)
        if s.selection_bias:  # ((1, E): transformers 5's name, or the checkpoint's own)
            name = mlp + "gate.moe_statics.e_score_correction_bias"
            name = name if name in weights else mlp + "moe_statics.e_score_correction_bias"
            out[mlp + "expert_bias"] = weights[name].reshape(-1)
    return out
