"""OLMo 3 (AllenAI): OLMo 2's layer (norms after each block only; q and k each RMS-normed over
all their heads) with three sliding-window layers to one global layer (``layer_types``), and
RoPE scaling (YaRN in the released 7B/32B) on the global layers only, the windowed ones plain:
OLMo 2's ``Config`` with transformers' OLMo 3 defaults. Semantics: HF transformers
``models/olmo3/modeling_olmo3.py``. GGUF: llama.cpp writes OLMo 3 as ``olmo2`` (olmo2.py).
"""

from __future__ import annotations

from typing import Any

from . import olmo2
from .olmo2 import LAYER_NORMS, Model, convert_weights  # noqa: F401

NAME = "olmo3"
HF_MODEL_TYPES = ("olmo3",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_WINDOW = 4096  # transformers' when config.json has no sliding_window


class Config(olmo2.Config):
    DEFAULT_THETA = 500000.0  # transformers' when config.json has no rope_theta

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        if "sliding_window" not in hf:
            hf = {**hf, "sliding_window": DEFAULT_WINDOW}
        return super().from_hf(hf)
