"""BERT-family encoders (BertModel: all-MiniLM, bge, e5, gte-base and other BERT-shaped
sentence encoders): embeddings -> N x (attention, add & LayerNorm, GELU MLP, add & LayerNorm)
-> pooling (compiler/models/pooling.py). The model returns one vector per input, never logits.

Semantics: HF transformers ``models/bert/modeling_bert.py`` (post-norm layers, absolute
position and token-type embeddings, exact erf GELU), with sentence-transformers' pooling.

Attention is wick's paged attention (paged_attention.py) with ``causal=False`` and no RoPE: a
step appends each input's K/V to pages and every token attends to all of its input's keys,
so an input runs in one step (the engine schedules it so, and frees its pages after). The
token-type embedding is row 0's (one-sentence inputs, as sentence-transformers encodes),
added to the position table when the weights are converted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tvm import te, topi
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from ...engine.step_inputs import STEP_INPUTS
from ..model_config import check_config
from ..quantization import Quantization
from .decoder import KV_PAGES, UnsupportedConfig, _with_signature
from .layers import MAX_BINDING_BYTES, QEmbedding, QLinear, take_rows
from .paged_attention import AttentionSpec, PagedAttention
from .pooling import pool

NAME = "bert"
HF_MODEL_TYPES = ("bert",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
_GELU = ("gelu", "gelu_python")  # the exact (erf) GELU; "gelu_new" is the tanh one


@dataclass
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    layer_norm_eps: float
    context_window: int  # max_position_embeddings
    hidden_act: str = "gelu"
    pooling: str = "cls"  # (no sentence-transformers files: BERT's [CLS] row)
    normalize: bool = False
    tie_word_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_key_value_heads(self) -> int:
        return self.num_attention_heads

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        check_config(hf)
        act = hf.get("hidden_act", "gelu")
        if act not in _GELU + ("gelu_new",):
            raise UnsupportedConfig(f"hidden_act {act!r} is not supported for BERT models "
                                    "(wick has gelu and gelu_new)")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedConfig(f"position_embedding_type "
                                    f"{hf['position_embedding_type']!r} is not supported "
                                    "(wick has absolute)")
        heads = int(hf["num_attention_heads"])
        embedding = hf.get("embedding") or {}
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            head_dim=int(hf["hidden_size"]) // heads,
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            context_window=int(hf.get("max_position_embeddings", 512)),
            hidden_act=act,
            pooling=embedding.get("pooling", "cls"),
            normalize=bool(embedding.get("normalize", False)),
        )


def gelu(x: Tensor, exact: bool) -> Tensor:
    """GELU. Exact: x/2 (1 + erf(x/sqrt 2)) with TVM's float32 rational erf (``fast_erf``,
    within a few ulp; WGSL has no erf); else the tanh form ("gelu_new")."""
    if not exact:
        return op.gelu(x, approximate="tanh")

    def compute(t: te.Tensor):
        f = t if t.dtype == "float32" else topi.cast(t, "float32")
        y = f * (0.5 + 0.5 * topi.fast_erf(f * (0.5 ** 0.5)))
        return y if t.dtype == "float32" else topi.cast(y, t.dtype)

    # a kernel of its own (op_pattern 8: opaque to FuseOps): fused into the matmul before it,
    # it made a pattern the CPU's hand-written matmul (compiler/cpu_gemv.py) does not take
    return op.tensor_expr_op(compute, "gelu", [x], attrs={"op_pattern": 8})


class EncoderLayer(nn.Module):
    def __init__(self, c: Config, attn: PagedAttention, quant: Quantization) -> None:
        self.attn = attn
        self.heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.exact = c.hidden_act in _GELU
        h, dtype = c.hidden_size, quant.dtype
        self.qkv_proj = QLinear(h, 3 * h, quant, bias=True)
        self.o_proj = QLinear(h, h, quant, bias=True)
        self.attn_norm = nn.LayerNorm(h, c.layer_norm_eps, dtype=dtype)
        self.up_proj = QLinear(h, c.intermediate_size, quant, bias=True)
        self.down_proj = QLinear(c.intermediate_size, h, quant, bias=True)
        self.mlp_norm = nn.LayerNorm(h, c.layer_norm_eps, dtype=dtype)

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        n = h.shape[0]
        qkv = op.reshape(self.qkv_proj(h), (n, 3 * self.heads, self.head_dim))
        h = self.attn_norm(h + self.o_proj(self.attn(qkv, pages, step)))
        return self.mlp_norm(h + self.down_proj(gelu(self.up_proj(h), self.exact)))


class BertEncoder(nn.Module):
    """The compiled model: ``forward(*step inputs, kv_pages)`` -> (b, hidden) float32, one
    pooled vector per sequence of the step."""

    task = "embed"

    def __init__(self, c: Config, quant: Quantization, target,
                 max_param_bytes: int = MAX_BINDING_BYTES) -> None:
        self.config, self.quant = c, quant
        spec = AttentionSpec(c.num_attention_heads, c.num_attention_heads, c.head_dim,
                             quant.dtype, 10000.0, causal=False, rope=False)
        attn = PagedAttention(spec, target)
        self.layer_attention = [attn] * c.num_hidden_layers
        self.embed_tokens = QEmbedding(c.vocab_size, c.hidden_size, quant, max_param_bytes)
        # (position rows with token type 0's row added: convert_weights)
        self.position_embeddings = nn.Parameter((c.context_window, c.hidden_size), quant.dtype)
        self.embed_norm = nn.LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=quant.dtype)
        self.layers = nn.ModuleList([EncoderLayer(c, attn, quant)
                                     for _ in range(c.num_hidden_layers)])
        self.step_inputs = STEP_INPUTS
        self.forward = _with_signature(self._step, [i.name for i in STEP_INPUTS] + [KV_PAGES])

    def kv_window(self) -> None:
        return None

    def window_pool(self) -> None:
        return None

    def gpu_twins(self, target, decode: bool = False) -> dict:
        return self.layer_attention[0].gpu_twins(target, decode)

    def cpu_twins(self) -> dict:
        return self.layer_attention[0].cpu_twins()

    def _step(self, *args: Tensor) -> Tensor:
        *inputs, kv_pages = args
        step = {spec.name: t for spec, t in zip(self.step_inputs, inputs)}
        positions = step["q_positions"]
        h = self.embed_tokens(step["input_ids"]) + take_rows(self.position_embeddings, positions)
        h = self.embed_norm(h)
        for layer, layer_pages in zip(self.layers, kv_pages):
            h = layer(h, layer_pages, step)
        c = self.config
        return pool(h, step["qo_indptr"], step["logit_positions"], c.pooling, c.normalize)

    def forward_spec(self, **sizes: int | str) -> dict[str, Any]:
        spec = {i.name: nn.spec.Tensor([sizes.get(d, d) for d in i.dims], i.dtype)
                for i in self.step_inputs}
        spec[KV_PAGES] = [attn.page_spec() for attn in self.layer_attention]
        return spec


Model = BertEncoder


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF BERT names (with or without a ``bert.`` prefix) -> this module's."""
    w = {name.removeprefix("bert."): value for name, value in weights.items()}
    e = "embeddings."
    positions = w[e + "position_embeddings.weight"].astype(np.float32)
    types = w.get(e + "token_type_embeddings.weight")
    if types is not None:
        positions = positions + types[0].astype(np.float32)
    out = {"embed_tokens.table.weight": w[e + "word_embeddings.weight"],
           "position_embeddings": positions,
           "embed_norm.weight": w[e + "LayerNorm.weight"], "embed_norm.bias": w[e + "LayerNorm.bias"]}
    for i in range(c.num_hidden_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        a = src + "attention."
        for kind in ("weight", "bias"):
            out[dst + "qkv_proj." + kind] = np.concatenate(
                [w[a + "self." + x + "." + kind] for x in ("query", "key", "value")])
            out[dst + "o_proj." + kind] = w[a + "output.dense." + kind]
            out[dst + "attn_norm." + kind] = w[a + "output.LayerNorm." + kind]
            out[dst + "up_proj." + kind] = w[src + "intermediate.dense." + kind]
            out[dst + "down_proj." + kind] = w[src + "output.dense." + kind]
            out[dst + "mlp_norm." + kind] = w[src + "output.LayerNorm." + kind]
    return out
