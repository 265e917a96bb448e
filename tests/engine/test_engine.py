"""The engine end to end on the fake runner: batching, preemption, stops, errors, aborts."""

from __future__ import annotations

import pytest

from engine_fakes import EOS, IM_END, ByteTokenizer, FakeRunner, make_info
from wick.engine import (
    ContextLengthExceededError,
    EngineAPI,
    EngineCore,
    InvalidRequestError,
    ModelNotFoundError,
    UnsupportedParameterError,
)

MSGS = [{"role": "user", "content": "Tell me a story"}]


def build(num_pages: int = 256, *, eos: int | None = None, **info) -> tuple[EngineAPI, FakeRunner]:
    information = make_info(**info)
    runner = FakeRunner(num_pages, information.page_size, eos_id=eos)
    return EngineAPI.from_runner(runner, ByteTokenizer(), information, num_pages=num_pages), runner


def chat_text(api: EngineAPI, **kw) -> str:
    r = api.chat.completions.create(messages=MSGS, **kw)
    return r.choices[0].message.content


def test_nonstream_chat_response():
    api, runner = build()
    r = api.chat.completions.create(model="fake-model", messages=MSGS, max_tokens=12, seed=1)
    prompt_ids = api.core.chat_prompt_ids(MSGS)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == "fake-model"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(prompt_ids) + 12
    # 12 byte tokens make the text (the fake model only completes characters it started).
    text = r.choices[0].message.content
    assert "\ufffd" not in text  # a character cut off by max_tokens is dropped
    assert 12 - 2 <= len(text.encode()) <= 12
    # The prompt went in 32-token chunks (prefill_chunk_size); only the last one sampled.
    chunks = -(-len(prompt_ids) // 32)
    assert sum((b.token_ids for b in runner.batches[:chunks]), []) == prompt_ids
    assert [len(b.token_ids) for b in runner.batches[:chunks - 1]] == [32] * (chunks - 1)
    assert [b.sample_rows for b in runner.batches[:chunks]] == [[]] * (chunks - 1) + [[0]]
    assert len(runner.batches) == chunks + 11
    assert api.core.kv.available_pages == 256


def test_same_seed_same_output_different_seeds_differ():
    api, _ = build()
    a = [chat_text(api, max_tokens=24, seed=s) for s in (7, 7, 8, 9)]
    assert a[0] == a[1]
    assert a[0] != a[2] and a[0] != a[3] and a[2] != a[3]
    greedy = {chat_text(api, max_tokens=24, temperature=0, seed=s) for s in (1, 2)}
    assert len(greedy) == 1  # greedy ignores the seed


def test_streamed_chunks_join_to_the_nonstream_text():
    api, _ = build()
    full = api.chat.completions.create(messages=MSGS, max_tokens=40, seed=3)
    chunks = list(api.chat.completions.create(
        messages=MSGS, max_tokens=40, seed=3, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.id == chunks[0].id for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    content = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert all(content)  # no empty content chunks in the middle
    assert "".join(content) == full.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-2].choices[0].delta.to_dict() == {}
    usage = chunks[-1].usage  # the same counts; the second request read the first's prompt
    assert chunks[-1].choices == [] and usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert (full.usage.prompt_tokens_details.cached_tokens,
            usage.prompt_tokens_details.cached_tokens) == (0, usage.prompt_tokens // 4 * 4)
    assert all(c.usage is None for c in chunks[:-1])


def test_multibyte_output_is_never_split():
    api, runner = build()
    # Find a seed whose output has multi-byte characters; the fake model emits é and €.
    for seed in range(50):
        chunks = list(api.chat.completions.create(messages=MSGS, max_tokens=30, seed=seed,
                                                  stream=True))
        texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        if any(ch in "".join(texts) for ch in "é€"):
            break
    else:
        pytest.fail("the fake model never produced a multi-byte character")
    for t in texts:
        assert "\ufffd" not in t
        t.encode("utf-8")  # each piece is whole characters


def test_four_concurrent_sequences_equal_each_alone():
    prompts = [f"prompt number {i} " * (i + 1) for i in range(4)]
    solo = []
    for i, p in enumerate(prompts):
        api, runner = build()
        solo.append(api.completions.create(prompt=p, max_tokens=20, seed=i).choices[0].text)
        assert runner.max_batch_seen == 1
    api, runner = build()
    streams = [api.completions.create(prompt=p, max_tokens=20, seed=i, stream=True)
               for i, p in enumerate(prompts)]
    together = ["", "", "", ""]
    live = set(range(4))
    while live:  # interleave the four sync streams
        for i in sorted(live):
            try:
                together[i] += next(streams[i]).choices[0].text
            except StopIteration:
                live.discard(i)
    assert together == solo
    assert runner.max_batch_seen == 4
    mixed = [b for b in runner.batches if b.sample_rows and len(b.sample_rows) < len(b.seq_ids)]
    assert mixed, "expected a step mixing a chunked prefill with decodes"


def test_preemption_and_recovery_give_identical_outputs():
    prompts = [f"tell {i} " * 3 for i in range(3)]
    expected = []
    for i, p in enumerate(prompts):
        api, _ = build()
        expected.append(api.completions.create(prompt=p, max_tokens=30, seed=i).choices[0].text)
    # 14 pages of 4 tokens: the three sequences grow to 22 + 30 tokens each and cannot all fit.
    api, runner = build(num_pages=14)
    streams = [api.completions.create(prompt=p, max_tokens=30, seed=i, stream=True)
               for i, p in enumerate(prompts)]
    texts = ["".join(c.choices[0].text for c in s) for s in streams]
    assert api.core.scheduler.num_preemptions > 0
    assert texts == expected
    assert api.core.kv.available_pages == 14


def test_stop_string_is_not_emitted_even_split_across_tokens():
    api, _ = build()
    base = chat_text(api, max_tokens=40, temperature=0)
    stop = base[10:13]  # three characters = at least three byte tokens
    assert len(stop) == 3 and base.find(stop) >= 10 - 3
    cut = base[:base.find(stop)]
    r = api.chat.completions.create(messages=MSGS, max_tokens=40, temperature=0,
                                    stop=[stop, "zzzz"])
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    chunks = list(api.chat.completions.create(messages=MSGS, max_tokens=40, temperature=0,
                                              stop=stop, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_gives_length_and_stop_token_gives_stop():
    api, _ = build(eos=IM_END)
    r = api.chat.completions.create(messages=MSGS, max_tokens=500, seed=0, ignore_eos=False)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert text.endswith(".")  # the fake model says EOS after "."
    assert "<|im_end|>" not in text
    assert r.usage.completion_tokens == len(text.encode()) + 1  # the stop token counts
    r2 = api.chat.completions.create(messages=MSGS, max_tokens=3, seed=0, ignore_eos=True)
    assert r2.choices[0].finish_reason == "length" and r2.usage.completion_tokens == 3
    # ignore_eos: the EOS token is just a token (decoded as nothing) and generation goes on.
    r3 = api.chat.completions.create(messages=MSGS, max_tokens=60, seed=0, ignore_eos=True)
    assert r3.choices[0].finish_reason == "length" and r3.usage.completion_tokens == 60


def test_other_eos_ids_stop_too():
    api, _ = build(eos=EOS)
    r = api.completions.create(prompt="abc", max_tokens=500, seed=4)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text.endswith(".")


def test_max_tokens_none_fills_the_context_window():
    api, _ = build(context_window=80)
    r = api.completions.create(prompt="hello", seed=1)
    assert r.usage.prompt_tokens == 6  # BOS + 5 bytes
    assert r.usage.completion_tokens == 80 - 6
    assert r.choices[0].finish_reason == "length"
    # and when the KV pool is smaller than the window, the pool is the limit
    api, _ = build(num_pages=10)
    r = api.completions.create(prompt="hello", seed=1)
    assert r.usage.completion_tokens == 40 - 6


@pytest.mark.parametrize(
    ("kw", "param", "code"),
    [
        ({"temperature": -1}, "temperature", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"unknown_field": 1}, "unknown_field", "unknown_parameter"),
        ({"stop": ["1", "2", "3", "4", "5"]}, "stop", "invalid_value"),
        ({"presence_penalty": 3}, "presence_penalty", "invalid_value"),
        ({"logit_bias": {"100000": 5}}, "logit_bias", "invalid_value"),  # not in the vocab
        ({"response_format": {"type": "json_object"}}, "response_format",
         "unsupported_parameter"),  # this engine has no grammar backend
    ],
)
def test_bad_params_raise_before_any_step(kw, param, code):
    api, runner = build()
    with pytest.raises(InvalidRequestError) as e:
        api.chat.completions.create(messages=MSGS, **kw)
    assert (e.value.param, e.value.code, e.value.status) == (param, code, 400)
    with pytest.raises(InvalidRequestError):  # streaming requests fail in create() too
        api.chat.completions.create(messages=MSGS, stream=True, **kw)
    assert runner.batches == []


def test_context_overflow_raises_before_any_step():
    api, runner = build(context_window=64)
    n_prompt = len(api.core.chat_prompt_ids(MSGS))
    with pytest.raises(ContextLengthExceededError) as e:
        api.chat.completions.create(messages=MSGS, max_tokens=64, stream=True)
    assert e.value.message.startswith(
        f"This model's maximum context length is 64 tokens. However, you requested "
        f"{n_prompt + 64} tokens ({n_prompt} in the messages, 64 in the completion).")
    assert (e.value.code, e.value.param) == ("context_length_exceeded", "messages")
    with pytest.raises(ContextLengthExceededError) as e:
        api.completions.create(prompt="x" * 70)
    assert e.value.param == "prompt"
    assert runner.batches == []
    assert not api.core.has_unfinished() and api.core.kv.available_pages == 256


def test_request_larger_than_the_kv_pool_fails_clearly():
    api, runner = build(num_pages=4)  # 16 tokens
    with pytest.raises(ContextLengthExceededError) as e:
        api.completions.create(prompt="abcdef", max_tokens=20)
    assert "KV cache capacity" in e.value.message and "16 tokens" in e.value.message
    assert runner.batches == []


def test_model_and_token_checks():
    api, _ = build()
    with pytest.raises(ModelNotFoundError) as e:
        api.chat.completions.create(model="gpt-4o", messages=MSGS)
    assert e.value.status == 404
    assert api.completions.create(model="fake-model-q0f32", prompt="a", max_tokens=1).usage
    with pytest.raises(InvalidRequestError) as e:
        api.completions.create(prompt=[1, 2, 999])
    assert e.value.param == "prompt" and "999" in e.value.message
    with pytest.raises(UnsupportedParameterError):
        api.completions.create(prompt=["a", "b"])


def test_token_id_prompt_is_used_as_given():
    api, runner = build()
    r = api.completions.create(prompt=[104, 105], max_tokens=2, temperature=0)
    assert runner.batches[0].token_ids == [104, 105]
    assert r.usage.prompt_tokens == 2
    r2 = api.completions.create(prompt="hi", max_tokens=2, temperature=0)
    assert runner.batches[-2].token_ids[:1] == [256] and r2.usage.prompt_tokens == 3


def test_abort_frees_pages():
    api, runner = build(num_pages=64)
    stream = api.chat.completions.create(messages=MSGS, max_tokens=100, seed=2, stream=True)
    first = [next(stream) for _ in range(4)]
    assert first[0].choices[0].delta.role == "assistant"
    assert api.core.kv.available_pages < 64
    steps_before = len(runner.batches)
    stream.close()
    api.core.step()  # the abort is applied at the next step; nothing runs on the device
    assert api.core.kv.available_pages == 64
    assert len(runner.batches) == steps_before
    assert not api.core.has_unfinished()
    # the engine still serves, with the same result as a fresh one
    fresh, _ = build()
    assert chat_text(api, max_tokens=10, seed=5) == chat_text(fresh, max_tokens=10, seed=5)


def test_dropping_an_unstarted_stream_aborts_it():
    api, runner = build()
    stream = api.chat.completions.create(messages=MSGS, max_tokens=50, stream=True)
    assert api.core.has_unfinished()
    del stream
    api.core.step()
    assert not api.core.has_unfinished() and runner.batches == []


def test_n_choices_are_independent_and_reproducible():
    api, _ = build()
    r = api.chat.completions.create(messages=MSGS, max_tokens=16, seed=11, n=3)
    texts = [c.message.content for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len(set(texts)) == 3
    assert texts[0] == chat_text(api, max_tokens=16, seed=11)  # choice 0 = the n=1 output
    assert r.usage.completion_tokens == 48
    assert r.usage.prompt_tokens == len(api.core.chat_prompt_ids(MSGS))


def test_stats_for_the_last_request():
    ticks = iter(range(10**6))
    information = make_info()
    runner = FakeRunner(64, 4)
    core = EngineCore(runner, ByteTokenizer(), information, num_pages=64,
                      clock=lambda: next(ticks) * 0.001)
    api = EngineAPI(core)
    r = api.completions.create(prompt="hello world", max_tokens=9, seed=0)
    last = core.stats.last_request
    assert (last.prompt_tokens, last.completion_tokens) == (r.usage.prompt_tokens, 9)
    assert last.prefill_s > 0 and last.decode_s > 0
    assert last.prefill_tokens_per_s == pytest.approx(12 / last.prefill_s)
    assert last.decode_tokens_per_s == pytest.approx(8 / last.decode_s)
    assert core.stats.num_steps == 9
    assert core.stats.last_step_host_ms > 0 and core.stats.mean_step_host_ms > 0


def test_response_dict_is_openai_json():
    api, _ = build()
    r = api.chat.completions.create(messages=MSGS, max_tokens=2, temperature=0)
    d = r.to_dict()
    assert set(d) == {"id", "object", "created", "model", "choices", "usage"}
    assert d["choices"][0]["message"] == {"role": "assistant",
                                          "content": r.choices[0].message.content}
    assert isinstance(d["created"], int)


def test_step_limits_cannot_exceed_the_compiled_bounds():
    info = make_info()
    with pytest.raises(ValueError, match="prefill_chunk_size=64 must be in \\[1, 32\\]"):
        EngineCore(FakeRunner(8, 4), ByteTokenizer(), info, num_pages=8, prefill_chunk_size=64)
    core = EngineCore(FakeRunner(64, 4), ByteTokenizer(), info, num_pages=64,
                      prefill_chunk_size=8, max_batch_size=2)
    assert (core.scheduler.prefill_chunk_size, core.scheduler.max_batch_size) == (8, 2)
