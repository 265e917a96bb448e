"""Llama 3.x RoPE scaling recovered from llama.cpp's per-frequency divisors (a GGUF's
rope_freqs.weight), checked against transformers' own llama3 frequencies."""

from __future__ import annotations

import numpy as np
import pytest

from wick.compiler.rope_factors import NotLlama3Factors, llama3_divisors, llama3_scaling

# Llama 3.1 8B, Llama 3.2 1B / 3B (head_dim 128 / 64 / 128)
CASES = [(500000.0, 128, 8.0), (500000.0, 64, 32.0), (500000.0, 128, 32.0)]


def hf_inv_freq(theta: float, head_dim: int, scaling: dict | None):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, rope_theta=theta,
                      rope_scaling=scaling, max_position_embeddings=131072)
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    inv, _ = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    return inv.double().numpy()


@pytest.mark.parametrize("theta,head_dim,factor", CASES)
def test_recovered_scaling_gives_transformers_frequencies(theta, head_dim, factor):
    original = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    want = hf_inv_freq(theta, head_dim, original)
    # what llama.cpp's converter writes: default frequency / scaled frequency
    divisors = (hf_inv_freq(theta, head_dim, None) / want).astype(np.float32)
    assert np.allclose(divisors, llama3_divisors(original, theta, head_dim), rtol=1e-5)
    recovered = llama3_scaling(divisors, theta, head_dim)
    got = hf_inv_freq(theta, head_dim, recovered)
    assert np.max(np.abs(got - want) / want) < 1e-5
    assert recovered["factor"] == pytest.approx(factor)


def test_divisors_that_are_not_llama3_are_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(NotLlama3Factors):
        llama3_scaling(1 + rng.random(64) * 7, 500000.0, 128)
    with pytest.raises(NotLlama3Factors):
        llama3_scaling(np.ones(64), 500000.0, 128)
    with pytest.raises(NotLlama3Factors):
        llama3_scaling(np.ones(10), 500000.0, 128)
