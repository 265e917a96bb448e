"""The prefix cache on the fake runner: hits counted exactly, outputs equal to the engine without
the cache, LRU eviction, and the pool's invariants under thousands of random operations.

The fake runner writes each token into its KV slot and reads every sampled row's context back
through the index arrays, so a hit that lists a wrong page, a page shared while it is written
(checked at each write against the cache's refcounts) or a window that lost a key changes the
tokens or fails an assertion."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine_fakes import BOS, ByteTokenizer, FakeRunner, make_info
from wick.engine import EngineAPI, EngineCore, KVCache, SamplingParams
from wick.engine.kv_cache import extend_page_digests

PS = 4  # make_info's page size
SYSTEM = "You are a careful assistant. Answer in one short line, then stop."


def build(prefix_cache: bool = True, num_pages: int = 256, shape: str = "plain", **core):
    """An engine on the fake runner. ``shape``: "plain"; "window" (every layer sees the last
    12 tokens); "paired" (global layers plus a 8-token windowed pool of its own)."""
    info, runner_options = make_info(), {}
    if shape == "window":
        info, runner_options = make_info(kv_window=12), {"window": 12}
    elif shape == "paired":
        info = make_info(kv_window_pool=8)
        runner_options = {"num_window_pages": 4 * (8 // PS + 2 + 32 // PS), "local_window": 8}
    runner = FakeRunner(num_pages, PS, **runner_options)
    api = EngineAPI.from_runner(runner, ByteTokenizer(), info, num_pages=num_pages,
                                prefix_cache=prefix_cache, **core)
    runner.kv = api.core.kv
    return api, runner


def computed_tokens(runner: FakeRunner, since: int = 0) -> int:
    return sum(len(b.token_ids) for b in runner.batches[since:])


def chat(api, messages, **kw):
    return api.chat.completions.create(messages=messages, max_tokens=kw.pop("max_tokens", 6),
                                       temperature=0, **kw)


def test_turn_two_of_a_chat_reads_turn_one_prompt_and_answer():
    api, runner = build()
    off, _ = build(prefix_cache=False)
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi there!"}]
    first = chat(api, turn1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    answer = first.choices[0].message.content
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "And again?"}]
    before = len(runner.batches)
    second = chat(api, turn2)
    assert second.choices[0].message.content == chat(off, turn2).choices[0].message.content
    # what turn 1 computed: its prompt and every answer token but the last (never fed back)
    ids1 = api.core.chat_prompt_ids(turn1)
    done = ids1 + list(answer.encode())[:-1]
    ids2 = api.core.chat_prompt_ids(turn2)
    common = next(i for i, (a, b) in enumerate(zip([*done, -1], ids2)) if a != b)
    cached = min(common, len(ids2) - 1) // PS * PS
    assert common > len(ids1) and cached > 0
    assert second.usage.prompt_tokens_details.cached_tokens == cached
    assert second.usage.prompt_tokens == len(ids2)
    # the runner computed the prompt's uncached tokens, then one token per later output
    assert computed_tokens(runner, before) == len(ids2) - cached + 6 - 1
    assert api.core.kv.available_pages == 256 and api.core.kv.cached_pages > 0


def test_requests_with_one_system_prompt_compute_it_once():
    api, runner = build()
    off, _ = build(prefix_cache=False)
    prompts = [f"{SYSTEM}\nQuestion {i}: what is {i} + {i}?" for i in range(4)]
    shared = len(f"{SYSTEM}\nQuestion ".encode()) + 1  # + BOS
    texts = []
    for i, prompt in enumerate(prompts):
        before = len(runner.batches)
        r = api.completions.create(prompt=prompt, max_tokens=3, temperature=0)
        texts.append(r.choices[0].text)
        expected = 0 if i == 0 else shared // PS * PS
        assert r.usage.prompt_tokens_details.cached_tokens == expected
        assert computed_tokens(runner, before) == r.usage.prompt_tokens - expected + 2
    assert texts == [off.completions.create(prompt=p, max_tokens=3, temperature=0)
                     .choices[0].text for p in prompts]


def test_a_shared_part_ending_inside_a_page_is_recomputed_there():
    """10 shared tokens, pages of 4: two pages come from the cache, the third (half shared) is
    the second request's own; the fake runner fails any write into a cached page."""
    api, runner = build()
    a, b = [1] + [97] * 9 + [98] * 7, [1] + [97] * 9 + [99] * 7
    api.completions.create(prompt=a, max_tokens=2, temperature=0)
    before = len(runner.batches)
    r = api.completions.create(prompt=b, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens == 8
    first = runner.batches[before]
    assert first.kv.q_positions[0] == 8 and first.token_ids == b[8:]
    assert len(set(first.kv.page_values[:2]) & set(runner.batches[0].kv.page_values)) == 2


def test_a_whole_cached_prompt_still_computes_its_last_token():
    api, runner = build()
    prompt = [BOS] + [100] * 15  # 16 tokens (BOS given: none added): 4 full pages
    r1 = api.completions.create(prompt=prompt, max_tokens=3, temperature=0)
    before = len(runner.batches)
    r2 = api.completions.create(prompt=prompt, max_tokens=3, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens == 12  # the last page is recomputed
    assert runner.batches[before].token_ids == prompt[12:]
    assert r1.choices[0].text == r2.choices[0].text and r2.usage.prompt_tokens == 16


def test_n_choices_compute_the_prompt_once_and_share_its_pages():
    api, runner = build()
    off, off_runner = build(prefix_cache=False)
    prompt = f"{SYSTEM} Pick a word:"
    kw = dict(prompt=prompt, n=4, max_tokens=5, temperature=1.0, seed=7)
    r = api.completions.create(**kw)
    ref = off.completions.create(**kw)
    assert [c.text for c in r.choices] == [c.text for c in ref.choices]
    assert len(set(c.text for c in r.choices)) > 1  # really four samples
    n_prompt = r.usage.prompt_tokens
    shared = (n_prompt - 1) // PS * PS
    prompt_work = computed_tokens(runner) - 4 * (5 - 1)
    assert prompt_work == n_prompt + 3 * (n_prompt - shared)  # vs 4 * n_prompt without
    assert computed_tokens(off_runner) - 4 * 4 == 4 * n_prompt
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # the prompt was new


def test_turned_off_nothing_is_cached():
    api, runner = build(prefix_cache=False)
    for _ in range(2):
        before = len(runner.batches)
        r = api.completions.create(prompt=SYSTEM, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert computed_tokens(runner, before) == r.usage.prompt_tokens + 1
    assert api.core.kv.cached_pages == 0 and api.core.kv.free_pages == 256


def test_eviction_takes_free_pages_first_then_the_least_recently_released():
    kv = KVCache(6, 2)
    seqs = {0: [11, 12, 13, 14, 15, 16], 1: [21, 22, 23, 24]}
    digests = {s: extend_page_digests([], t, 2, len(t) // 2) for s, t in seqs.items()}
    for s, tokens in seqs.items():
        kv.allocate(s, len(tokens))
        kv.commit(s, digests[s], len(tokens))
        kv.free(s)  # released tail first: 2 1 0, then 4 3
    assert (kv.free_pages, kv.cached_pages) == (1, 5)
    kv.allocate(2, 4)  # two pages: the free one (5), then the least recently released (2)
    assert kv.page_table(2) == (5, 2) and kv.num_evictions == 1
    assert not kv.is_cached(2) and kv.lookup(digests[0], 7).num_tokens == 4
    hit = kv.lookup(digests[1], 5)  # a hit makes pages 3 and 4 the most recently used
    assert hit.pages == (3, 4)
    kv.allocate(3, 5, hit)
    kv.free(3)
    kv.allocate(4, 6)  # three more pages: 1 and 0 go before 4 and 3
    assert kv.page_table(4) == (1, 0, 4) and kv.num_evictions == 4
    assert kv.lookup(digests[0], 7).num_tokens == 0  # its first page is gone: no hit at all
    kv.free(2)
    kv.free(4)
    assert kv.free_pages + kv.cached_pages == 6 and kv.held_pages == 0


def test_a_windowed_hit_needs_only_the_pages_of_its_window():
    """Pages of 4, window 6: a sequence that grew to 24 tokens released pages 0-2 as they left
    its window (so they are the least recently used). Once they are evicted, its 21-token
    prompt still hits 20 tokens: a query at 20 sees keys from 15 on, pages 3 and 4."""
    kv = KVCache(8, 4, window=6)
    tokens = list(range(100, 125))
    digests = extend_page_digests([], tokens, 4, 6)
    for target in range(4, 25, 4):
        kv.allocate(0, target)
        kv.commit(0, digests, target)
    assert kv.dropped_pages(0) == 3 and kv.page_table(0) == (3, 4, 5)
    kv.free(0)
    kv.allocate(9, 20)  # the two free pages, then pages 0, 1 and 2 are evicted
    assert kv.page_table(9) == (6, 7, 0, 1, 2)
    hit = kv.lookup(digests, 21)
    assert (hit.num_tokens, hit.first_page, hit.pages) == (20, 3, (3, 4))
    assert kv.can_allocate(1, 21, hit) and not kv.can_allocate(1, 25, hit)
    kv.allocate(1, 21, hit)
    assert kv.dropped_pages(1) == 3 and kv.page_table(1) == (3, 4, 5)
    assert kv.index_for([(1, 20, 1)]).k_rope_pos_offset == [12]


def _check_pool(core: EngineCore) -> None:
    holders = [*core.scheduler.running, *core.scheduler.waiting]
    pools = [core.kv.main, core.kv.local] if hasattr(core.kv, "local") else [core.kv]
    for pool in pools:
        held = Counter(p for s in holders for p in pool.page_table(s.seq_id))
        assert all(pool.refcount(p) == held[p] for p in range(pool.num_pages))
        assert pool.free_pages + pool.cached_pages + pool.held_pages == pool.num_pages
        assert all(not pool.refcount(p) for p in pool._evictable)
        assert not set(pool._free) & set(pool._digest_of)
    for seq in core.scheduler.waiting:
        assert not core.kv.has(seq.seq_id)


@pytest.mark.parametrize("shape", ["plain", "window", "paired"])
def test_random_interleavings_keep_the_pool_whole_and_outputs_unchanged(shape):
    rng = random.Random(1234)
    api, runner = build(num_pages=14 if shape == "window" else 40, shape=shape,
                        max_batch_size=4, prefill_chunk_size=16, batch_invariant=shape != "window")
    core = api.core
    reference, _ = build(prefix_cache=False, shape=shape)
    bases = [[1] + [rng.randrange(97, 123) for _ in range(rng.randrange(5, 30))]
             for _ in range(3)]
    requests: dict[str, tuple] = {}  # rid -> (prompt, params, n)
    outputs: dict[str, dict[int, list[int]]] = {}
    finished: dict[str, list[int]] = {}  # rid -> cached tokens (per choice)
    aborted: set[str] = set()
    solo: dict[tuple, list[list[int]]] = {}

    def new_prompt() -> list[int]:
        done = [r for r in finished if r not in aborted]
        if done and rng.random() < 0.3:  # a next turn: a finished prompt + its output
            rid = rng.choice(done)
            prompt = requests[rid][0] + outputs[rid][0]
        else:
            base = rng.choice(bases)
            prompt = base[:rng.randrange(2, len(base) + 1)]
        return prompt + [rng.randrange(97, 123) for _ in range(rng.randrange(0, 9))]

    for _ in range(3000):
        r = rng.random()
        if r < 0.25:
            prompt, n = new_prompt(), rng.choice([1, 1, 1, 2, 3])
            params = SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=rng.randrange(99),
                                    max_tokens=rng.randrange(1, 10))
            try:
                rid = core.add_request(prompt, params, n=n)
            except Exception as e:  # too long for the pool, or n too large for it
                assert getattr(e, "status", None) == 400, e
                continue
            requests[rid], outputs[rid] = (prompt, params, n), {i: [] for i in range(n)}
        elif r < 0.32 and core.has_unfinished():
            rid = rng.choice([x for x in requests if core.is_unfinished(x)])
            core.abort(rid)
            aborted.add(rid)
        else:
            for out in core.step():
                outputs[out.request_id][out.index].extend(out.token_ids)
                if out.finish_reason is not None and not core.is_unfinished(out.request_id):
                    finished[out.request_id] = out.num_cached_tokens
        _check_pool(core)
    while core.has_unfinished():
        for out in core.step():
            outputs[out.request_id][out.index].extend(out.token_ids)
            if not core.is_unfinished(out.request_id):
                finished[out.request_id] = out.num_cached_tokens
        _check_pool(core)

    kv = core.kv
    pools = [kv.main, kv.local] if shape == "paired" else [kv]
    assert kv.free_pages + kv.cached_pages == kv.num_pages  # whole again when idle
    # the run did exercise what it is about
    assert core.scheduler.num_preemptions > 5 and sum(finished.values()) > 200
    assert all(pool.num_evictions > 10 for pool in pools)
    assert len(aborted) > 20
    checked = 0
    for rid, (prompt, params, n) in requests.items():
        if rid in aborted:
            continue
        key = (tuple(prompt), params, n)
        if key not in solo:
            ref = reference.core.add_request(prompt, params, n=n)
            got = {i: [] for i in range(n)}
            while reference.core.has_unfinished():
                for out in reference.core.step():
                    got[out.index].extend(out.token_ids)
            solo[key] = [got[i] for i in range(n)]
            assert ref not in outputs
        assert [outputs[rid][i] for i in range(n)] == solo[key], rid
        checked += 1
    assert checked > 150
