"""Two loaded artifacts on ONE backend (``build_core(..., backend=shared)``, or the session's
``backend`` fixture): the first engine must keep computing its own model.

A Runner's dispatches name kernels by index; ``load_kernels`` appends and returns the first
index, so a second artifact must not change what the first one runs: neither a q4 variant
(different kernel signatures) nor a wider model of the same architecture (same kernel names,
other baked-in sizes), where a mix-up would give silently wrong logits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.e2e.conftest import TINY_OPTIONS, WEBGPU_ONLY
from tests.e2e.helpers import hf_logits, make_core, prefill_logits


def make_wide_tiny_llama(out):
    """The tiny Llama with hidden 128 / intermediate 256 (tests.tiny_models has no knob)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_models import CHATML, byte_level_tokenizer

    tok = byte_level_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "add_bos_token": False}))
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=257, eos_token_id=258))
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.mark.parametrize("second", ["q4-variant", "wider-model"])
def test_second_artifact_on_a_shared_backend_leaves_the_first_intact(
        second, tiny_llama_dir, tiny_hf, compiled, tmp_path):
    from wick.native.wgpu_backend import WgpuBackend

    shared = WgpuBackend.create()
    prompt = np.random.default_rng(0).integers(0, 256, size=20).tolist()
    first = make_core(compiled(tiny_llama_dir, "q0f32", **TINY_OPTIONS), shared)
    want = hf_logits(tiny_hf, prompt)[-1]
    assert np.abs(prefill_logits(first.runner, [prompt])[0] - want).max() < 1e-3  # alone: fine
    if second == "q4-variant":
        make_core(compiled(tiny_llama_dir, "q4f32_1", **TINY_OPTIONS), shared)
    else:
        make_core(compiled(make_wide_tiny_llama(tmp_path), "q0f32", kernel_sets=WEBGPU_ONLY,
                           **TINY_OPTIONS), shared)
    assert np.abs(prefill_logits(first.runner, [prompt])[0] - want).max() < 1e-3
