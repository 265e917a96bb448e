"""Speculative decoding on real kernels: SmolLM2 q0f32 on the CPU backend. The output with
n-gram speculation or a prediction is the output without it, token for token (greedy, and
seeded sampling with penalties and logprobs); a faithful prediction of a copying task is kept
almost whole, in far fewer steps; a verify step's logits are the plain decode step's."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import CPU_ONLY
from tests.e2e.helpers import SMOLLM2, make_core, record, sibling_core
from wick.engine.api import EngineAPI

COPY = ("Copy the text exactly, word for word.\n\nText: The lighthouse stood on the rock at the "
        "edge of the bay, and every night its keeper climbed the stairs to light the lamp.\n\n"
        "Copy: The lighthouse stood")


@pytest.fixture(scope="module")
def base(compiled):
    from wick.native.cpu_backend import CpuBackend

    return make_core(compiled(SMOLLM2, "q0f32"), CpuBackend.create(), num_pages=128)


def fixed(core):
    """The core with a fixed row cost: draft lengths that do not follow this machine's load."""
    from wick.engine.draft_length import StepCost

    core.step_cost = StepCost(prior=0.2, learn=False)
    return core


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
    ngram_core = fixed(sibling_core(base, speculative={"method": "ngram", "num_tokens": 6}))
    ngram, ngram_rec = completion(ngram_core, **kw)
    pred_core = fixed(sibling_core(base))
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
    spec_core = fixed(sibling_core(base, speculative="ngram"))
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


def _masks_by_position(runner, num_prompt: int, plain_out: list[int] | None = None):
    """Spy on ``runner.step``: {output position: grammar mask} of every row whose position's
    text so far is the plain output's (``plain_out``; every row when None), and
    {output position: sampled token}."""
    seen: dict[int, bytes] = {}
    sampled: dict[int, int] = {}
    step = runner.step

    def spy(batch):
        out = step(batch)
        index = {row: s for row, s in zip(batch.sample_rows, batch.sampling)}
        for row, s in index.items():
            sid = batch.seq_ids[row]
            drafts = batch.spec_token_ids.get(sid, [])
            first = batch.seq_ids.index(sid)
            j = row - first
            pos = batch.kv.q_positions[batch.kv.qo_indptr[row + 1] - 1] - num_prompt + 1
            start = pos - j
            if plain_out is None or drafts[:j] == plain_out[start:pos]:
                seen[pos] = s.mask
                entry = out[batch.sample_rows.index(row)]
                sampled[pos] = int(getattr(entry, "token", entry))
        return out

    runner.step = spy
    return seen, sampled


@pytest.mark.slow
def test_json_schema_with_speculation_masks_each_position_as_without(base):
    """xgrammar under speculation: each drafted position's mask (the matcher accepts the
    drafts before it, then rolls back) is the mask a plain run reads there; same JSON."""
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "rooms": {"type": "integer"}},
              "required": ["city", "rooms"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "house", "schema": schema}}
    prompt = "A house in Lisbon with 4 rooms, as JSON: "
    kw = dict(prompt=prompt, max_tokens=30, temperature=0, response_format=fmt)
    plain_core = sibling_core(base)
    num_prompt = len(plain_core.prompt_ids(prompt))
    plain_masks, plain_sampled = _masks_by_position(plain_core.runner, num_prompt)
    try:
        plain = EngineAPI(plain_core).completions.create(**kw, logprobs=0)
    finally:
        del plain_core.runner.step
    assert plain.choices[0].text.startswith("{")
    out_ids = [plain_sampled[p] for p in sorted(plain_sampled)]
    spec_core = fixed(sibling_core(base, speculative="ngram"))
    spec_masks, _ = _masks_by_position(spec_core.runner, num_prompt, out_ids)
    try:
        spec = EngineAPI(spec_core).completions.create(
            **kw, logprobs=0, prediction={"type": "content", "content": plain.choices[0].text})
    finally:
        del spec_core.runner.step
    assert spec.choices[0].text == plain.choices[0].text
    assert spec.choices[0].logprobs.tokens == plain.choices[0].logprobs.tokens
    assert spec_core.stats.spec_accepted_tokens > 5
    checked = [p for p in spec_masks if p in plain_masks]
    assert len(checked) >= len(plain_masks) - 1
    assert all(spec_masks[p] == plain_masks[p] for p in checked)


@pytest.mark.slow
def test_a_4bit_twin_drafts_for_its_f32_model(base, compiled):
    """``speculative={"method": "draft"}``: SmolLM2 q4f32_1 drafts for SmolLM2 q0f32 (its own
    runner and KV pool on the same CPU backend). Greedy and seeded outputs are the plain
    ones; the twin agrees with the f32 model on most tokens; its pages go back."""
    from wick.engine.draft_model import DraftModel
    from wick.engine.model_info import ModelInfo
    from wick.engine.runner import Runner

    from tests.e2e.helpers import load_artifact

    art = load_artifact(compiled(SMOLLM2, "q4f32_1", kernel_sets=CPU_ONLY))  # (as test_quantized's)
    draft = DraftModel(Runner(art, base.runner.backend, num_pages=64),
                       ModelInfo.from_manifest(art.manifest), 64)
    steps = []  # the drafter's steps: (decode plan?, tokens, sampled rows)
    run_step = draft.runner.step
    draft.runner.step = lambda batch: (
        steps.append((batch.decode_only, batch.num_tokens, len(batch.sample_rows)))
        or run_step(batch))
    chat = [{"role": "user", "content": "Name three rivers of Europe and one fact on each."}]
    for kw in (dict(max_tokens=40, temperature=0), dict(max_tokens=24, temperature=0.8, seed=2)):
        plain = EngineAPI(sibling_core(base)).chat.completions.create(messages=chat, **kw)
        core = fixed(sibling_core(base, speculative={"method": "draft", "num_tokens": 4},
                                  draft=draft))
        spec = EngineAPI(core).chat.completions.create(messages=chat, **kw)
        assert spec.choices[0].message.content == plain.choices[0].message.content
        assert core.stats.spec_verify_steps > 0
        if kw["temperature"] == 0:
            assert core.stats.spec_acceptance_rate > 0.5, core.stats.speculation()
        assert draft.kv.free_pages == draft.kv.num_pages  # released with the sequence
        # its prompt in one step that drafts nothing (beside the model's prompt step), then
        # decode-plan steps only: the tokens a verify step kept are one-token entries
        assert not steps[0][0] and steps[0][2] == 0, steps[:3]
        assert all(decode for decode, _, _ in steps[1:]), [s for s in steps if not s[0]]
        assert any(n > 1 for _, n, _ in steps[1:]), steps  # (a catch-up of several tokens)
        steps.clear()
