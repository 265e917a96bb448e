"""Ministral (Mistral AI's Ministral-8B-Instruct-2410): Mistral's decoder with a window on the
layers ``layer_types`` names (``sliding_attention``) and none on the others; without a list,
every layer is windowed when ``sliding_window`` is set. Semantics: HF transformers
``models/ministral/modular_ministral.py``.
"""

from __future__ import annotations

from typing import Any

from .decoder import DecoderForCausalLM, LayerwiseConfig
from .gemma2 import layer_types
from .llama import convert_weights  # noqa: F401

NAME = "ministral"
HF_MODEL_TYPES = ("ministral",)
GGUF_ARCHITECTURES: tuple[str, ...] = ()
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}


class Config(LayerwiseConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        window = hf.get("sliding_window")
        c = super().from_hf(hf, sliding_window=window)
        # (a layer's kind; without a window none is masked: LayerwiseConfig.attention)
        c.extra["sliding"] = layer_types(hf, lambda i: window is not None)
        return c


Model = DecoderForCausalLM
