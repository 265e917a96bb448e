"""The browser half of bench/cpu.py: wick's WebAssembly kernels vs wllama (llama.cpp compiled to
WebAssembly, npm ``@wllama/wllama``) in the same headless Chromium, on the same SmolLM2 GGUF.

wick serves the model's artifact (``--quantization``, default q4f32_1) as ``wick serve`` does
and runs ``createEngine(model, {backend: "wasm"})`` twice: on the relaxed-SIMD kernels (fused
multiply-adds, the default where the browser has them) and on the plain SIMD ones
(``relaxedSimd: false``); wllama loads the GGUF from the same origin with ``n_gpu_layers: 0``.
Chromium runs without WebGPU. All get the same prompt text and greedy decoding with EOS
ignored:

wick's two kinds of kernels run ``ROUNDS`` times each, alternating, each page closed before the
next; each rate is its kind's best run (the kernel table is its last run's).

* prefill tok/s: the prompt's tokens over the time to the first new token;
* decode tok/s at batch 1: the new tokens after the first over the time after it; wick also at
  ``--batch`` concurrent requests (their decodes share steps; wllama runs one sequence).

wllama's own timings (llama.cpp's ``prompt_per_second`` / ``predicted_per_second``) are used
for it. Threads: ``--browser-threads`` (default: every core); more than one needs a
cross-origin isolated page, which this script then serves to both (wick then uses one thread
per core, as ``navigator.hardwareConcurrency`` says; wllama the number asked for).
The package is fetched from the npm registry on first use into build/bench/.
"""

from __future__ import annotations

import time
from pathlib import Path

from npm_packages import isolated_static, npm_package  # (bench/: the script's directory is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
WLLAMA = "@wllama/wllama@3.13.0"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]  # (no --enable-unsafe-webgpu)
PAGE = "/__bench_cpu__.html"
# wick runs each kind of kernels this many times, alternating (the first run in a fresh browser
# is slowed by V8 compiling Pyodide's module in the background), and reports each one's best
ROUNDS = 3
TPS = ("prefill_tps", "decode_tps", "batch_decode_tps")
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin",
             "Cross-Origin-Embedder-Policy": "require-corp"}


def wllama_dir() -> Path:
    return npm_package(WLLAMA, "wllama")


def bench_files(gguf: Path) -> str:
    """A directory the wick server also serves (at /__bench__): wllama's package and the GGUF."""
    d = ROOT / "build" / "bench" / "served"
    d.mkdir(parents=True, exist_ok=True)
    for name, target in (("wllama", wllama_dir()), ("model.gguf", gguf)):
        link = d / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(target).resolve())  # (a relative path is not the link's)
    return str(d)


WICK = """async ([model, quantization, prompt, tokens, batch, relaxedSimd]) => {
  const wick = await import('/static/wick.js');
  const engine = await wick.createEngine(model, {quantization, backend: "wasm", prefixCache: false,
                                                 relaxedSimd});
  const body = {prompt, max_tokens: tokens + 1, temperature: 0, ignore_eos: true, stream: true,
                stream_options: {include_usage: true}};
  const one = async () => {
    const t0 = performance.now(); let first = null; let usage = null;
    for await (const c of await engine.completions.create(body)) {
      if (c.choices.length && c.choices[0].text && first === null) first = performance.now();
      usage = c.usage ?? usage;
    }
    return {t0, first, end: performance.now(), usage};
  };
  await one(); // warm: first calls of every kernel
  const s0 = (await engine.stats()).totals;
  const solo = await one();
  const s1 = (await engine.stats()).totals;
  const per = (k) => (s1[k] - s0[k]) / (s1.steps - s0.steps);
  const many = await Promise.all(Array.from({length: batch}, one));
  const stats = await engine.stats();
  await engine.unload();
  const firstAll = Math.max(...many.map((r) => r.first));
  const endAll = Math.max(...many.map((r) => r.end));
  return {
    prompt_tokens: solo.usage.prompt_tokens,
    prefill_tps: solo.usage.prompt_tokens / ((solo.first - solo.t0) / 1000),
    decode_tps: (solo.usage.completion_tokens - 1) / ((solo.end - solo.first) / 1000),
    batch_decode_tps: many.reduce((s, r) => s + r.usage.completion_tokens - 1, 0) /
      ((endAll - firstAll) / 1000),
    device: engine.info.device,
    kernels: stats.kernels, steps: stats.totals.steps, helper_tasks: stats.helperTasks,
    step_ms: {engine: per("engine_ms"), plan: per("plan_ms"), backend: per("backend_ms"),
              kernels: per("device_wait_ms"), js: per("js_encode_ms")},
  };
}"""

WLLAMA_RUN = """async ([prompt, tokens, threads]) => {
  const { Wllama } = await import('/__bench__/wllama/esm/index.js');
  const wllama = new Wllama({default: '/__bench__/wllama/esm/wasm/wllama.wasm'},
                            {logger: {debug() {}, log() {}, info() {}, warn() {}, error: console.error}});
  await wllama.loadModelFromUrl(location.origin + '/__bench__/model.gguf',
                                {n_threads: threads, n_ctx: 1024, n_gpu_layers: 0});
  const run = () => wllama.createCompletion({prompt, max_tokens: tokens + 1, temperature: 0,
                                             ignore_eos: true, cache_prompt: false});
  await run(); // warm
  const r = await run();
  const out = {prompt_tokens: r.timings.prompt_n, prefill_tps: r.timings.prompt_per_second,
               decode_tps: r.timings.predicted_per_second, threads: wllama.getNumThreads(),
               multithread: wllama.isMultithread(), isolated: crossOriginIsolated};
  await wllama.exit();
  return out;
}"""


def bench_browser(artifact: Path, model: str, gguf: Path, prompt: str, tokens: int,
                  batch: int, threads: int) -> tuple[dict, dict]:
    """(wick's numbers {"relaxed": .., "plain": ..}, wllama's numbers) in one Chromium."""
    from playwright.sync_api import sync_playwright

    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    from starlette.routing import Mount

    host = ArtifactHost()
    host.add(artifact)
    app = create_app(ModelPool(state="ready"), artifacts=host)
    # wllama and the GGUF, before the app's own routes (which answer any other path)
    app.router.routes.insert(0, Mount("/__bench__", isolated_static(bench_files(gguf))))
    live = ServerThread(app)
    html = "<!doctype html><meta charset=utf-8><title>wick cpu bench</title>"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            ctx = browser.new_context()

            def page(isolated: bool):
                p = ctx.new_page()
                p.set_default_timeout(900_000)
                headers = ISOLATION if isolated else {}
                p.route(live.url + PAGE, lambda r: r.fulfill(body=html, content_type="text/html",
                                                             headers=headers))
                p.goto(live.url + PAGE)
                return p

            ours = {}
            for kernels in ("relaxed", "plain") * ROUNDS:
                t0 = time.time()
                p = page(threads > 1)
                run = p.evaluate(WICK, [model, artifact_quantization(artifact), prompt, tokens,
                                        batch, kernels == "relaxed"])
                p.close()
                print(f"wick (wasm, {kernels} SIMD) measured in {time.time() - t0:.0f} s: "
                      + ", ".join(f"{k} {run[k]:.1f}" for k in TPS), flush=True)
                best = ours.get(kernels)  # (each rate's best; the rest from the last run)
                ours[kernels] = {**run, **{k: max(run[k], best[k]) for k in TPS}} if best else run
            t0 = time.time()
            theirs = page(threads > 1).evaluate(WLLAMA_RUN, [prompt, tokens, threads])
            print(f"wllama measured in {time.time() - t0:.0f} s", flush=True)
            browser.close()
    finally:
        live.stop()
    return ours, theirs


def artifact_quantization(artifact: Path) -> str:
    import json

    return json.loads((artifact / "wick-artifact.json").read_text())["quantization"]


def print_table(both: dict, theirs: dict, batch: int) -> None:
    ours, plain = both["relaxed"], both["plain"]
    print(f"\nbrowser (Chromium, no WebGPU): wick on {ours['device']} "
          f"({ours['helper_tasks']} loop tasks on helper threads), and on {plain['device']}; "
          f"wllama {theirs['threads']} thread(s){' (isolated page)' if theirs['isolated'] else ''}")
    print(f"prompt {ours['prompt_tokens']} tokens (wllama counts {theirs['prompt_tokens']})\n")
    print(f"{'':<26}{'wick':>8}{'wick plain':>12}{'wllama':>9}{'wick/wllama':>13}"
          f"{'wick/plain':>12}")
    for name, key in (("prefill tok/s (batch 1)", "prefill_tps"),
                      ("decode tok/s (batch 1)", "decode_tps")):
        print(f"{name:<26}{ours[key]:>8.1f}{plain[key]:>12.1f}{theirs[key]:>9.1f}"
              f"{ours[key] / theirs[key]:>12.2f}x{ours[key] / plain[key]:>11.2f}x")
    key = "batch_decode_tps"
    print(f"{f'decode tok/s (batch {batch})':<26}{ours[key]:>8.1f}{plain[key]:>12.1f}{'-':>9}"
          f"{'':>13}{ours[key] / plain[key]:>11.2f}x")
    ms = ours["step_ms"]
    print(f"\nwick host ms per step (batch 1): engine {ms['engine']:.1f} (plan {ms['plan']:.1f}, "
          f"backend call {ms['backend']:.1f} = kernels {ms['kernels']:.1f} + JS {ms['js']:.1f})")
    plain_ms = {k["name"]: k["ms"] for k in plain["kernels"]}
    print(f"wick's slowest kernels over {ours['steps']} steps (its last run; ms in all, calls; "
          f"the last plain run's ms):")
    for k in ours["kernels"]:
        theirs_ms = plain_ms.get(k["name"])
        print(f"  {k['ms']:>9.1f} {k['calls']:>6}  {k['name']:<44}"
              + (f"{theirs_ms:>9.1f}" if theirs_ms is not None else ""))
