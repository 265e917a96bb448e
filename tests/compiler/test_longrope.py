"""LongRoPE settings (Phi-3 128k / 3.5 / 4-mini) and YaRN's read from a config, against
transformers' own frequencies and attention factors; refusals of what wick does not implement."""

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
    raw["rope_scaling"] = {"rope_type": "dynamic", "alpha": 4.0}  # (plain dynamic is read)
    with pytest.raises(UnsupportedConfig, match="'dynamic' is not supported") as err:
        phi3.Config.from_hf(raw)
    assert err.value.status == 400 and err.value.code == "unsupported_model"


def llama_config(head_dim: int, theta: float, max_pos: int, scaling: dict) -> dict:
    heads = 4
    return {"model_type": "llama", "vocab_size": 100, "hidden_size": heads * head_dim,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
            "num_key_value_heads": heads, "max_position_embeddings": max_pos,
            "rope_theta": theta, "rms_norm_eps": 1e-5, "rope_scaling": scaling}


YARN_CASES = [  # (head_dim, theta, max positions, rope_scaling)
    # Qwen3's documented long-context setting; OLMo 3 7B's (attention factor given)
    (128, 1e6, 131072, {"rope_type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 32768}),
    (128, 5e5, 65536, {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.2079,
                       "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 8192}),
    # DeepSeek-style mscale pair, the older "type" key; gpt-oss's untruncated ramp
    (64, 1e4, 16384, {"type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096}),
    (64, 15e4, 131072, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                        "truncate": False, "original_max_position_embeddings": 4096}),
    # the pretrained length at the top level too: that one wins
    (128, 1e6, 32768, {"rope_type": "yarn", "factor": 8.0,
                       "original_max_position_embeddings": 32768}),
]
TOP_LEVEL_ORIGINAL = {"original_max_position_embeddings": 4096}


@pytest.mark.parametrize("case", YARN_CASES, ids=["qwen3", "olmo3", "mscale", "untruncated",
                                                  "top_level_original"])
def test_yarn_settings_give_transformers_frequencies(case):
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from wick.compiler.models import llama

    raw = llama_config(*case)
    if case is YARN_CASES[-1]:
        raw.update(TOP_LEVEL_ORIGINAL)
    c = llama.Config.from_hf(raw)
    hf = LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    want, attention = ROPE_INIT_FUNCTIONS["yarn"](hf, torch.device("cpu"))
    scaling = c.rope_scaling
    assert scaling["rope_type"] == "yarn" and scaling["short_factor"] == scaling["long_factor"]
    got = inverse_frequencies(c.rope_theta, c.head_dim, scaling["short_factor"])
    assert np.allclose(got, want.numpy(), rtol=2e-6)
    assert scaling["attention_factor"] == pytest.approx(attention, rel=1e-9)
    factors = np.asarray(scaling["short_factor"])
    assert factors.min() == pytest.approx(1.0) and factors.max() > 1.5  # (both ends of the ramp)
