"""Greedy output that does not depend on what else runs, in q4f16_1 on lavapipe.

The step kernels differ with the batch: ``decode1`` (one sequence) and ``decode`` (several)
are both batched GEMV (compiler/batched_gemv.py), 1 and 8 rows a pass over the weights, and sum
each row in the same order; ``forward``
(tiled GEMM) sums in another. The f16 variants accumulate in float32, which brings them to the
f32 variants' level; batch-invariant mode (the default) makes it exact: decode rows always run
the decode plans and prompt rows the GEMM kernels, never mixed in one step.

The reference is each request run alone; then the same requests run together, arriving at
staggered times (so prompt chunks land in steps full of other sequences' decodes), twice.
On the tiny random Llama, whose logits are close together, mixed steps change the outputs of
some requests (a probe of 16 such requests x 3 rounds, 48 tokens: 11 of 48 differed with
f16 accumulation, 6 of 48 with f32 accumulation, 0 in this mode; this test fails without it).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.e2e.conftest import WEBGPU_ONLY

pytestmark = pytest.mark.slow

PROMPTS = [f"request {i}: " + "abc xyz " * (i % 7) for i in range(12)]


@pytest.fixture(scope="module")
def f16_artifact(tiny_llama_dir, compiled):
    return compiled(tiny_llama_dir, "q4f16_1", context_window=256, max_batch_size=16,
                    kernel_sets=WEBGPU_ONLY)  # (run on lavapipe only)


def run_all(engine, rounds: int, tokens: int) -> tuple[list[str], list[list[str]]]:
    async def one(prompt: str, delay: float = 0.0) -> str:
        await asyncio.sleep(delay)
        r = await engine.chat.completions.create(
            messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=tokens,
            ignore_eos=True)
        return r.choices[0].message.content

    async def main():
        solo = [await one(p) for p in PROMPTS]
        rng = random.Random(0)
        together = []
        for _ in range(rounds):
            delays = [rng.random() * 0.3 for _ in PROMPTS]
            together.append(await asyncio.gather(*(one(p, d) for p, d in zip(PROMPTS, delays))))
        return solo, together

    return asyncio.run(main())


def test_q4f16_greedy_output_is_batch_invariant(f16_artifact):
    from wick.server.local import AsyncEngine

    # the WGSL kernels (lavapipe here; "auto" would pick the CPU backend, where these short
    # requests finish before the others arrive), in the default mode
    engine = AsyncEngine(str(f16_artifact), device="vulkan")
    solo, together = run_all(engine, rounds=2, tokens=40)
    assert len(set(solo)) == len(PROMPTS)  # distinct requests, distinct answers
    for outputs in together:
        assert outputs == solo
    assert engine.core.stats.max_batch_seen >= 6  # they did run together


@pytest.mark.parametrize("quant", ["q0f16", "q4f16_1"])
def test_f16_kernels_accumulate_in_f32(quant, tiny_llama_dir, tiny_hf, compiled):
    """The same last-position logits computed by the prefill plan (tiled GEMM) and the decode
    plan (GEMV) agree to f16 rounding of the outputs, and q0f16 stays close to transformers.
    With f16 accumulation (before) they differed by 0.037 / 0.031 and q0f16 by 0.047 from
    transformers; with f32 accumulation 0.0039 / 0.0005 and 0.015."""
    import numpy as np

    from tests.e2e.helpers import decode_logits, hf_logits, make_core, prefill_logits

    from tests.e2e.conftest import TINY_OPTIONS

    # (the artifacts of tests/e2e/test_quantized.py: one compile each per session)
    sets = WEBGPU_ONLY if quant == "q0f16" else None  # (q4f16_1: the CPU tests' too)
    core = make_core(compiled(tiny_llama_dir, quant, kernel_sets=sets, **TINY_OPTIONS),
                     num_pages=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (7, 19, 33, 50)]  # 109 <= 128
    prefill = prefill_logits(core.runner, prompts)
    assert np.abs(prefill - decode_logits(core.runner, prompts)).max() < 0.01
    if quant == "q0f16":
        want = np.array([hf_logits(tiny_hf, p)[-1] for p in prompts])
        assert np.abs(prefill - want).max() < 0.03


def test_one_sequence_decodes_bit_identically_alone_and_in_a_batch(tmp_path_factory, compiled):
    """decode1 (a step of one sequence) and decode (several) give a sequence the very same
    logits, so that a lone request does not change its tokens when others join it. A model
    as wide as a small real one (hidden 576, like SmolLM2-135M): dlight's static GEMV, which
    decode1 used before, summed there in another order (logits 1.2e-4 apart here, up to 0.047
    on SmolLM2 itself)."""
    import numpy as np

    from tests.e2e.helpers import decode_logits, make_core, record
    from tests.tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path_factory.mktemp("wide") / "wide-llama", "llama", layers=1,
                          hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                          num_key_value_heads=3)
    # (the WGSL kernels only: this model is its own, no other test loads it)
    art = compiled(src, "q4f16_1", context_window=128, max_batch_size=4,
                   kernel_sets=WEBGPU_ONLY)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (7, 19, 33, 12)]
    for i, p in enumerate(prompts):
        alone = make_core(art, num_pages=32).runner
        with record(alone) as rec:
            one = decode_logits(alone, [p])[0]
        assert rec.plans == ["forward", "decode1"]
        batched = make_core(art, num_pages=32).runner
        with record(batched) as rec:
            rows = decode_logits(batched, [p] + prompts[:i] + prompts[i + 1:])
        assert rec.plans == ["forward", "decode"]
        assert np.array_equal(one, rows[0]), np.abs(one - rows[0]).max()
