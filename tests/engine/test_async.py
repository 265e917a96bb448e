"""The async facade: one step loop shared by concurrent requests, with aborts on cancel."""

from __future__ import annotations

import asyncio

import pytest

from engine_fakes import AsyncFakeRunner, ByteTokenizer, FakeRunner, make_info
from wick.engine import AsyncEngineAPI, ContextLengthExceededError, EngineAPI, InvalidRequestError

PROMPTS = [f"question {i}: " + "why " * i for i in range(8)]


def solo_text(prompt: str, seed: int, max_tokens: int = 24) -> str:
    info = make_info()
    api = EngineAPI.from_runner(FakeRunner(256, 4), ByteTokenizer(), info, num_pages=256)
    return api.completions.create(prompt=prompt, seed=seed, max_tokens=max_tokens).choices[0].text


def build_async(runner_cls=FakeRunner, num_pages: int = 256):
    info = make_info()
    runner = runner_cls(num_pages, info.page_size)
    return AsyncEngineAPI.from_runner(runner, ByteTokenizer(), info, num_pages=num_pages), runner


@pytest.mark.parametrize("runner_cls", [FakeRunner, AsyncFakeRunner])
def test_eight_concurrent_streams_share_steps_and_match_solo(runner_cls):
    expected = [solo_text(p, seed=i) for i, p in enumerate(PROMPTS)]

    async def consume(api, i):
        stream = await api.completions.create(prompt=PROMPTS[i], seed=i, max_tokens=24,
                                              stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def main():
        api, runner = build_async(runner_cls)
        texts = await asyncio.gather(*(consume(api, i) for i in range(8)))
        await api.aclose()
        return api, runner, texts

    api, runner, texts = asyncio.run(main())
    assert texts == expected
    assert runner.max_batch_seen == 8  # everyone decoded together
    assert sum(len(b.seq_ids) > 1 for b in runner.batches) > 20
    assert api.core.kv.available_pages == 256
    if runner_cls is AsyncFakeRunner:
        assert runner.async_calls == len(runner.batches)


def test_nonstream_awaits_and_chat_chunks_match():
    async def main():
        api, runner = build_async()
        msgs = [{"role": "user", "content": "hello"}]
        full, stream = await asyncio.gather(
            api.chat.completions.create(messages=msgs, seed=4, max_tokens=20),
            api.chat.completions.create(messages=msgs, seed=4, max_tokens=20, stream=True,
                                        stream_options={"include_usage": True}),
        )
        chunks = [c async for c in stream]
        await api.aclose()
        return full, chunks, runner

    full, chunks, runner = asyncio.run(main())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    last = chunks[-1].usage  # the same counts (the second may read the first's prompt pages)
    assert (last.prompt_tokens, last.completion_tokens) == (full.usage.prompt_tokens, 20)
    assert runner.max_batch_seen == 2


def test_breaking_out_aborts_and_frees_pages_while_others_continue():
    async def main():
        api, runner = build_async(num_pages=128)

        async def quitter():
            stream = await api.completions.create(prompt="abc", seed=1, max_tokens=200,
                                                  stream=True)
            got = 0
            async for _ in stream:
                got += 1
                if got == 3:
                    break
            await stream.aclose()
            return got

        async def stayer():
            r = await api.completions.create(prompt="xyz", seed=2, max_tokens=30)
            return r.choices[0].text

        got, text = await asyncio.gather(quitter(), stayer())
        for _ in range(3):
            await asyncio.sleep(0)
        free = api.core.kv.available_pages
        unfinished = api.core.has_unfinished()
        await api.aclose()
        return got, text, free, unfinished, runner

    got, text, free, unfinished, runner = asyncio.run(main())
    assert got == 3
    assert text == solo_text("xyz", seed=2, max_tokens=30)
    assert free == 128 and not unfinished
    # the quitter's 200 tokens were never all generated
    assert sum(len(b.sample_rows) for b in runner.batches) < 200


def test_cancelling_a_waiting_request_aborts_it():
    async def main():
        api, runner = build_async()
        task = asyncio.ensure_future(
            api.completions.create(prompt="abc", seed=1, max_tokens=300))
        for _ in range(5):
            await asyncio.sleep(0)
        assert api.core.has_unfinished()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(3):
            await asyncio.sleep(0)
        state = (api.core.has_unfinished(), api.core.kv.available_pages)
        await api.aclose()
        return state, runner

    (unfinished, free), runner = asyncio.run(main())
    assert not unfinished and free == 256
    assert sum(len(b.sample_rows) for b in runner.batches) < 300


def test_async_errors_are_raised_by_create():
    async def main():
        api, runner = build_async()
        with pytest.raises(InvalidRequestError) as e:
            await api.chat.completions.create(messages=[{"role": "user", "content": "x"}],
                                              top_p=0, stream=True)
        assert e.value.param == "top_p"
        with pytest.raises(ContextLengthExceededError):
            await api.completions.create(prompt="x" * 2000)
        return runner

    assert asyncio.run(main()).batches == []


def test_a_runner_failure_reaches_every_waiting_request():
    class Broken(FakeRunner):
        def step(self, batch):
            raise RuntimeError("device lost")

    async def main():
        api, _ = build_async(Broken)
        results = await asyncio.gather(
            api.completions.create(prompt="a", max_tokens=5),
            api.completions.create(prompt="b", max_tokens=5),
            return_exceptions=True,
        )
        for _ in range(3):
            await asyncio.sleep(0)
        state = (api.core.has_unfinished(), api.core.kv.available_pages)
        await api.aclose()
        return results, state

    results, (unfinished, free) = asyncio.run(main())
    assert [str(r) for r in results] == ["device lost", "device lost"]
    assert not unfinished and free == 256


def test_a_failed_step_is_the_engines_health_until_a_step_succeeds():
    """``core.runner_error`` (what a Ray replica's health check reads): set by a failed step,
    kept while no step runs (a lost device stays lost), cleared by the next step that
    succeeds."""
    class Flaky(FakeRunner):
        fail = True

        def step(self, batch):
            if Flaky.fail:
                raise RuntimeError("device lost")
            return super().step(batch)

    async def main():
        api, _ = build_async(Flaky)
        before = api.core.runner_error
        with pytest.raises(RuntimeError):
            await api.completions.create(prompt="a", max_tokens=3)
        for _ in range(3):
            await asyncio.sleep(0)
        failed = api.core.runner_error
        Flaky.fail = False
        reply = await api.completions.create(prompt="b", max_tokens=3)
        after = api.core.runner_error
        await api.aclose()
        return before, failed, reply.usage.completion_tokens, after

    assert asyncio.run(main()) == (None, "RuntimeError: device lost", 3, None)


def test_dropping_a_stream_without_aclose_aborts_it():
    async def main():
        api, runner = build_async(num_pages=64)

        async def reader():
            stream = await api.completions.create(prompt="abc", max_tokens=200, stream=True)
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 3:
                    break  # no aclose(): the stream object is simply dropped
            return seen

        seen = await reader()
        for _ in range(3):
            await asyncio.sleep(0)
        state = (seen, api.core.has_unfinished(), api.core.kv.available_pages, len(runner.batches))
        await api.aclose()
        return state

    seen, unfinished, free, steps = asyncio.run(main())
    assert (seen, unfinished, free) == (3, False, 64)
    assert steps < 10
