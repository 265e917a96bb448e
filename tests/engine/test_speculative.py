"""Speculative decoding on the fake runner (which reads each row's context back through the
KV index arrays): the output is the output without speculation, token for token, greedy or
seeded, with n > 1, stop strings and length limits; verify steps happen and keep what agrees;
the KV pool is whole again afterwards and the prefix cache never holds a rejected draft."""

from __future__ import annotations

import pytest

from engine_fakes import EOS, ByteTokenizer, FakeRunner, make_info
from wick.engine import EngineAPI
from wick.engine.draft_length import StepCost
from wick.engine.sequence import SamplingParams, Sequence
from wick.engine.detokenize import IncrementalDetokenizer

MSGS = [{"role": "user", "content": "Copy: the lighthouse stood on the rock."}]


def FixedCost(prior: float) -> StepCost:
    """What a row costs, fixed: the draft lengths do not follow this machine's load."""
    return StepCost(prior=prior, learn=False)


def build(num_pages: int = 256, eos: int | None = None, **core) -> tuple[EngineAPI, FakeRunner]:
    info = make_info()
    runner = FakeRunner(num_pages, info.page_size, eos_id=eos)
    api = EngineAPI.from_runner(runner, ByteTokenizer(), info, num_pages=num_pages, **core)
    api.core.step_cost = FixedCost(prior=0.2)
    runner.kv = api.core.kv
    finish_step = api.core.finish_step

    def checked(state, tokens):
        # after every step a running sequence holds room for what it computed, no more: the
        # K/V of rejected drafts was cut off (truncate), its pages given back
        outputs = finish_step(state, tokens)
        for seq in api.core.scheduler.running:
            assert api.core.kv.num_tokens(seq.seq_id) == seq.num_computed_tokens
        return outputs

    api.core.finish_step = checked
    return api, runner


def run(api: EngineAPI, **kw):
    r = api.chat.completions.create(messages=MSGS, **kw)
    return [(c.message.content, c.finish_reason) for c in r.choices], r.usage


def verify_steps(runner: FakeRunner) -> list:
    return [b for b in runner.batches if b.spec_token_ids]


def assert_pool_whole(api: EngineAPI) -> None:
    kv = api.core.kv
    assert kv.free_pages + kv.cached_pages == kv.num_pages
    assert kv.held_pages == 0


CASES = [
    dict(max_tokens=40, temperature=0),
    dict(max_tokens=40, temperature=0.9, seed=11),
    dict(max_tokens=33, temperature=0.7, top_p=0.9, seed=3, n=3),
    dict(max_tokens=40, temperature=0, stop=["e "]),
    dict(max_tokens=40, temperature=1.0, seed=5, stop=["dd", "€"]),
]


@pytest.mark.parametrize("kw", CASES)
def test_a_prediction_of_the_output_itself_is_kept_whole(kw):
    plain, _ = build()
    expected, usage = run(plain, **kw)
    api, runner = build()
    text = expected[0][0]
    got, usage2 = run(api, prediction={"type": "content", "content": text}, **kw)
    assert got == expected
    steps = verify_steps(runner)
    assert steps, "no verify step ran"
    details = usage2.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert usage2.completion_tokens == usage.completion_tokens
    if kw.get("n", 1) == 1 and not kw.get("stop"):
        # choice 0 follows its prediction exactly: every draft is kept, far fewer steps
        assert details.rejected_prediction_tokens == 0
        assert len(runner.batches) < len(plain.core.runner.batches) / 2
    assert_pool_whole(api)


@pytest.mark.parametrize("kw", CASES)
def test_ngram_speculation_and_a_wrong_prediction_change_nothing(kw):
    plain, _ = build()
    expected, _ = run(plain, **kw)
    for core, extra in (({"speculative": "ngram"}, {}),
                        ({"speculative": {"method": "ngram", "num_tokens": 3}},
                         {"prediction": {"type": "content",
                                         "content": [{"type": "text", "text": "cc ab é."}]}}),
                        ({}, {"prediction": {"type": "content", "content": "ab" * 30}})):
        api, runner = build(**core)
        got, usage = run(api, **kw, **extra)
        assert got == expected, (core, extra)
        d = usage.completion_tokens_details
        drafted = sum(len(v) for b in runner.batches for v in b.spec_token_ids.values())
        assert d.accepted_prediction_tokens + d.rejected_prediction_tokens == drafted
        assert_pool_whole(api)


def test_verify_rows_are_one_token_entries_that_see_the_drafts_before_them():
    api, runner = build()
    expected, _ = run(build()[0], max_tokens=24, temperature=0)
    run(api, max_tokens=24, temperature=0,
        prediction={"type": "content", "content": expected[0][0]})
    step = verify_steps(runner)[0]
    (sid, drafts), = step.spec_token_ids.items()
    k = len(drafts)
    assert step.seq_ids == [sid] * (k + 1) and step.decode_only
    assert step.token_ids[1:] == drafts
    assert step.kv.qo_indptr == list(range(k + 2))
    start = step.kv.q_positions[0]
    assert step.kv.q_positions == list(range(start, start + k + 1))
    assert step.sample_rows == list(range(k + 1))
    # each row its own position's uniform: the rows a plain step would sample
    uniforms = [row.uniform for row in step.sampling]
    assert len(set(uniforms)) == k + 1


def test_rejected_drafts_never_reach_the_prefix_cache():
    api, runner = build(num_pages=64)
    wrong = {"type": "content", "content": "zzzz yyyy xxxx wwww vvvv"}
    a, _ = run(api, max_tokens=40, temperature=0, prediction=wrong)
    b, _ = run(api, max_tokens=40, temperature=0)  # the prompt's pages come from the cache
    plain, _ = run(build()[0], max_tokens=40, temperature=0)
    assert a == b == plain
    assert api.core.stats.spec_drafted_tokens > api.core.stats.spec_accepted_tokens
    assert_pool_whole(api)


def test_stats_count_acceptance():
    api, runner = build(speculative="ngram")
    expected, _ = run(build()[0], max_tokens=40, temperature=0)
    run(api, max_tokens=40, temperature=0,
        prediction={"type": "content", "content": expected[0][0]})
    s = api.core.stats
    assert s.spec_verify_steps == len(verify_steps(runner))
    assert s.spec_drafted_tokens >= s.spec_accepted_tokens > 0
    assert s.spec_acceptance_rate == s.spec_accepted_tokens / s.spec_drafted_tokens
    assert s.spec_mean_accepted_length == pytest.approx(
        (s.spec_accepted_tokens + s.spec_verify_steps) / s.spec_verify_steps)


def test_each_verify_row_has_the_penalties_of_its_position():
    params = SamplingParams(temperature=0.8, seed=1, frequency_penalty=0.5,
                            presence_penalty=0.25, repetition_penalty=1.3,
                            logit_bias=((97, 2.0),), logprobs=True, top_logprobs=2)
    tok = ByteTokenizer()

    def seq(output):
        s = Sequence(0, "r", 0, [1, 2, 3], params, 100, IncrementalDetokenizer(tok, [1, 2, 3]))
        for t in output:
            s.append_token(t)
        return s

    drafts = [97, 98, 97, 99]
    rows = seq([97, 5]).sampling_rows(drafts)
    for j, row in enumerate(rows):
        assert row == seq([97, 5, *drafts[:j]]).sampling_row(), j


@pytest.mark.parametrize("bad, param", [
    ({"type": "text", "content": "x"}, "prediction.type"),
    ({"type": "content"}, "prediction.content"),
    ({"type": "content", "content": 5}, "prediction.content"),
    ({"type": "content", "content": [{"type": "image", "text": "x"}]}, "prediction.content[0]"),
    ({"type": "content", "content": "x", "extra": 1}, "prediction.extra"),
    ("text", "prediction"),
])
def test_a_bad_prediction_is_a_400_naming_the_field(bad, param):
    from wick.engine import InvalidRequestError

    api, _ = build()
    with pytest.raises(InvalidRequestError) as e:
        api.chat.completions.create(messages=MSGS, max_tokens=4, prediction=bad)
    assert e.value.param == param


def test_completions_take_a_prediction_too():
    api, runner = build()
    plain = build()[0].completions.create(prompt="abc abc", max_tokens=30, temperature=0)
    r = api.completions.create(prompt="abc abc", max_tokens=30, temperature=0,
                               prediction={"type": "content", "content": plain.choices[0].text})
    assert r.choices[0].text == plain.choices[0].text
    assert r.usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert verify_steps(runner)


def test_a_bad_speculative_config_is_refused():
    from wick.engine import InvalidRequestError

    for bad in ("eagle", {"method": "ngram", "num_tokens": 0}, {"method": "ngram", "k": 3}, 5,
                {"method": "ngram", "numTokens": True}):
        with pytest.raises(InvalidRequestError) as e:
            build(speculative=bad)
        assert e.value.param == "speculative"


@pytest.mark.parametrize("window, pool", [(6, None), (None, 6)])
def test_speculation_in_a_windowed_cache(window, pool):
    """A model whose every layer slides (its pages freed behind the window), and one with a
    second, windowed pool: verify steps read the window of each entry, rejections cut both."""
    def windowed(**core):
        info = make_info(kv_window=window, kv_window_pool=pool, context_window=512)
        runner = FakeRunner(64, info.page_size, window=window, num_window_pages=64 if pool else 0,
                            local_window=pool)
        api = EngineAPI.from_runner(runner, ByteTokenizer(), info, num_pages=64, **core)
        api.core.step_cost = FixedCost(prior=0.2)
        runner.kv = api.core.kv
        return api, runner

    kw = dict(max_tokens=60, temperature=0)
    expected, _ = run(windowed()[0], **kw)
    api, runner = windowed(speculative="ngram")
    text = expected[0][0]
    got, usage = run(api, prediction={"type": "content", "content": text[:20] + "zz" + text[22:]},
                     **kw)
    assert got == expected
    d = usage.completion_tokens_details
    assert d.accepted_prediction_tokens > 20 and d.rejected_prediction_tokens > 0
    kv = api.core.kv
    for pool_ in (getattr(kv, "main", kv), getattr(kv, "local", None)):
        if pool_ is not None:
            assert pool_.free_pages + pool_.cached_pages == pool_.num_pages


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_grammar_masks_each_drafted_position(asynchronous):
    """Under a grammar every verify row gets the mask of its own position (the matcher
    accepts the drafts before it, then rolls them back); drafts the grammar refuses are cut
    before verification; the output is the grammar's, and the matcher ends where a plain
    run's does (sync matchers and the wasm build's promise-answering ones)."""
    import asyncio

    from engine_fakes import IM_END, AsyncFakeRunner, LiteralGrammar

    from wick.engine import AsyncEngineAPI
    from wick.engine.core import EngineCore

    info = make_info()
    grammar = LiteralGrammar(info.vocab_size, IM_END, asynchronous)
    runner = AsyncFakeRunner(64, info.page_size)
    core = EngineCore(runner, ByteTokenizer(), info, num_pages=64, grammar=grammar,
                      speculative="ngram")
    core.step_cost = FixedCost(prior=0.2)
    runner.kv = core.kv
    api = AsyncEngineAPI(core)
    text = "the rock, the rock, the bay"
    fmt = {"type": "grammar", "grammar": f'root ::= "{text}"'}
    r = asyncio.run(api.chat.completions.create(
        messages=MSGS, response_format=fmt, temperature=0.7, seed=1,
        prediction={"type": "content", "content": "the rock, the cat, the bay!!"}))
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == "stop"
    steps = verify_steps(runner)
    assert steps
    for batch in steps:
        (sid, drafts), = batch.spec_token_ids.items()
        for j, row in enumerate(batch.sampling):
            allowed = [t for t in range(info.vocab_size)
                       if row.mask[4 * (t // 32) + (t % 32) // 8] >> (t % 8) & 1]
            # the literal grammar allows one next byte: row j's is the draft it checks (a
            # draft the grammar refused, "cat", was cut before the step)
            assert allowed == ([drafts[j]] if j < len(drafts) else allowed) and len(allowed) == 1
    d = r.usage.completion_tokens_details
    assert d.accepted_prediction_tokens >= 10
    assert core.stats.spec_drafted_tokens == d.accepted_prediction_tokens + (
        d.rejected_prediction_tokens)


def _chi_square_p(table: list[list[int]]) -> float:
    """The p-value of Pearson's chi-square test of homogeneity of a 2 x c table (the survival
    function of chi-square by the Wilson-Hilferty normal approximation)."""
    import math

    cols = [sum(c) for c in zip(*table)]
    total = sum(cols)
    stat = 0.0
    for row in table:
        n = sum(row)
        for observed, col in zip(row, cols):
            expected = n * col / total
            stat += (observed - expected) ** 2 / expected
    dof = len(cols) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampled_speculation_keeps_the_distribution():
    """Many seeded draws (disjoint seeds) of tokens 1-3, with drafts from a prediction and
    without: a chi-square test finds the same joint distribution; and a biased verifier (one
    that keeps a draft whenever the model's token is merely likely) is found out."""
    import random

    likely = build()[0].completions.create(prompt="ab", max_tokens=4, temperature=0)
    likely = likely.choices[0].text  # drafts of the most likely path: kept often, not always

    def draws(seeds, **core):
        api, _ = build(**core)
        out = []
        for seed in seeds:
            kw = dict(prompt="ab", max_tokens=4, temperature=0.7, seed=seed)
            if core:
                kw["prediction"] = {"type": "content", "content": likely}
            out.append(api.completions.create(**kw).choices[0].text[1:4])
        return out, api.core.stats

    n = 1200
    plain, _ = draws(range(n))
    spec, stats = draws(range(n, 2 * n), speculative="ngram")
    assert stats.spec_accepted_tokens > 100 and stats.spec_drafted_tokens > (
        stats.spec_accepted_tokens + 100)  # drafts were kept and refused, many times
    cats = sorted(set(plain) | set(spec))
    keep = [c for c in cats if plain.count(c) + spec.count(c) >= 20]
    table = [[sum(t == c for t in arm) for c in keep] + [sum(t not in keep for t in arm)]
             for arm in (plain, spec)]
    assert len(keep) >= 8
    assert _chi_square_p(table) > 0.001, table
    # the test has power: outputs drawn with every draft accepted are a different law
    rng = random.Random(0)
    forced = [likely[1:4] if rng.random() < 0.3 else t for t in plain]
    table = [[sum(t == c for t in arm) for c in keep] + [sum(t not in keep for t in arm)]
             for arm in (plain, forced)]
    assert _chi_square_p(table) < 1e-6


def test_echo_reads_the_prompt_once_through_preemption():
    """Prompt logprobs of two requests in a pool too small for both: the preempted one
    computes its prompt again as an ordinary chunk (its logprobs were read), never twice; its
    tokens and logprobs are those of a run with room to spare."""
    from wick.engine.sequence import SamplingParams

    def run_two(num_pages):
        api, _ = build(num_pages=num_pages)
        core = api.core
        params = SamplingParams(temperature=0, max_tokens=20, prompt_logprobs=0)
        prompts = [list(b"the lighthouse stood on the rock"), list(b"and every night its keeper")]
        rids = [core.add_request(p, params, prompt_param="prompt") for p in prompts]
        out = {rid: ([], []) for rid in rids}
        while core.has_unfinished():
            for o in core.step():
                out[o.request_id][0].extend(o.token_ids)
                out[o.request_id][1].extend(lp.logprob for lp in o.prompt_logprobs)
        return [out[r] for r in rids], core

    want, _ = run_two(256)
    got, core = run_two(16)
    assert core.scheduler.num_preemptions > 0
    assert got == want
    assert [len(lps) for _, lps in got] == [31, 25]  # each prompt token after the first, once
    assert core.kv.free_pages + core.kv.cached_pages == core.kv.num_pages


def test_echo_with_no_new_token():
    api, runner = build()
    r = api.completions.create(prompt="abcdef", echo=True, logprobs=1, max_tokens=0)
    c = r.choices[0]
    assert (c.text, c.finish_reason, r.usage.completion_tokens) == ("abcdef", "length", 0)
    ids = api.core.prompt_ids("abcdef")
    assert len(c.logprobs.tokens) == len(ids) and c.logprobs.token_logprobs[0] is None
    assert all(lp is not None for lp in c.logprobs.token_logprobs[1:])
    steps = len(runner.batches)
    bare = api.completions.create(prompt="abcdef", echo=True, max_tokens=0)  # no logprobs
    assert bare.choices[0].text == "abcdef" and bare.choices[0].logprobs is None
    one = api.completions.create(prompt=[65], echo=True, max_tokens=0, logprobs=0)
    assert one.choices[0].text == "A" and one.usage.completion_tokens == 0
    assert one.choices[0].logprobs.token_logprobs == [None]
    assert len(runner.batches) == steps  # nothing to compute for either


def test_a_draft_model_drafts_every_decode_step_and_gives_its_pages_back():
    """The draft model (here the fake model itself: a perfect drafter) keeps a mirror of each
    sequence: every decode step verifies drafts, even when prompt steps come between (batch
    invariant mode), all of them kept; the output is the plain one; the mirrors' pages go
    back when the sequences end."""
    from wick.engine.draft_model import DraftModel
    from wick.engine.sequence import SamplingParams

    info = make_info()
    runner, drafter = FakeRunner(256, info.page_size), FakeRunner(256, info.page_size)
    draft = DraftModel(drafter, info, 256)
    api = EngineAPI.from_runner(runner, ByteTokenizer(), info, num_pages=256,
                                speculative={"method": "draft", "num_tokens": 4}, draft=draft)
    api.core.step_cost = FixedCost(prior=0.2)
    runner.kv, drafter.kv = api.core.kv, draft.kv
    core = api.core
    params = SamplingParams(temperature=0, max_tokens=40)
    rid = core.add_request(list(b"Hello there"), params)
    out = []
    for _ in range(3):
        out += [t for o in core.step() for t in o.token_ids]
    core.add_request(list(b"x" * 200), SamplingParams(temperature=0, max_tokens=5))
    while core.has_unfinished():
        out += [t for o in core.step() if o.request_id == rid for t in o.token_ids]
    plain = build()[0].core
    plain_rid = plain.add_request(list(b"Hello there"), params)
    want = []
    while plain.has_unfinished():
        want += [t for o in plain.step() if o.request_id == plain_rid for t in o.token_ids]
    assert out == want
    decode_steps = [b for b in runner.batches if b.decode_only]
    assert all(b.spec_token_ids for b in decode_steps[1:-1])
    s = core.stats
    assert s.spec_accepted_tokens == s.spec_drafted_tokens > 20
    assert draft.kv.free_pages == draft.kv.num_pages


def test_a_draft_model_whose_steps_are_awaited_drafts_the_same():
    """A drafter whose runner reads back through a promise (the browser's WebGPU): its steps
    are awaited inside the engine's step (``begin_step_async``) and it drafts as a drafter
    that steps at once does: the plain output, every draft kept."""
    import asyncio

    from engine_fakes import AsyncFakeRunner

    from wick.engine import AsyncEngineAPI
    from wick.engine.core import EngineCore
    from wick.engine.draft_model import DraftModel

    info = make_info()
    runner, drafter = AsyncFakeRunner(256, info.page_size), AsyncFakeRunner(256, info.page_size)
    draft = DraftModel(drafter, info, 256)
    core = EngineCore(runner, ByteTokenizer(), info, num_pages=256,
                      speculative={"method": "draft", "num_tokens": 4}, draft=draft)
    core.step_cost = FixedCost(prior=0.2)
    runner.kv, drafter.kv = core.kv, draft.kv
    api = AsyncEngineAPI(core)

    async def both():
        return await asyncio.gather(*(api.completions.create(prompt=p, max_tokens=30,
                                                             temperature=0)
                                      for p in ("Hello there", "The rock, the bay")))

    got = [r.choices[0].text for r in asyncio.run(both())]
    plain = build()[0]
    want = [plain.completions.create(prompt=p, max_tokens=30, temperature=0).choices[0].text
            for p in ("Hello there", "The rock, the bay")]
    assert got == want
    assert drafter.async_calls > 5 and drafter.batches  # (its steps were awaited)
    s = core.stats
    assert s.spec_accepted_tokens == s.spec_drafted_tokens > 20
    assert draft.kv.free_pages == draft.kv.num_pages
