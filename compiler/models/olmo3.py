"""OLMo 3 (AllenAI): OLMo 2's layer (norms after each block only; q and k each RMS-normed over
all their heads) with three sliding-window layers to one global layer (``layer_types``), and
RoPE scaling (YaRN in the released 7B/32B) on the global layers only, the windowed ones plain.
Semantics: HF transformers ``models/olmo3/modeling_olmo3.py``.
"""

from __future__ import annotations

from typing import Any

from .decoder import LayerwiseConfig, rope_by_kind
from .gemma2 import layer_types
from .olmo2 import LAYER_NORMS, Model, convert_weights  # noqa: F401

NAME = "olmo3"
HF_MODEL_TYPES = ("olmo3",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_WINDOW = 4096  # transformers' when config.json has no sliding_window
DEFAULT_THETA = 500000.0  # transformers' when config.json has no rope_theta


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if hf.get("rope_theta") is None and not hf.get("rope_parameters"):
            hf = {**hf, "rope_theta": DEFAULT_THETA}
        window = hf["sliding_window"] if "sliding_window" in hf else DEFAULT_WINDOW
        bias = bool(hf.get("attention_bias", False))
        c = super().from_hf(hf, qkv_bias=bias, o_bias=bias, sliding_window=window)
        sliding = layer_types(hf, lambda i: (i + 1) % 4 != 0)
        c.extra.update(sliding=[s and window is not None for s in sliding],
                       rope_by_kind=rope_by_kind(hf, c.rotary_dim or c.head_dim))
        return c
