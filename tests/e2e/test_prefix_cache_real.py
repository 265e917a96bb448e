"""The prefix cache on real kernels (the tiny models on lavapipe's WGSL, SmolLM2 on the CPU
kernel set): a hit's pages hold what the kernels wrote before, so greedy tokens with the cache
on equal tokens with it off and transformers' — for a chat's next turn, a shared system prompt
that ends inside a page, and n > 1 choices — and ``cached_tokens`` is exact."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import greedy, hf_greedy, ids_of, record, run_core, sibling_core
from wick.engine.api import EngineAPI
from wick.engine.sequence import SamplingParams


def cached_for(done: list[int], prompt: list[int], page_size: int) -> int:
    """What a hit gives ``prompt`` after ``done`` tokens were computed: whole pages of their
    common prefix, leaving the prompt's last token to compute."""
    common = 0
    for a, b in zip(done, prompt):
        if a != b:
            break
        common += 1
    return min(common, len(prompt) - 1) // page_size * page_size


@pytest.fixture
def cores(tiny_core):
    """(cache on, cache off) over the session's tiny runner (a core that finds another core
    used the runner forgets its cache first, see EngineCore._claim_runner)."""
    return sibling_core(tiny_core, prefix_cache=True), sibling_core(tiny_core, prefix_cache=False)


def test_tiny_next_turn_and_shared_prompt_equal_cache_off_and_transformers(cores, tiny_hf):
    on, off = cores
    ps = on.info.page_size
    turn1 = ids_of(45, 1)
    (answer,) = run_core(on, [turn1], greedy(12))
    turn2 = turn1 + answer + ids_of(9, 2)  # the user's next message
    with record(on.runner) as rec:
        rid = on.add_request(turn2, greedy(12), prompt_param="prompt")
        got, cached = [], None
        while on.has_unfinished():
            for o in on.step():
                got.extend(o.token_ids)
                cached = o.num_cached_tokens
    done = turn1 + answer[:-1]  # the last answer token was sampled, never fed back
    assert cached == cached_for(done, turn2, ps) == (len(done)) // ps * ps
    assert rec.steps[0].num_tokens == len(turn2) - cached  # only the rest was computed
    assert got == run_core(off, [turn2], greedy(12))[0] == hf_greedy(tiny_hf, turn2, 12)
    assert on.is_unfinished(rid) is False
    # a 37-token shared part: two full pages of 16 come from the cache, the third is computed
    system = ids_of(37, 3)
    prompts = [system + ids_of(10, 10 + i) for i in range(3)]
    outs = [run_core(on, [p], greedy(6))[0] for p in prompts]
    assert outs == [run_core(off, [p], greedy(6))[0] for p in prompts]
    assert outs[2] == hf_greedy(tiny_hf, prompts[2], 6)
    assert on.kv.free_pages + on.kv.cached_pages == on.kv.num_pages


def test_tiny_n_choices_share_the_prompt_and_equal_cache_off(cores):
    on, off = cores
    prompt = ids_of(40, 4)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=8, seed=11)
    results = []
    for core in (on, off):
        with record(core.runner) as rec:
            rid = core.add_request(prompt, params, n=3, prompt_param="prompt")
            out: dict[int, list[int]] = {0: [], 1: [], 2: []}
            while core.has_unfinished():
                for o in core.step():
                    out[o.index].extend(o.token_ids)
        results.append(([out[i] for i in range(3)], sum(s.num_tokens for s in rec.steps)))
        assert not core.is_unfinished(rid)
    (on_out, on_work), (off_out, off_work) = results
    assert on_out == off_out and len({tuple(t) for t in on_out}) == 3
    ps = on.info.page_size
    shared = (len(prompt) - 1) // ps * ps
    decode = 3 * (8 - 1)
    assert off_work == 3 * len(prompt) + decode
    assert on_work == len(prompt) + 2 * (len(prompt) - shared) + decode


@pytest.mark.slow
def test_smollm2_chat_turn_two_reuses_turn_one_as_transformers(smollm2_cpu_core, smollm2_hf):
    core = sibling_core(smollm2_cpu_core, prefix_cache=True)
    api = EngineAPI(core)
    turn1 = [{"role": "system", "content": "You are a geography teacher. Be brief."},
             {"role": "user", "content": "What is the capital of France?"}]
    with record(core.runner) as rec1:
        first = api.chat.completions.create(messages=turn1, temperature=0, max_tokens=4)
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And of Italy?"}]
    ids1, ids2 = core.chat_prompt_ids(turn1), core.chat_prompt_ids(turn2)
    with record(core.runner) as rec:
        second = api.chat.completions.create(messages=turn2, temperature=0, max_tokens=4)
    # turn 1 computed its prompt and every sampled token but the last
    expected = cached_for(ids1 + rec1.sampled[:-1], ids2, core.info.page_size)
    assert expected >= len(ids1) // core.info.page_size * core.info.page_size > 0
    assert second.usage.prompt_tokens_details.cached_tokens == expected
    assert rec.steps[0].num_tokens == len(ids2) - expected
    assert rec.sampled == hf_greedy(smollm2_hf, ids2, 4, stop_at_eos=True)
    assert core.kv.free_pages + core.kv.cached_pages == core.kv.num_pages


@pytest.mark.slow
def test_smollm2_shared_system_prompt_and_n_choices_equal_cache_off(smollm2_cpu_core):
    """Two questions under one system prompt: the second reads the pages they share (the
    share ends inside a page: that page is computed again); n=2 then shares its whole prompt.
    Greedy tokens equal a cache-off core's."""
    on = sibling_core(smollm2_cpu_core, prefix_cache=True)
    system = {"role": "system", "content": "You are a geography teacher. Answer in one word."}
    ids = [on.chat_prompt_ids([system, {"role": "user", "content": q}])
           for q in ("Capital of Spain?",
                     "Capital of Peru? Answer with the name of the city only, nothing else.")]
    ps = on.info.page_size
    with record(on.runner) as rec:
        first = run_core(on, [ids[0]], greedy(3))[0]
        rid = on.add_request(ids[1], greedy(3), n=2, prompt_param="messages")
        outs: dict[int, list[int]] = {0: [], 1: []}
        cached = {}
        while on.has_unfinished():
            for o in on.step():
                outs[o.index].extend(o.token_ids)
                cached[o.index] = o.num_cached_tokens
    assert not on.is_unfinished(rid)
    shared = cached_for(ids[0] + first[:-1], ids[1], ps)
    common = next(i for i, (a, b) in enumerate(zip(ids[0], ids[1])) if a != b)
    assert common % ps and shared == common // ps * ps > 0  # it ends inside a page
    whole = (len(ids[1]) - 1) // ps * ps  # all of the prompt but the page of its last token
    assert whole > shared and cached == {0: shared, 1: whole}
    # the second prompt was computed once: choice 1 computed only the page of its last token
    second = [s.num_tokens for s in rec.steps[len(first):]]
    assert second[0] == len(ids[1]) - shared
    assert sum(second) == (len(ids[1]) - shared) + (len(ids[1]) - whole) + 2 * (3 - 1)
    off = sibling_core(smollm2_cpu_core, prefix_cache=False)
    assert outs[0] == outs[1] == run_core(off, [ids[1]], greedy(3))[0]
    assert first == run_core(off, [ids[0]], greedy(3))[0]
