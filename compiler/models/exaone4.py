"""EXAONE 4.0 (LG AI Research): OLMo 2's layer (norms after each block only) with Qwen3's q/k
norms (an RMSNorm over each head), and in the hybrid checkpoints (a ``sliding_window``) three
windowed layers to one global layer, the global ones without RoPE. Semantics: HF transformers
``models/exaone4/modeling_exaone4.py``.
"""

from __future__ import annotations

from typing import Any

from tvm.relax.frontend import nn

from .decoder import Attention, DecoderForCausalLM, LayerwiseConfig
from .olmo2 import LAYER_NORMS, Olmo2Layer, convert_weights  # noqa: F401

NAME = "exaone4"
HF_MODEL_TYPES = ("exaone4",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_PATTERN = 4  # transformers': every fourth layer global
DEFAULT_WINDOW = 4096  # transformers' when config.json has no sliding_window (null: none)


def window_of(hf: dict[str, Any]) -> int | None:
    return hf["sliding_window"] if "sliding_window" in hf else DEFAULT_WINDOW


def sliding_layers(hf: dict[str, Any]) -> list[bool]:
    """Per layer: whether it is windowed (``layer_types``, else ``sliding_window_pattern``: a
    period whose last layer is global, or a string of L (local) and G (global) repeated from
    layer 0, the last layer global whatever it says)."""
    n = int(hf["num_hidden_layers"])
    if window_of(hf) is None:
        return [False] * n
    if hf.get("layer_types"):
        return [t == "sliding_attention" for t in hf["layer_types"][:n]]
    pattern = hf.get("sliding_window_pattern") or DEFAULT_PATTERN
    if isinstance(pattern, str):
        return [pattern[i % len(pattern)] == "L" and i < n - 1 for i in range(n)]
    return [(i + 1) % int(pattern) != 0 for i in range(n)]


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        c = super().from_hf(hf, qk_norm=True, sliding_window=window_of(hf))
        sliding = sliding_layers(hf)
        hybrid = window_of(hf) is not None
        # a hybrid model's global layers have no RoPE
        c.extra.update(sliding=sliding, rope=[s or not hybrid for s in sliding])
        return c


class Model(DecoderForCausalLM):
    def make_layer(self, c, attn, quant) -> nn.Module:
        return Olmo2Layer(c, attn, quant, attention=Attention)
