"""Benchmark the prefix cache: a multi-turn chat and n choices, cache on vs off, same engine.

    python bench/prefix_cache.py                   # smollm2-135m-instruct (its default variant)
    python bench/prefix_cache.py --tiny            # a tiny random Llama (quick, offline)
    python bench/prefix_cache.py --turns 6 --max-tokens 8 --model ARTIFACT_OR_NAME

Each turn sends the whole conversation so far (as a chat client does) plus a new question;
greedy, ``ignore_eos``, ``--max-tokens`` per answer. Per turn it prints the prompt length, the
tokens the cache gave, and the time to the first token with the cache on and off (their
ratio). Then one request with ``n=4`` choices: prompt tokens computed and its time, on vs off.
Both engines run in this process, one after the other, on the same device.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "Tell me about the history of the city you like best.",
    "What should a visitor see there first, and why?",
    "How does the weather change over the year?",
    "Which foods is it known for?",
    "How would you get around without a car?",
    "Summarise everything above in two sentences.",
    "Now the same for a second city, please.",
    "Which of the two would you pick for a week in spring?",
]
SYSTEM = ("You are a patient travel guide. You answer in plain language, give concrete "
          "examples, and keep every answer short enough to read on a phone screen.")


def tiny_model() -> str:
    """A tiny random Llama, compiled q0f32 (context window 1024) into the wick cache."""
    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import make_tiny_llama
    from wick.compiler.compile import compile_model

    src = make_tiny_llama(Path(tempfile.gettempdir()) / "wick-bench-tiny-llama")
    return str(compile_model(str(src), "q0f32", context_window=1024))


def instrument(engine) -> None:
    """Count in ``engine.bench_tokens`` the tokens the runner is given (prompt chunks and
    decode inputs)."""
    runner = engine.core.runner
    step = runner.step
    engine.bench_tokens = 0

    def counting_step(batch):
        engine.bench_tokens += len(batch.token_ids)
        return step(batch)

    runner.step = counting_step


def chat_turns(engine, turns: int, max_tokens: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    rows = []
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        start = time.perf_counter()
        first, reply, usage = None, "", None
        stream = engine.chat.completions.create(
            messages=messages, max_tokens=max_tokens, temperature=0, ignore_eos=True,
            stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.perf_counter() - start
            if chunk.choices:
                reply += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        messages.append({"role": "assistant", "content": reply})
        rows.append({"prompt": usage.prompt_tokens,
                     "cached": usage.prompt_tokens_details.cached_tokens,
                     "ttft": first if first is not None else time.perf_counter() - start,
                     "reply": reply})
    return rows


def n_choices(engine, max_tokens: int) -> dict:
    before = engine.bench_tokens
    start = time.perf_counter()
    r = engine.completions.create(prompt=SYSTEM + " " + QUESTIONS[0], n=4, max_tokens=max_tokens,
                                  temperature=1.0, seed=3, ignore_eos=True)
    seconds = time.perf_counter() - start
    prompt_work = engine.bench_tokens - before - 4 * (max_tokens - 1)
    return {"prompt": r.usage.prompt_tokens, "work": prompt_work, "seconds": seconds,
            "texts": [c.text for c in r.choices]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--quantization")
    p.add_argument("--tiny", action="store_true", help="bench a tiny random Llama instead")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=8)
    args = p.parse_args()

    sys.path.insert(0, str(ROOT))
    from wick.server.local import Engine

    model = tiny_model() if args.tiny else args.model
    results = {}
    for on in (True, False):
        engine = Engine(model, quantization=args.quantization, prefix_cache=on)
        instrument(engine)
        engine.completions.create(prompt="warm up", max_tokens=2)  # kernels, pipelines
        engine.core.reset_prefix_cache()
        results[on] = (chat_turns(engine, args.turns, args.max_tokens),
                       n_choices(engine, args.max_tokens), engine)
    on_rows, on_n, engine = results[True]
    off_rows, off_n, _ = results[False]
    info = engine.core.info
    print(f"model {info.model_id} ({info.quantization}) on {engine.device_name}, "
          f"page {info.page_size} tokens, {args.max_tokens} tokens per answer")
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} {'TTFT on':>9} {'TTFT off':>9} {'off/on':>7}")
    for i, (a, b) in enumerate(zip(on_rows, off_rows)):
        print(f"{i + 1:>4} {a['prompt']:>6} {a['cached']:>6} {a['ttft'] * 1e3:>7.0f}ms "
              f"{b['ttft'] * 1e3:>7.0f}ms {b['ttft'] / a['ttft']:>7.2f}")
    same = all(a["reply"] == b["reply"] for a, b in zip(on_rows, off_rows))
    print(f"greedy replies equal with the cache on and off: {same}")
    print(f"n=4 of a {on_n['prompt']}-token prompt: prompt tokens computed {on_n['work']} on, "
          f"{off_n['work']} off; {on_n['seconds']:.2f} s on, {off_n['seconds']:.2f} s off "
          f"({off_n['seconds'] / on_n['seconds']:.2f}x); same samples: "
          f"{on_n['texts'] == off_n['texts']}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
