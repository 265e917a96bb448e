"""LongRoPE settings (Phi-3 128k / 3.5 / 4-mini) read from a config, against transformers'
own longrope frequencies and attention factor; refusals of what wick does not implement."""

from __future__ import annotations

import numpy as np
import pytest

from wick.compiler.models import phi3
from wick.compiler.models.decoder import UnsupportedConfig
from wick.compiler.models.longrope import inverse_frequencies

RNG = np.random.default_rng(0)
# Phi-3.5-mini's shape (head_dim 96, 128k from 4k); Phi-4-mini's partial rotary (0.75 of 128)
SHAPES = [(3072, 32, 1.0, 131072, 4096), (3072, 24, 0.75, 131072, 4096)]


def phi3_config(hidden, heads, partial, max_pos, original):
    half = int(hidden // heads * partial) // 2
    return {"model_type": "phi3", "vocab_size": 100, "hidden_size": hidden,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
            "num_key_value_heads": heads, "max_position_embeddings": max_pos,
            "original_max_position_embeddings": original, "rope_theta": 10000.0,
            "partial_rotary_factor": partial, "rms_norm_eps": 1e-5,
            "rope_scaling": {"type": "longrope",
                             "short_factor": (1 + RNG.random(half)).tolist(),
                             "long_factor": (1 + 40 * RNG.random(half)).tolist()}}


def test_su_is_the_older_name_of_longrope():
    raw = phi3_config(*SHAPES[0])
    raw["rope_scaling"]["type"] = "su"  # the first Phi-3 128k configs
    c = phi3.Config.from_hf(raw)
    assert c.rope_scaling["rope_type"] == "longrope"
    assert c.attention(0, "float32").rope_scaling == phi3.Config.from_hf(
        phi3_config(*SHAPES[0]) | {"rope_scaling": {**raw["rope_scaling"], "type": "longrope"}}
    ).attention(0, "float32").rope_scaling


@pytest.mark.parametrize("shape", SHAPES)
def test_longrope_settings_give_transformers_frequencies(shape):
    import torch
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = phi3_config(*shape)
    c = phi3.Config.from_hf(raw)
    hf = Phi3Config(**{k: v for k, v in raw.items() if k != "model_type"})
    init = ROPE_INIT_FUNCTIONS["longrope"]
    for which, seq_len in (("short_factor", None), ("long_factor", shape[4] + 1)):
        want, attention = init(hf, torch.device("cpu"), seq_len=seq_len)
        got = inverse_frequencies(c.rope_theta, c.rotary_dim or c.head_dim,
                                  c.rope_scaling[which])
        assert np.allclose(got, want.numpy(), rtol=1e-6)
        assert c.rope_scaling["attention_factor"] == pytest.approx(attention)
    assert (c.rotary_dim or c.head_dim) == int(c.head_dim * shape[2])
    assert c.rope_scaling["original_max_position_embeddings"] == shape[4]


def test_wrong_factor_count_and_unknown_rope_types_are_refused():
    raw = phi3_config(*SHAPES[0])
    raw["rope_scaling"]["long_factor"] = raw["rope_scaling"]["long_factor"][:-1]
    with pytest.raises(UnsupportedConfig, match="long_factor must list 48"):
        phi3.Config.from_hf(raw)
    raw = phi3_config(*SHAPES[0])
    raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(UnsupportedConfig, match="'yarn' is not supported") as err:
        phi3.Config.from_hf(raw)
    assert err.value.status == 400 and err.value.code == "unsupported_model"
