"""GPT-2 (OpenAI's GPT-2 and DistilGPT2, and fine-tunes of them): learned absolute position
embeddings added to the token embeddings and no RoPE, LayerNorms with biases, q|k|v in one
projection, biases on every projection, a plain MLP with GELU (tanh approximation for
``gelu_new``), the LM head tied to the token embeddings. The layer is GPT-NeoX's sequential one.

The checkpoint's projections are ``Conv1D`` (weights stored (in, out)): ``convert_weights``
transposes them, as llama.cpp's converter does, and renames GPT-2's modules to the decoder's
(``wte`` -> ``embed_tokens``, ``c_attn`` -> ``qkv_proj``...); checkpoints saved with and without
the ``transformer.`` prefix both load. Its config's ``n_embd``/``n_layer``/... are read under the
usual names (hf_source.with_aliases).

Semantics: HF transformers ``models/gpt2/modeling_gpt2.py``. Not supported:
``scale_attn_by_inverse_layer_idx`` (no released GPT-2 sets it) and unscaled attention.

GGUF: llama.cpp's ``gpt2`` architecture (``position_embd``; ``output`` a copy of the embedding).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from ..model_config import UnsupportedConfig
from .decoder import (DecoderForCausalLM, LayerwiseConfig, fuse_layer_weights, layer_norm_eps,
                      plain_activation, renamed_weights, tied_head)
from .gpt_neox import GGUF_LAYER_NAMES, NeoXLayer  # noqa: F401 (GPT-NeoX's names, the same)
from .layers import MAX_BINDING_BYTES, take_rows

NAME = "gpt2"
HF_MODEL_TYPES = ("gpt2",)
GGUF_ARCHITECTURES = ("gpt2",)
GGUF_PERMUTED_QK = False
POSITIONS = "model.embed_positions.weight"
GGUF_GLOBAL_NAMES = {"position_embd.weight": POSITIONS}
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
RENAMED = {".ln_1.": ".input_layernorm.", ".ln_2.": ".post_attention_layernorm.",
           ".attn.c_attn.": ".self_attn.qkv_proj.", ".attn.c_proj.": ".self_attn.o_proj.",
           ".mlp.c_fc.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."}
GLOBAL_RENAMED = {"wte.weight": "model.embed_tokens.weight", "wpe.weight": POSITIONS,
                  "ln_f.weight": "model.norm.weight", "ln_f.bias": "model.norm.bias"}


def gguf_config(key: Callable[..., Any], tensors: set[str]) -> dict[str, Any]:
    return {"activation_function": "gelu_new",
            "layer_norm_epsilon": key("attention.layer_norm_epsilon")}


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
            raise UnsupportedConfig("GPT-2 attention scaled other than by 1/sqrt(head_dim) "
                                    "(scale_attn_by_inverse_layer_idx, scale_attn_weights) is "
                                    "not supported")
        act = plain_activation(hf.get("activation_function", "gelu_new"), "activation_function",
                               "GPT-2")
        heads = int(hf["num_attention_heads"])
        c = super().from_hf(hf, layer_norm=True,
                            rms_norm_eps=layer_norm_eps(hf, "layer_norm_epsilon"), qkv_bias=True,
                            o_bias=True, mlp_bias=True, num_key_value_heads=heads,
                            tie_word_embeddings=tied_head(hf, True))
        n = c.num_hidden_layers
        c.extra.update(act=act, parallel=False, rope=[False] * n, sliding=[False] * n)
        return c


class PositionTable(nn.Module):
    """The learned position embeddings: a row a position, up to the context window."""

    def __init__(self, positions: int, hidden_size: int, dtype: str) -> None:
        self.weight = nn.Parameter((positions, hidden_size), dtype)

    def forward(self, positions: Tensor) -> Tensor:
        return take_rows(self.weight, positions)


class Model(DecoderForCausalLM):
    def __init__(self, c: Config, quant, target, max_param_bytes: int = MAX_BINDING_BYTES) -> None:
        super().__init__(c, quant, target, max_param_bytes)
        self.model.embed_positions = PositionTable(c.context_window, c.hidden_size, quant.dtype)

    def make_layer(self, c, attn, quant) -> nn.Module:
        return NeoXLayer(c, attn, quant)

    def embed_step(self, step: dict[str, Tensor]) -> Tensor:
        return self.embed(step["input_ids"]) + self.model.embed_positions(step["q_positions"])


def convert_weights(c: Config, weights: dict[str, np.ndarray], conv1d: bool = True
                    ) -> dict[str, np.ndarray]:
    """``conv1d``: the projections are stored (in, out) (GPT-2's Conv1D; GPT-BigCode's are
    Linear)."""
    hf = {}
    for name, w in weights.items():
        name = name.removeprefix("transformer.")
        if conv1d and name.endswith(CONV1D):
            w = w.T.copy()  # (a copy, not np.ascontiguousarray: that reads a lazy weight now)
        if name.startswith("h."):
            name = "model.layers." + name[2:]
        hf[GLOBAL_RENAMED.get(name, name)] = w
    hf = renamed_weights(hf, RENAMED)
    out = fuse_layer_weights(c, hf)
    out[POSITIONS] = hf[POSITIONS]
    return out
