"""Prompt logprobs (the completions API's ``echo`` with ``logprobs``, as lm-evaluation-harness's
``local-completions`` scores loglikelihoods): each prompt token's logprob and its position's
most likely tokens equal transformers' log-softmax over the same weights (SmolLM2 q0f32 on
the CPU kernels), over more prompt tokens than one step's entries; the output after the echo
is the output without it; streamed chunks join to the same."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.helpers import SMOLLM2, hf_logits, make_core, sibling_core
from wick.engine.api import EngineAPI

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins "
        "with a single step, and every lighthouse keeper knows the sea by its sound at night.")


@pytest.fixture(scope="module")
def api(compiled):
    from wick.native.cpu_backend import CpuBackend

    core = make_core(compiled(SMOLLM2, "q0f32"), CpuBackend.create(), num_pages=128)
    return EngineAPI(sibling_core(core))


def log_softmax(rows: np.ndarray) -> np.ndarray:
    m = rows.max(axis=1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=1, keepdims=True))


@pytest.mark.slow
def test_prompt_logprobs_equal_transformers(api, smollm2_hf):
    ids = api.core.prompt_ids(TEXT)
    assert len(ids) > api.core.scheduler.max_batch_size  # several steps of prompt rows
    r = api.completions.create(prompt=TEXT, echo=True, logprobs=3, max_tokens=0)
    choice = r.choices[0]
    assert choice.text == TEXT and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    ref = log_softmax(hf_logits(smollm2_hf, ids))  # row i predicts ids[i + 1]
    want = ref[np.arange(len(ids) - 1), ids[1:]]
    np.testing.assert_allclose(lp.token_logprobs[1:], want, atol=2e-3)
    for i, top in enumerate(lp.top_logprobs[1:]):
        best = np.argsort(-ref[i])[:3]
        texts = [api.token_texts.of(int(t))[0] for t in best]
        assert list(top)[:1] == texts[:1] or abs(ref[i, best[0]] - ref[i, best[1]]) < 1e-3
        for t, text in zip(best, texts):
            if text in top:
                assert top[text] == pytest.approx(ref[i, t], abs=2e-3)
    assert api.core.kv.free_pages + api.core.kv.cached_pages == api.core.kv.num_pages


@pytest.mark.slow
def test_echo_then_output_streamed_or_not(api):
    plain = api.completions.create(prompt=TEXT, max_tokens=6, temperature=0, logprobs=1)
    echoed = api.completions.create(prompt=TEXT, max_tokens=6, temperature=0, logprobs=1,
                                    echo=True)
    c = echoed.choices[0]
    assert c.text == TEXT + plain.choices[0].text
    n = len(api.core.prompt_ids(TEXT))
    assert c.logprobs.tokens[n:] == plain.choices[0].logprobs.tokens
    assert c.logprobs.token_logprobs[n:] == pytest.approx(
        plain.choices[0].logprobs.token_logprobs, abs=1e-5)
    assert c.logprobs.text_offset[n] == len(TEXT)
    chunks = list(api.completions.create(prompt=TEXT, max_tokens=6, temperature=0, logprobs=1,
                                         echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(
        c.logprobs.token_logprobs[1:], abs=1e-6)
    bare = api.completions.create(prompt=TEXT, echo=True, max_tokens=0)  # no logprobs
    assert bare.choices[0].text == TEXT and bare.choices[0].logprobs is None
