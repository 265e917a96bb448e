"""Tiny random Llamas compiled to q0f32 and run on the real backend, against transformers on the
same HF directory (float32): logits, greedy tokens, paging, chunked prefill, batching."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import TINY_OPTIONS, WEBGPU_ONLY
from tests.e2e.helpers import (
    ids_of,
    decode_logits,
    greedy,
    hf_greedy,
    hf_logits,
    load_artifact,
    load_hf,
    make_core,
    prefill_logits,
    record,
    run_core,
    sibling_core,
)

LOGIT_TOL = 1e-3
PLAN_TOL = 1e-4
VARIANTS = ["untied-2L", "tied-2L", "untied-6L"]


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request, compiled, backend):
    """(core, hf, artifact) of one tiny variant."""
    directory = {
        "untied-2L": "tiny_llama_dir", "tied-2L": "tiny_tied_dir", "untied-6L": "tiny_deep_dir",
    }[request.param]
    path = request.getfixturevalue(directory)
    shared = request.param == "untied-2L"  # (the session's tiny model: every set)
    art_dir = compiled(path, "q0f32", kernel_sets=None if shared else WEBGPU_ONLY, **TINY_OPTIONS)
    if shared:  # the session's shared core and reference
        core = request.getfixturevalue("tiny_core")
        hf = request.getfixturevalue("tiny_hf")
    else:
        core = make_core(art_dir, num_pages=64)
        hf = load_hf(path)
    return core, hf, load_artifact(art_dir)


@pytest.fixture
def model(variant):
    return variant[:2]


def test_variants_compiled_as_configured(variant):
    core, hf, art = variant
    names = {p.name for p in art.params}
    assert ("lm_head.weight" in names) is (not hf.config.tie_word_embeddings)
    assert sum(".qkv_proj." in n for n in names) == hf.config.num_hidden_layers
    assert core.info.prefill_chunk_size == 128 and core.info.max_batch_size == 8


def test_prefill_logits_match_transformers(model):
    core, hf = model
    prompts = [ids_of(23, 1), ids_of(5, 2), ids_of(40, 3)]
    # one sequence alone, then a ragged batch of three in one step
    alone = prefill_logits(core.runner, prompts[:1])[0]
    batch = prefill_logits(core.runner, prompts)
    for i, p in enumerate(prompts):
        ref = hf_logits(hf, p)[-1]
        diff = np.abs(batch[i] - ref).max()
        print(f"prefill logits prompt {len(p)} tokens: max|wick - hf| = {diff:.2e}")
        assert diff < LOGIT_TOL
        assert int(np.argmax(batch[i])) == int(np.argmax(ref))
    assert np.abs(alone - batch[0]).max() < PLAN_TOL


def test_greedy_32_tokens_match_transformers(model):
    core, hf = model
    prompt = core.tokenizer.encode("Hello, tiny world! ")
    with record(core.runner) as rec:
        (got,) = run_core(core, [prompt], greedy(32))
    want = hf_greedy(hf, prompt, 32)
    assert got == want
    assert len(set(want)) > 4  # a real continuation, not one token repeated
    # one prefill step, then 31 decode steps through the single-sequence decode plan
    assert [s.num_tokens for s in rec.steps] == [len(prompt)] + [1] * 31
    assert rec.plans == ["forward"] + ["decode1"] * 31


def test_long_prompt_across_pages_and_page_boundaries(tiny_core, tiny_hf):
    prompt = ids_of(50, 4)  # 4 pages of 16 before the first decoded token
    n = 40  # decoding crosses the 64- and 80-token page boundaries
    (got,) = run_core(tiny_core, [prompt], greedy(n))
    assert len(prompt) + n > 5 * tiny_core.info.page_size
    assert got == hf_greedy(tiny_hf, prompt, n)
    assert tiny_core.kv.available_pages == tiny_core.kv.num_pages


def test_chunked_prefill_gives_the_same_tokens(tiny_core, tiny_hf):
    prompt = ids_of(50, 5)
    chunked = sibling_core(tiny_core, prefill_chunk_size=16)
    with record(chunked.runner) as rec:
        (got,) = run_core(chunked, [prompt], greedy(24))
    # 50 prompt tokens in chunks of 16, 16, 16, 2; only the last chunk samples
    assert [s.num_tokens for s in rec.steps[:4]] == [16, 16, 16, 2]
    assert [len(s.sampled) for s in rec.steps[:4]] == [0, 0, 0, 1]
    (whole,) = run_core(tiny_core, [prompt], greedy(24))
    assert got == whole == hf_greedy(tiny_hf, prompt, 24)


LENGTHS = (5, 17, 33, 50)


@pytest.mark.parametrize("schedule", ["one-step-prefill", "mixed-chunks", "preemption"])
def test_concurrent_sequences_equal_solo_and_transformers(tiny_core, tiny_hf, schedule):
    prompts = [ids_of(n, 10 + n) for n in LENGTHS]
    n_new = 32
    solo = [run_core(tiny_core, [p], greedy(n_new))[0] for p in prompts]
    core = {
        "one-step-prefill": lambda: sibling_core(tiny_core),
        # 24 tokens a step: prompts are prefilled in chunks while others already decode
        # (the mixed scheduler: batch_invariant=False)
        "mixed-chunks": lambda: sibling_core(tiny_core, prefill_chunk_size=24,
                                             batch_invariant=False),
        # 8 pages cannot hold all four: the newest are preempted and recomputed
        "preemption": lambda: sibling_core(tiny_core, num_pages=8),
    }[schedule]()
    with record(core.runner) as rec:
        together = run_core(core, prompts, greedy(n_new))
    # really batched (with 8 pages at most three fit at once)
    assert rec.max_batch == (3 if schedule == "preemption" else len(prompts))
    assert together == solo
    for p, got in zip(prompts, together):
        assert got == hf_greedy(tiny_hf, p, n_new)
    if schedule == "one-step-prefill":
        assert rec.steps[0].tokens_per_seq == list(LENGTHS)
    if schedule == "mixed-chunks":
        assert any(1 in s.tokens_per_seq and max(s.tokens_per_seq) > 1 for s in rec.steps)
    if schedule == "preemption":
        assert core.scheduler.num_preemptions > 0
    assert core.kv.available_pages == core.kv.num_pages


def test_decode_plan_matches_prefill_plan(model):
    core, hf = model
    # 16 fills a page exactly; 17's last token opens a new page; 33 spans three
    prompts = [ids_of(n, 20 + n) for n in (7, 16, 17, 33)]
    with record(core.runner) as rec:
        pre = prefill_logits(core.runner, prompts)
    assert rec.plans == ["forward"]
    with record(core.runner) as rec:
        dec = decode_logits(core.runner, prompts)
    assert rec.plans == ["forward", "decode"]
    diff = np.abs(pre - dec).max()
    print(f"decode plan vs prefill plan: max diff {diff:.2e}")
    assert diff < PLAN_TOL
    for i, p in enumerate(prompts):
        assert np.abs(dec[i] - hf_logits(hf, p)[-1]).max() < LOGIT_TOL
    # one sequence alone decodes through the static-shape plan
    for i, p in enumerate(prompts):
        with record(core.runner) as rec:
            (one,) = decode_logits(core.runner, [p])
        assert rec.plans == ["forward", "decode1"]
        assert np.abs(one - pre[i]).max() < PLAN_TOL


@pytest.mark.parametrize("length", [128, 129, 300])
def test_prompts_at_and_beyond_the_prefill_chunk(tiny_core, tiny_hf, length):
    prompt = ids_of(length, 40 + length)
    with record(tiny_core.runner) as rec:
        (got,) = run_core(tiny_core, [prompt], greedy(8))
    assert max(s.num_tokens for s in rec.steps) <= tiny_core.info.prefill_chunk_size
    assert len([s for s in rec.steps if not s.sampled]) == -(-length // 128) - 1
    assert got == hf_greedy(tiny_hf, prompt, 8)


def test_filling_the_context_window(tiny_core, tiny_hf):
    window = tiny_core.info.context_window
    assert window == 512
    prompt = ids_of(window - 20, 50)
    (got,) = run_core(tiny_core, [prompt], greedy(20))
    assert got == hf_greedy(tiny_hf, prompt, 20)
    with pytest.raises(Exception) as e:
        run_core(tiny_core, [prompt], greedy(21))
    assert getattr(e.value, "code", None) == "context_length_exceeded"


def test_more_sequences_than_max_batch(tiny_core, tiny_hf):
    prompts = [ids_of(3 + 2 * i, 60 + i) for i in range(11)]
    solo = [run_core(tiny_core, [p], greedy(6))[0] for p in prompts]
    with record(tiny_core.runner) as rec:
        together = run_core(tiny_core, prompts, greedy(6))
    assert rec.max_batch == tiny_core.info.max_batch_size == 8
    assert together == solo
    assert together[10] == hf_greedy(tiny_hf, prompts[10], 6)


def test_seeded_sampling_is_independent_of_batching_and_preemption(tiny_core):
    from wick.engine.sequence import SamplingParams

    prompts = [ids_of(n, 70 + n) for n in LENGTHS]
    params = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=32, seed=500 + i)
              for i in range(len(prompts))]
    solo = [run_core(tiny_core, [p], [sp])[0] for p, sp in zip(prompts, params)]
    core = sibling_core(tiny_core, num_pages=8, prefill_chunk_size=24)
    with record(core.runner) as rec:
        together = run_core(core, prompts, params)
    assert core.scheduler.num_preemptions > 0 and rec.max_batch > 1
    assert together == solo
    assert len({tuple(t) for t in solo}) == len(prompts)
