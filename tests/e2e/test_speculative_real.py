"""Speculative decoding on real kernels: SmolLM2 q0f32 on the CPU backend. The output with
n-gram speculation or a prediction is the output without it, token for token (greedy, and
seeded sampling with penalties and logprobs); a faithful prediction of a copying task is kept
almost whole, in far fewer steps; a verify step's logits are the plain decode step's."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import SMOLLM2, make_core, record, sibling_core
from wick.engine.api import EngineAPI

COPY = ("Copy the text exactly, word for word.\n\nText: The lighthouse stood on the rock at the "
        "edge of the bay, and every night its keeper climbed the stairs to light the lamp.\n\n"
        "Copy: The lighthouse stood")


@pytest.fixture(scope="module")
def base(compiled):
    from wick.native.cpu_backend import CpuBackend

    return make_core(compiled(SMOLLM2, "q0f32"), CpuBackend.create(), num_pages=128)


def completion(core, **kw):
    api = EngineAPI(core)
    with record(core.runner) as rec:
        r = api.completions.create(prompt=COPY, **kw)
    return r, rec


@pytest.mark.slow
def test_copying_with_ngram_or_a_prediction_is_the_plain_output_in_fewer_steps(base):
    kw = dict(max_tokens=32, temperature=0, logprobs=0)  # (logprobs: each token)
    plain, plain_rec = completion(sibling_core(base), **kw)
    text = plain.choices[0].text
    assert text.startswith(" on the rock at the edge of the bay")  # the model copies
    ngram_core = sibling_core(base, speculative={"method": "ngram", "num_tokens": 6})
    ngram, ngram_rec = completion(ngram_core, **kw)
    pred_core = sibling_core(base)
    pred, pred_rec = completion(pred_core, prediction={"type": "content", "content": text}, **kw)
    assert ngram.choices[0].text == pred.choices[0].text == text
    assert ngram.choices[0].logprobs.tokens == pred.choices[0].logprobs.tokens == (
        plain.choices[0].logprobs.tokens)
    for core, r, rec in ((ngram_core, ngram, ngram_rec), (pred_core, pred, pred_rec)):
        s = core.stats
        assert s.spec_verify_steps > 0
        d = r.usage.completion_tokens_details
        assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (
            s.spec_accepted_tokens, s.spec_drafted_tokens - s.spec_accepted_tokens)
        assert len(rec.steps) < len(plain_rec.steps) * 0.7, (core.speculative, len(rec.steps))
        assert core.kv.free_pages + core.kv.cached_pages == core.kv.num_pages
    assert pred_core.stats.spec_acceptance_rate > 0.9
    assert pred_core.stats.spec_mean_accepted_length > 3


@pytest.mark.slow
def test_seeded_sampling_with_penalties_and_logprobs_is_unchanged(base):
    kw = dict(max_tokens=24, temperature=0.8, top_p=0.95, seed=5, n=2, logprobs=2,
              frequency_penalty=0.3, presence_penalty=0.2)
    plain, _ = completion(sibling_core(base), **kw)
    spec_core = sibling_core(base, speculative="ngram")
    prediction = {"type": "content", "content": plain.choices[0].text}
    spec, _ = completion(spec_core, prediction=prediction, **kw)
    assert spec_core.stats.spec_accepted_tokens > 0
    for a, b in zip(plain.choices, spec.choices):
        assert a.text == b.text
        assert a.logprobs.tokens == b.logprobs.tokens
        # a verify row runs the batched decode kernels, which sum a row as the one-row step
        assert a.logprobs.token_logprobs == pytest.approx(b.logprobs.token_logprobs, abs=1e-5)
        assert [sorted(t) for t in a.logprobs.top_logprobs] == [
            sorted(t) for t in b.logprobs.top_logprobs]
