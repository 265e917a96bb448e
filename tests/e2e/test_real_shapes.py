"""The WGSL kernels over the widest vocabulary a built-in model has, on lavapipe, against
transformers.

The real checkpoints run on the CPU kernel set (test_smollm2.py, test_gemma3_270m.py): one
forward pass of 32 rows took 20 s of SmolLM2-135M on lavapipe and 33 s of Gemma-3-270m, over
a minute each on a busy CI machine; the families' layers run in WGSL on the tiny models of
test_families.py and test_tiny_parity.py. What a real model's size adds to the WGSL kernels is
mostly its vocabulary: the head and the sampler over 262,144 rows (dispatches past 65,535
workgroups, say). This is a model with Gemma-3-270m's vocabulary, attention (4 query heads and
1 KV head of 256; a sliding layer, window 512, and a global one) and MLP (2048), 64 wide
instead of 640 (a 67 MB random checkpoint instead of 670), tied head, in q4f32_m as the real
one (an 8-bit head: the widest kernel wick runs), against transformers holding the artifact's
weights. A step over this vocabulary costs seconds on lavapipe: seven steps, every plan.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import WEBGPU_ONLY
from tests.e2e.helpers import (decode_logits, greedy, hf_greedy, hf_logits,
                               hf_model_from_artifact, ids_of, load_artifact, load_hf, make_core,
                               prefill_logits, record, run_core)

pytestmark = pytest.mark.slow

VOCAB = 262144
GEMMA_270M_SHAPES = dict(
    hidden_size=64, intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
    head_dim=256, query_pre_attn_scalar=256, vocab_size=VOCAB, sliding_window=512,
    layer_types=["sliding_attention", "full_attention"],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})


def test_a_262k_vocabulary_in_every_plan_matches_transformers(tmp_path, compiled):
    from tests.tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path / "gemma3-270m-vocab", "gemma3", seed=5, layers=2,
                          tie=True, **GEMMA_270M_SHAPES)
    art = compiled(src, "q4f32_m", context_window=1024, kernel_sets=WEBGPU_ONLY)
    artifact = load_artifact(art)
    assert artifact.model["vocab_size"] == VOCAB
    table = next(p for p in artifact.manifest["params"]
                 if p["name"].startswith("model.embed_tokens.table.weight_q"))
    assert table["dtype"] == "uint32" and table["shape"][1] == 64 * 8 // 32  # 8 bits each
    hf = hf_model_from_artifact(artifact, load_hf(src))

    prompts = [ids_of(7, 4), ids_of(33, 5)]
    want = np.array([hf_logits(hf, p)[-1] for p in prompts])
    # forward (the prompts' last positions), then decode1 and decode, each after a forward step
    # (one runner: each run writes the KV pages of every position it reads)
    core = make_core(art, num_pages=32)
    runner = core.runner
    for batch, run, plans in ((prompts, prefill_logits, ["forward"]),
                              (prompts[:1], decode_logits, ["forward", "decode1"]),
                              (prompts, decode_logits, ["forward", "decode"])):
        with record(runner) as rec:
            got = run(runner, batch)
        assert rec.plans == plans
        diff = np.abs(got - want[:len(batch)]).max()
        print(f"{plans[-1]}, {len(batch)} sequence(s): max|wick - hf| = {diff:.2e} "
              f"(logits up to {np.abs(want).max():.1f})")
        assert got.shape == (len(batch), VOCAB) and diff < 1e-3
        assert list(np.argmax(got, axis=1)) == list(np.argmax(want[:len(batch)], axis=1))
    # and through the engine: the sampler's argmax over the vocabulary, prefill and decode1
    (got,) = run_core(core, prompts[:1], greedy(2))
    assert got == hf_greedy(hf, prompts[0], 2)
