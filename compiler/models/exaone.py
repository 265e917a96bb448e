"""EXAONE 3.0 / 3.5 (LG AI Research): the Llama decoder (transformers runs it as
``LlamaForCausalLM``) under checkpoint names of its own (``transformer.h.N.attn.attention.*``,
``ln_1``/``ln_2``, ``c_fc_0``/``c_fc_1``/``c_proj``) and config keys of its own (``num_layers``,
``layer_norm_epsilon``: hf_source's aliases). Semantics: HF transformers
``models/exaone/modular_exaone.py`` and its checkpoint renaming (``conversion_mapping.py``).

GGUF: llama.cpp's ``exaone`` (q/k rows in the checkpoint's order; Llama 3 scaling as
``rope_freqs``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import (DecoderConfig, DecoderForCausalLM, config_value, fuse_layer_weights,
                      renamed_weights, with_default_theta)

NAME = "exaone"
HF_MODEL_TYPES = ("exaone",)
GGUF_ARCHITECTURES = ("exaone",)
GGUF_PERMUTED_QK = False
GGUF_LAYER_NAMES: dict[str, str] = {}
DEFAULT_THETA = 500000.0  # transformers' ExaoneConfig default
# the checkpoint's module names -> the decoder's (applied in order)
RENAMED = {"transformer.wte.": "model.embed_tokens.", "transformer.h.": "model.layers.",
           "transformer.ln_f.": "model.norm.", ".attn.attention.out_proj.": ".self_attn.o_proj.",
           ".attn.attention.": ".self_attn.", ".ln_1.": ".input_layernorm.",
           ".ln_2.": ".post_attention_layernorm.", ".mlp.c_fc_0.": ".mlp.gate_proj.",
           ".mlp.c_fc_1.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."}


class Config(DecoderConfig):
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Config":
        return super().from_hf(with_default_theta(hf, DEFAULT_THETA),
                               rms_norm_eps=config_value(hf, "rms_norm_eps", 1e-5))


Model = DecoderForCausalLM


def convert_weights(c: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return fuse_layer_weights(c, renamed_weights(weights, RENAMED))
