"""Benchmark the prefix cache, natively (wgpu) and in the browser (Pyodide worker, WebGPU):

    python bench/prefix.py                        # smollm2-135m-instruct q0f32, native
    python bench/prefix.py --browser              # ... and in headless Chromium
    python bench/prefix.py --tiny --browser       # a tiny random Llama (quick, offline)
    python bench/prefix.py --system-tokens 1500 --turns 10 --max-tokens 8

(a) a long system prompt (``--system-tokens``) and a short question: time to the first token
    cold (nothing cached) and warm (another question after it), cache on;
(b) a ``--turns``-turn chat (each turn sends the whole conversation, as chat clients do): per
    turn, prompt tokens, tokens the cache gave and time to the first token, cache on vs off;
(c) one request with ``n=4`` vs four separate requests sent together, cache on, and ``n=4``
    with the cache off: prompt tokens computed and wall time.
Greedy, ``ignore_eos``, ``--max-tokens`` per answer. The scenarios are written once (here, in
Python); the browser runs each request through ``engine.chat.completions.create`` in the page.
On this machine both are CPU emulations (lavapipe, SwiftShader): the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SENTENCES = [
    "The archive keeps every report the team has written since the project began.",
    "Each entry names its author, the date, the systems it touched and what was learned.",
    "Answers must quote the entry they rely on and say when no entry covers the question.",
    "Numbers are given with their units, dates in the form year-month-day.",
    "When two entries disagree, the newer one wins unless it says otherwise.",
    "Keep answers short: a sentence or two, then the quoted entry.",
]
QUESTIONS = [
    "Which systems changed last spring?", "Who wrote the first report?",
    "What did the team learn about backups?", "Summarise the newest entry.",
    "Which entries mention the network?", "What is the oldest open problem?",
    "Did anything fail twice?", "Which report was the longest?",
    "What should a newcomer read first?", "List the authors in order.",
]
ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking"]
PAGE = "/__wick_bench_prefix__.html"

# one or more chat requests sent together, each streamed: first-token time, text, usage
JS_CREATE = """async ([key, bodies]) => {
  const engine = window.engines[key];
  const t0 = performance.now();
  const runs = await Promise.all(bodies.map(async (body) => {
    const texts = {}; let first = null; let usage = null;
    for await (const c of await engine.chat.completions.create(
        {...body, stream: true, stream_options: {include_usage: true}})) {
      for (const ch of c.choices) {
        if (ch.delta.content) { first ??= performance.now(); texts[ch.index] = (texts[ch.index] ?? "") + ch.delta.content; }
      }
      if (c.usage) usage = c.usage;
    }
    return {ttft: ((first ?? performance.now()) - t0) / 1000, texts, usage};
  }));
  const stats = await engine.stats();
  return {runs, seconds: (performance.now() - t0) / 1000, tokens_computed: stats.tokens_computed};
}"""


class Native:
    """The native engine (wgpu), cache on or off."""

    def __init__(self, model: str, quantization: str | None, prefix_cache: bool) -> None:
        from wick.server.local import Engine

        self.engine = Engine(model, quantization=quantization, prefix_cache=prefix_cache)
        self.prefix_cache = prefix_cache
        self.device = self.engine.device_name

    def create(self, bodies: list[dict]) -> dict:
        t0 = time.perf_counter()
        streams = [self.engine.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}) for body in bodies]
        runs = []
        for stream in streams:  # (iterating one steps them all: they share engine steps)
            texts, first, usage = {}, None, None
            for c in stream:
                for ch in c.choices:
                    if ch.delta.content:
                        first = first or time.perf_counter()
                        texts[ch.index] = texts.get(ch.index, "") + ch.delta.content
                if c.usage is not None:
                    usage = c.usage.to_dict()
            runs.append({"ttft": (first or time.perf_counter()) - t0, "texts": texts,
                         "usage": usage})
        return {"runs": runs, "seconds": time.perf_counter() - t0,
                "tokens_computed": self.engine.core.stats.tokens_computed}


class Browser:
    """The browser engine in one headless Chromium page (a dedicated worker per engine)."""

    def __init__(self, pw, chromium: str, server_url: str, model: str, quantization: str,
                 prefix_cache: bool, page=None) -> None:
        if page is None:
            browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
            page = browser.new_page()
            page.route(server_url + PAGE, lambda r: r.fulfill(
                body="<!doctype html><title>bench</title>", content_type="text/html"))
            page.goto(server_url + PAGE)
            page.set_default_timeout(3_600_000)
        self.page, self.key = page, "on" if prefix_cache else "off"
        self.prefix_cache = prefix_cache
        info = page.evaluate("""async ([key, model, quantization, prefixCache]) => {
            const wick = await import('/static/wick.js');
            window.engines ??= {};
            window.engines[key] = await wick.createEngine(model, {quantization, prefixCache});
            return window.engines[key].info;
        }""", [self.key, model, quantization, prefix_cache])
        self.device = f"{info['device']} (headless Chromium, Pyodide worker)"

    def create(self, bodies: list[dict]) -> dict:
        out = self.page.evaluate(JS_CREATE, [self.key, bodies])
        for run in out["runs"]:
            run["texts"] = {int(k): v for k, v in run["texts"].items()}
        return out


def system_prompt(tokens: int, tokenizer) -> str:
    """Sentences until the text is about ``tokens`` tokens long."""
    text, i = "You answer questions about the team's archive.", 0
    while len(tokenizer.encode(text)) < tokens:
        text += " " + SENTENCES[i % len(SENTENCES)] + f" (rule {i + 1})"
        i += 1
    return text


def chat(system: str, question: str, max_tokens: int, **extra) -> dict:
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}


def cold_warm(engine, system: str, max_tokens: int) -> tuple[dict, dict]:
    cold = engine.create([chat(system, QUESTIONS[0], max_tokens)])["runs"][0]
    warm = engine.create([chat(system, QUESTIONS[1], max_tokens)])["runs"][0]
    return cold, warm


def turns(engine, count: int, max_tokens: int) -> list[dict]:
    messages = [{"role": "system", "content": SENTENCES[0]}]
    rows = []
    for turn in range(count):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        run = engine.create([{"messages": list(messages), "max_tokens": max_tokens,
                              "temperature": 0, "ignore_eos": True}])["runs"][0]
        messages.append({"role": "assistant", "content": run["texts"].get(0, "")})
        rows.append(run)
    return rows


def fan_out(engine, system: str, max_tokens: int, separate: bool) -> dict:
    """n=4, then (``separate``) four separate requests sent together: prompt tokens computed,
    wall time."""
    out = {}
    runs = [("n=4", [chat(system, QUESTIONS[2], max_tokens, n=4)])]
    if separate:
        # (a system prompt of their own: the n=4 request's pages must not serve them)
        runs.append(("4 requests", [chat("Four. " + system, QUESTIONS[2], max_tokens)] * 4))
    for name, bodies in runs:
        before = engine.create([chat("", "hi", 1)])["tokens_computed"]  # (a fence)
        r = engine.create(bodies)
        prompt_work = r["tokens_computed"] - before - 4 * (max_tokens - 1)
        out[name] = {"prompt_computed": prompt_work, "seconds": r["seconds"],
                     "prompt_tokens": r["runs"][0]["usage"]["prompt_tokens"]}
    return out


def report(name: str, device: str, on, off, args) -> bool:
    print(f"\n== {name}: {device}")
    (cold, warm) = on["cold_warm"]
    print(f"(a) system prompt + question: {cold['usage']['prompt_tokens']} tokens; TTFT cold "
          f"{cold['ttft']:.2f} s, warm {warm['ttft']:.2f} s ({cold['ttft'] / warm['ttft']:.1f}x; "
          f"{warm['usage']['prompt_tokens_details']['cached_tokens']} tokens cached)")
    print(f"(b) {'turn':>4} {'prompt':>6} {'cached':>6} {'TTFT on':>8} {'TTFT off':>9} {'off/on':>6}")
    same = True
    for i, (a, b) in enumerate(zip(on["turns"], off["turns"])):
        same &= a["texts"] == b["texts"]
        print(f"    {i + 1:>4} {a['usage']['prompt_tokens']:>6} "
              f"{a['usage']['prompt_tokens_details']['cached_tokens']:>6} {a['ttft']:>7.2f}s "
              f"{b['ttft']:>8.2f}s {b['ttft'] / a['ttft']:>6.2f}")
    print(f"    greedy answers equal with the cache on and off: {same}")
    for label, runs in (("cache on", on["fan_out"]), ("cache off", off["fan_out"])):
        for what, r in runs.items():
            print(f"(c) {what:<10} {label:<9}: {r['prompt_computed']:>5} prompt tokens computed "
                  f"(prompt {r['prompt_tokens']}), {r['seconds']:.2f} s")
    return same


def run_scenarios(engine, system: str, fan_system: str, args) -> dict:
    label = f"cache {'on' if engine.prefix_cache else 'off'}"
    started = time.perf_counter()

    def progress(what: str) -> None:  # (a run on a CPU emulation takes many minutes)
        print(f"  [{label}] {what} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)

    engine.create([chat("", "warm up", 2)])  # kernels, pipelines
    out = {"cold_warm": cold_warm(engine, system, args.max_tokens)}
    progress("(a) done")
    out["turns"] = turns(engine, args.turns, args.max_tokens)
    progress("(b) done")
    out["fan_out"] = fan_out(engine, fan_system, args.max_tokens, engine.prefix_cache)
    progress("(c) done")
    return out


def tiny_model() -> str:
    from tests.tiny_models import make_tiny_llama
    from wick.compiler.compile import compile_model

    src = make_tiny_llama(Path(tempfile.gettempdir()) / "wick-bench-tiny-llama")
    return str(compile_model(str(src), "q0f32", context_window=512))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--quantization", default="q0f32")
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama instead")
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--fan-out-tokens", type=int, default=300,
                   help="the system prompt of (c) (four times over without sharing)")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--browser", action="store_true", help="also in headless Chromium")
    p.add_argument("--skip-native", action="store_true")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args()

    from wick.compiler.compile import compile_model
    from wick.engine.artifact import Artifact
    from wick.native.tokenizer import HFTokenizer

    if args.tiny:
        artifact = Path(tiny_model())
        args.system_tokens = min(args.system_tokens, 300)
        args.fan_out_tokens = min(args.fan_out_tokens, 100)
        args.turns = min(args.turns, 4)
    else:
        artifact = compile_model(args.model, args.quantization)
    art = Artifact.load(lambda f: (artifact / f).read_bytes(), str(artifact))
    tokenizer = HFTokenizer(art.tokenizer_json())
    system = system_prompt(args.system_tokens, tokenizer)
    # another system prompt (its first page differs): nothing of it is cached before (c)
    fan_system = "Fan-out. " + system_prompt(args.fan_out_tokens, tokenizer)
    ok = True
    print(f"{art.model_id} ({art.quantization}), {args.max_tokens} tokens per answer")
    if not args.skip_native:
        engines = {on: Native(str(artifact), None, on) for on in (True, False)}
        runs = {on: run_scenarios(engine, system, fan_system, args)
                for on, engine in engines.items()}
        ok &= report("native", engines[True].device, runs[True], runs[False], args)
    if args.browser:
        from playwright.sync_api import sync_playwright

        from wick.server.app import ModelPool, create_app
        from wick.server.artifact_host import ArtifactHost
        from wick.server.serve import ServerThread

        host = ArtifactHost()
        host.add(artifact)
        server = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
        try:
            with sync_playwright() as pw:
                first = Browser(pw, args.chromium, server.url, art.model_id, art.quantization, True)
                second = Browser(pw, args.chromium, server.url, art.model_id, art.quantization,
                                 False, page=first.page)
                runs = {True: run_scenarios(first, system, fan_system, args),
                        False: run_scenarios(second, system, fan_system, args)}
                ok &= report("browser", first.device, runs[True], runs[False], args)
        finally:
            server.stop()
    print(json.dumps({"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
