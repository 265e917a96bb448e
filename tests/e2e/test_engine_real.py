"""``wick.Engine`` / ``wick.AsyncEngine`` on the real backend with the tiny Llama compiled with a
64-token context window: streaming, seeds, usage, stops, limits, errors, concurrency, KV pages."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

import wick
from tests.e2e.conftest import TINY_OPTIONS
from tests.e2e.helpers import hf_greedy, hf_logits, record
from wick.engine.errors import ContextLengthExceededError, InvalidRequestError

CONTEXT = 64
PROMPT = "Once upon a time, "
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "max_tokens": 24}


@pytest.fixture(scope="module")
def art_dir(tiny_llama_dir, compiled):
    return compiled(tiny_llama_dir, "q0f32", context_window=CONTEXT, **TINY_OPTIONS)


@pytest.fixture(scope="module")
def engine(art_dir):
    e = wick.Engine(str(art_dir))
    assert e.core.info.context_window == CONTEXT
    return e


@pytest.fixture(autouse=True)
def pages_come_back(request):
    """Every test leaves the engine with all its KV pages free."""
    yield
    if "engine" in request.fixturenames:
        core = request.getfixturevalue("engine").core
        assert not core.has_unfinished()
        assert core.kv.available_pages == core.kv.num_pages


def tokens(engine, text: str) -> list[int]:
    return engine.core.tokenizer.encode(text)


def stream_text(chunks, kind: str = "completion") -> tuple[str, list, object]:
    parts, finishes, usage = [], [], None
    for c in chunks:
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            parts.append(ch.delta.content or "" if kind == "chat" else ch.text)
            if ch.finish_reason is not None:
                finishes.append(ch.finish_reason)
    return "".join(parts), finishes, usage


# ------------------------------------------------------------------------- sampling and seeds


def test_stream_joins_to_non_stream_text_for_the_same_seed(engine):
    r1 = engine.completions.create(prompt=PROMPT, seed=1234, **SAMPLED)
    r2 = engine.completions.create(prompt=PROMPT, seed=1234, **SAMPLED)
    text, finishes, usage = stream_text(engine.completions.create(
        prompt=PROMPT, seed=1234, stream=True, stream_options={"include_usage": True}, **SAMPLED))
    assert r1.choices[0].text == r2.choices[0].text == text
    assert finishes == [r1.choices[0].finish_reason]
    assert (usage.prompt_tokens, usage.completion_tokens) == (r1.usage.prompt_tokens,
                                                              r1.usage.completion_tokens)
    # the later two read the first one's prompt pages: same text, fewer tokens computed
    ps = engine.core.info.page_size
    cached = (r1.usage.prompt_tokens - 1) // ps * ps
    assert r2.usage.prompt_tokens_details.cached_tokens == cached
    assert usage.prompt_tokens_details.cached_tokens == cached
    others = {engine.completions.create(prompt=PROMPT, seed=s, **SAMPLED).choices[0].text
              for s in (1, 2, 3)}
    assert others - {text}  # the seed matters: this is sampling, not argmax


def test_chat_stream_joins_to_non_stream_content(engine):
    msgs = [{"role": "user", "content": "Tell me a story."}]
    r = engine.chat.completions.create(messages=msgs, seed=7, **SAMPLED)
    chunks = list(engine.chat.completions.create(messages=msgs, seed=7, stream=True, **SAMPLED))
    assert chunks[0].choices[0].delta.role == "assistant"
    text, finishes, _ = stream_text(chunks, "chat")
    assert text == r.choices[0].message.content
    assert finishes == [r.choices[0].finish_reason]


def test_sampled_tokens_lie_in_the_top_p_nucleus(engine, tiny_hf):
    """Every token sampled at temperature 0.8 / top_p 0.9 is in transformers' 0.9-nucleus."""
    prompt = tokens(engine, PROMPT)
    with record(engine.core.runner) as rec:
        engine.completions.create(prompt=prompt, seed=99, ignore_eos=True, **SAMPLED)
    sampled = rec.sampled
    assert len(sampled) == SAMPLED["max_tokens"]
    logits = hf_logits(tiny_hf, prompt + sampled[:-1])[len(prompt) - 1:]
    probs = torch.softmax(torch.tensor(logits) / 0.8, dim=-1).numpy()
    for row, tok in zip(probs, sampled):
        order = np.argsort(-row)
        before = np.cumsum(row[order]) - row[order]  # mass of the tokens ranked above
        rank = int(np.nonzero(order == tok)[0][0])
        assert before[rank] < 0.9 + 1e-3, (tok, rank, before[rank])


# ------------------------------------------------------------------------- usage, stops, limits


def test_greedy_usage_and_text_equal_transformers(engine, tiny_hf):
    prompt_ids = tokens(engine, PROMPT)
    r = engine.completions.create(prompt=PROMPT, temperature=0, max_tokens=30)
    want = hf_greedy(tiny_hf, prompt_ids, 30, stop_at_eos=True)
    eos = engine.core.info.eos_token_ids
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(want)
    assert r.usage.total_tokens == len(prompt_ids) + len(want)
    assert r.choices[0].finish_reason == ("stop" if want[-1] in eos else "length")
    text = engine.core.tokenizer.decode([t for t in want if t not in eos])
    assert r.choices[0].text == text.rstrip("\ufffd")


def test_stop_string_is_not_emitted(engine):
    full = engine.completions.create(prompt=PROMPT, temperature=0, max_tokens=32,
                                     ignore_eos=True).choices[0].text
    # a 3-character stop string first occurring at k >= 6, free of replacement characters
    k = next(k for k in range(6, len(full) - 3)
             if full.find(full[k:k + 3]) == k and "\ufffd" not in full[k:k + 3])
    stop = full[k:k + 3]
    r = engine.completions.create(prompt=PROMPT, temperature=0, max_tokens=32, ignore_eos=True,
                                  stop=[stop, "never-there"])
    assert r.choices[0].text == full[:k]
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 32
    text, finishes, _ = stream_text(engine.completions.create(
        prompt=PROMPT, temperature=0, max_tokens=32, ignore_eos=True, stop=stop, stream=True))
    assert text == full[:k] and finishes == ["stop"]


def test_max_tokens_ends_with_length(engine):
    with record(engine.core.runner) as rec:
        r = engine.completions.create(prompt=PROMPT, temperature=0.8, seed=3, max_tokens=7,
                                      ignore_eos=True)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 == len(rec.sampled)


def test_no_max_tokens_fills_the_context_window(engine):
    prompt = tokens(engine, PROMPT)
    r = engine.completions.create(prompt=prompt, temperature=0, ignore_eos=True)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == CONTEXT


def test_prompt_filling_the_window_exactly_is_accepted(engine):
    prompt = list(range(32, 32 + CONTEXT - 8))
    r = engine.completions.create(prompt=prompt, temperature=0, max_tokens=8, ignore_eos=True)
    assert r.usage.prompt_tokens + r.usage.completion_tokens == CONTEXT


# ------------------------------------------------------------------------- errors


def test_context_overflow_raises_before_any_step(engine):
    core = engine.core
    with record(core.runner) as rec:
        with pytest.raises(ContextLengthExceededError) as e:
            engine.completions.create(prompt=list(range(40, 40 + CONTEXT + 6)), max_tokens=1)
        assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
        with pytest.raises(ContextLengthExceededError) as e:  # prompt fits, the completion not
            engine.completions.create(prompt=list(range(40, 100)), max_tokens=5)
        assert e.value.prompt_tokens == 60 and e.value.completion_tokens == 5
        with pytest.raises(ContextLengthExceededError) as e:
            engine.chat.completions.create(messages=[{"role": "user", "content": "x" * 80}],
                                           stream=True)
        assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
        assert e.value.status == 400
    assert rec.steps == [] and rec.plans == []
    assert not core.has_unfinished() and core.kv.available_pages == core.kv.num_pages


@pytest.mark.parametrize("param, value", [("temperature", -1), ("top_p", 0), ("top_p", 1.5),
                                          ("max_tokens", 0)])
def test_bad_parameters_raise_before_any_step(engine, param, value):
    with record(engine.core.runner) as rec:
        with pytest.raises(InvalidRequestError) as e:
            engine.completions.create(prompt=PROMPT, **{param: value})
        assert e.value.param == param
        with pytest.raises(InvalidRequestError) as e:
            engine.chat.completions.create(messages=[{"role": "user", "content": "hi"}],
                                           stream=True, **{param: value})
        assert e.value.param == param
    assert rec.steps == []


def test_closed_stream_gives_its_pages_back(engine):
    core = engine.core
    stream = engine.completions.create(prompt=PROMPT, temperature=0, max_tokens=30,
                                       ignore_eos=True, stream=True)
    next(stream), next(stream)
    assert core.kv.available_pages < core.kv.num_pages  # the request holds pages
    stream.close()
    # freed at the next step, which the next request runs
    r = engine.completions.create(prompt=PROMPT, temperature=0, max_tokens=2)
    assert r.usage.completion_tokens >= 1


# ------------------------------------------------------------------------- async concurrency


def test_async_concurrent_streams_equal_solo(art_dir):
    prompts = ["Once upon a time, ", "The quick brown fox", "Hi", "A long time ago in a galaxy"]

    async def one(api, i: int) -> tuple[str, str]:
        stream = await api.completions.create(prompt=prompts[i], seed=100 + i, stream=True,
                                             **SAMPLED)
        text, finishes = [], []
        async for c in stream:
            for ch in c.choices:
                text.append(ch.text)
                if ch.finish_reason is not None:
                    finishes.append(ch.finish_reason)
        assert len(finishes) == 1
        return "".join(text), finishes[0]

    async def main():
        api = wick.AsyncEngine(str(art_dir))
        core = api.core
        initial = core.kv.available_pages
        assert initial == core.kv.num_pages
        try:
            solo = [await one(api, i) for i in range(len(prompts))]
            assert core.stats.max_batch_seen == 1
            together = await asyncio.gather(*(one(api, i) for i in range(len(prompts))))
            assert core.stats.max_batch_seen == len(prompts)  # they shared steps
            # a non-streaming request after the concurrent ones: same engine, same answers
            again = await api.completions.create(prompt=prompts[0], seed=100, **SAMPLED)
            assert again.choices[0].text == solo[0][0]
            await asyncio.sleep(0)
            assert not core.has_unfinished()
            assert core.kv.available_pages == initial
        finally:
            await api.aclose()
        return solo, together

    solo, together = asyncio.run(main())
    assert list(together) == solo
    assert len({t for t, _ in solo}) == len(prompts)


def test_n_choices_and_degenerate_sampling(engine):
    one = engine.completions.create(prompt=PROMPT, seed=42, ignore_eos=True, **SAMPLED)
    three = engine.completions.create(prompt=PROMPT, seed=42, n=3, ignore_eos=True, **SAMPLED)
    assert [c.index for c in three.choices] == [0, 1, 2]
    # choice 0 of seed s draws exactly like n=1 with seed s; the others are their own streams
    assert three.choices[0].text == one.choices[0].text
    assert len({c.text for c in three.choices}) == 3
    assert three.usage.completion_tokens == 3 * SAMPLED["max_tokens"]
    assert three.usage.prompt_tokens == one.usage.prompt_tokens == len(tokens(engine, PROMPT))
    greedy_text = engine.completions.create(prompt=PROMPT, temperature=0, max_tokens=24,
                                            ignore_eos=True).choices[0].text
    for extra in ({"top_k": 1}, {"top_p": 1e-6}):
        r = engine.completions.create(prompt=PROMPT, temperature=1.0, max_tokens=24,
                                      ignore_eos=True, seed=5, **extra)
        assert r.choices[0].text == greedy_text, extra


@pytest.mark.parametrize("prompt", ["", [], [0, 259], [-1]])
def test_bad_prompts_raise_before_any_step(engine, prompt):
    with record(engine.core.runner) as rec:
        with pytest.raises(InvalidRequestError) as e:
            engine.completions.create(prompt=prompt, max_tokens=2)
    assert e.value.param == "prompt" and e.value.status == 400
    assert rec.steps == []
