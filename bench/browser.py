"""Browser engine benchmark: wick in Pyodide in a Web Worker on WebGPU (headless Chromium),
against the native engine (wgpu) on the same artifact.

    python bench/browser.py [--model smollm2-135m-instruct | --artifact DIR]
                            [--quantization q0f32] [--tokens 32] [--batch 1,4] [--prompt TEXT]
                            [--chromium /usr/bin/chromium] [--headed] [--skip-native]
                            [--attach-only]

Prints: cold (empty Cache API) and warm (from the cache) loads split into Pyodide boot, kernel
compilation and weights (download or cache read, verify, upload), and the time to the first token
of a first request after each; then for each batch size the first-token time and decode tokens/s
of ``--tokens`` greedy tokens (EOS ignored) per request, batch requests issued together so their
decodes share steps, and host-side ms per step: the Python engine (scheduling and
postprocessing), building the dispatch lists (plan) and the backend call, split in the browser
into JS encoding and waiting for the device + readback. The same for the native engine (wgpu)
on the same artifact, and the decode ratio. Then time to first token when attaching to an
engine that is already loaded, beside a fresh ``createEngine`` with a cold and a warm cache:
a second tab on ``createEngine(model, {shared: true})`` (SharedWorker), and a second page of
the Chrome extension (``wick extension build``; cold: a new profile, warm: after closing the
offscreen document). Headless Chromium's WebGPU here is SwiftShader (CPU): numbers describe
the host, not a GPU ("auto" would pass over it for the WebAssembly kernels, which
``bench/cpu.py --browser`` measures; here WebGPU is asked for). Needs ``bash web/build.sh``
first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic", "--enable-unsafe-webgpu"]
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg combined movable metal type, oil-based inks and a wooden press.")
PAGE = "/__wick_bench__.html"

RUN = """async ([model, quantization, prompt, tokens, batches, backend]) => {
  const wick = await import('/static/wick.js');
  const body = {prompt, max_tokens: tokens, temperature: 0, ignore_eos: true, stream: true,
                stream_options: {include_usage: true}};
  // one streamed request: seconds to its first token, decode tok/s after it, tokens
  const one = async (engine) => {
    const t0 = performance.now(); let first = null; let n = 0;
    for await (const c of await engine.completions.create(body)) {
      if (c.choices.length && c.choices[0].text) { first ??= performance.now(); }
      if (c.usage) n = c.usage.completion_tokens;
    }
    const t1 = performance.now();
    return {first_s: (first - t0) / 1000, decode_tok_s: (n - 1) / ((t1 - first) / 1000), n};
  };
  // a load, split by its progress events, then the first token of a first request
  const load = async () => {
    const marks = {};
    const t0 = performance.now();
    const mark = (p) => {
      const t = (performance.now() - t0) / 1000;
      if (p.stage === "boot" && p.loaded === 2) marks.boot = t;
      if (p.stage === "compile") marks.compile ??= t;
      if (p.stage === "download" && p.total > 0) marks.download ??= t;  // weights begin
    };
    const engine = await wick.createEngine(model, {quantization, backend, onProgress: mark});
    const load_s = (performance.now() - t0) / 1000;
    const first = await one(engine);
    return {engine, load_s, boot_s: marks.boot ?? 0,
            kernels_s: (marks.download ?? load_s) - (marks.compile ?? 0),
            weights_s: load_s - (marks.download ?? load_s), first_token_s: first.first_s,
            ttft_s: load_s + first.first_s, info: engine.info};
  };
  const out = {};
  let l = await load();
  out.cold = {...l, engine: undefined};
  await l.engine.unload();
  l = await load();
  out.warm = {...l, engine: undefined};
  const engine = l.engine;
  out.runs = [];
  for (const b of batches) {
    const s0 = (await engine.stats()).totals;
    const t0 = performance.now();
    const rs = await Promise.all(Array.from({length: b}, () => one(engine)));
    const wall = (performance.now() - t0) / 1000;
    const s1 = (await engine.stats()).totals;
    const steps = s1.steps - s0.steps;
    const per = (k) => (s1[k] - s0[k]) / Math.max(steps, 1);
    out.runs.push({batch: b, wall_s: wall, total_tok_s: rs.reduce((s, r) => s + r.n, 0) / wall,
                   first_s: Math.max(...rs.map((r) => r.first_s)),
                   decode_tok_s_per_request: rs.reduce((s, r) => s + r.decode_tok_s, 0) / b,
                   steps, engine_ms: per("engine_ms"), plan_ms: per("plan_ms"),
                   backend_ms: per("backend_ms"), js_encode_ms: per("js_encode_ms"),
                   device_wait_ms: per("device_wait_ms")});
  }
  await engine.unload();
  return out;
}"""


# time to the first token of a request made right after createEngine returns
TTFT = """async ([wickUrl, model, quantization, prompt, shared]) => {
  const wick = await import(wickUrl);
  const t0 = performance.now();
  window.engine = await wick.createEngine(model, {quantization, shared});
  const load_s = (performance.now() - t0) / 1000;
  for await (const c of await engine.completions.create({prompt, max_tokens: 2, temperature: 0,
      stream: true})) {
    if (c.choices.length && c.choices[0].text) break;
  }
  return {load_s, ttft_s: (performance.now() - t0) / 1000, attached: engine.info.attached,
          shardRequests: engine.info.shardRequests, shardsFromCache: engine.info.shardsFromCache};
}"""


def attach_runs(pw, args, server_url: str, art, artifact_dir: Path) -> dict:
    """TTFT of a fresh engine (cold, warm) and of attaching to a loaded one: shared engine
    (two tabs of one origin) and the Chrome extension (two extension pages)."""
    import tempfile

    from wick.server.extension_build import build_extension

    spec = [art.model_id, art.quantization, args.prompt]
    out: dict = {}
    browser = pw.chromium.launch(executable_path=args.chromium, headless=not args.headed, args=ARGS)
    ctx = browser.new_context()

    def tab():
        page = ctx.new_page()
        page.route(server_url + PAGE, lambda r: r.fulfill(body="<!doctype html><title>bench</title>",
                                                         content_type="text/html"))
        page.goto(server_url + PAGE)
        page.set_default_timeout(3_600_000)
        return page

    first = tab()
    out["shared cold"] = first.evaluate(TTFT, ["/static/wick.js", *spec, True])
    out["shared attach"] = tab().evaluate(TTFT, ["/static/wick.js", *spec, True])
    ctx.close()
    ctx = browser.new_context()
    page = tab()
    page.evaluate(TTFT, ["/static/wick.js", *spec, False])  # fills this context's cache
    page.evaluate("() => engine.unload()")
    out["fresh warm"] = page.evaluate(TTFT, ["/static/wick.js", *spec, False])
    browser.close()

    with tempfile.TemporaryDirectory() as tmp:
        ext = Path(tmp) / "ext"
        build_extension(ext, server_url)
        ctx = pw.chromium.launch_persistent_context(
            str(Path(tmp) / "profile"), executable_path=args.chromium, headless=not args.headed,
            args=[*ARGS, "--headless=new", f"--disable-extensions-except={ext}", f"--load-extension={ext}"])
        worker = (ctx.service_workers[0] if ctx.service_workers else
                  ctx.wait_for_event("serviceworker", timeout=60_000))
        ext_id = worker.url.split("/")[2]

        def ext_page():
            page = ctx.new_page()
            page.set_default_timeout(3_600_000)
            page.goto(f"chrome-extension://{ext_id}/options.html")
            return page

        wick_url = f"chrome-extension://{ext_id}/wick.js"
        a = ext_page()
        out["extension cold"] = a.evaluate(TTFT, [wick_url, *spec, False])
        out["extension attach"] = ext_page().evaluate(TTFT, [wick_url, *spec, False])
        a.evaluate("() => chrome.offscreen.closeDocument()")  # the engine goes; the cache stays
        out["extension warm"] = ext_page().evaluate(TTFT, [wick_url, *spec, False])
        ctx.close()
    return out


def attach_table(runs: dict) -> None:
    for name, r in runs.items():
        how = ("attached, no downloads" if r["attached"] else
               f"{r['shardRequests']} shard downloads, {r['shardsFromCache']} from the cache")
        print(f"{name:17s} createEngine {r['load_s']:6.2f} s, time to first token "
              f"{r['ttft_s']:6.2f} s ({how})")
    for kind in ("shared", "extension"):
        attach, cold = runs[f"{kind} attach"], runs[f"{kind} cold"]
        warm = runs["fresh warm" if kind == "shared" else "extension warm"]
        print(f"{kind}: attaching takes {attach['load_s']:.2f} s instead of {cold['load_s']:.1f} s "
              f"(cold) / {warm['load_s']:.1f} s (warm); time to first token "
              f"{cold['ttft_s'] / attach['ttft_s']:.2f}x / {warm['ttft_s'] / attach['ttft_s']:.2f}x "
              "shorter (the rest is the prompt's prefill)")


def native_runs(artifact: Path, prompt: str, tokens: int, batches: list[int]) -> dict:
    import asyncio

    from wick.server.local import AsyncEngine

    t0 = time.perf_counter()
    eng = AsyncEngine(str(artifact))
    load_s = time.perf_counter() - t0

    async def one() -> dict:
        t0 = time.perf_counter()
        first, n = None, 0
        stream = await eng.completions.create(prompt=prompt, max_tokens=tokens, temperature=0,
                                              ignore_eos=True, stream=True,
                                              stream_options={"include_usage": True})
        async for c in stream:
            if c.choices and c.choices[0].text and first is None:
                first = time.perf_counter()
            if c.usage:
                n = c.usage.completion_tokens
        t1 = time.perf_counter()
        return {"first_s": first - t0, "decode_tok_s": (n - 1) / (t1 - first), "n": n}

    def totals() -> dict:
        t, s = eng.core.runner.timings, eng.core.stats
        return {"steps": t.steps, "engine_ms": s.total_host_ms, "plan_ms": t.plan_ms_total,
                "backend_ms": t.backend_ms_total}

    async def main() -> dict:
        first = await one()
        runs = []
        for b in batches:
            s0 = totals()
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(one() for _ in range(b)))
            wall = time.perf_counter() - t0
            s1 = totals()
            steps = s1["steps"] - s0["steps"]
            runs.append({"batch": b, "wall_s": wall, "total_tok_s": sum(r["n"] for r in rs) / wall,
                         "first_s": max(r["first_s"] for r in rs),
                         "decode_tok_s_per_request": sum(r["decode_tok_s"] for r in rs) / b,
                         "steps": steps,
                         **{k: (s1[k] - s0[k]) / max(steps, 1)
                            for k in ("engine_ms", "plan_ms", "backend_ms")}})
        await eng.aclose()
        return {"load_s": load_s, "first_token_s": first["first_s"],
                "ttft_s": load_s + first["first_s"], "runs": runs}

    return asyncio.run(main())


def table(name: str, runs: list[dict]) -> None:
    for r in runs:
        split = (f"JS encode {r['js_encode_ms']:.2f} + device/readback {r['device_wait_ms']:.1f}"
                 if "js_encode_ms" in r else "")
        print(f"{name:8s} batch {r['batch']:2d}: first token {r['first_s']:6.2f} s, decode "
              f"{r['decode_tok_s_per_request']:7.1f} tok/s per request, "
              f"{r['total_tok_s']:7.1f} tok/s total")
        print(f"{'':8s}   host ms/step over {r['steps']} steps: engine {r['engine_ms']:.2f}, "
              f"plan {r['plan_ms']:.2f}, backend call {r['backend_ms']:.1f}"
              + (f" ({split})" if split else ""))


def load_line(name: str, l: dict) -> None:
    parts = ""
    if "boot_s" in l:  # "other": model index, manifest, tokenizer and kernel files, overlaps
        other = l["load_s"] - l["boot_s"] - l["kernels_s"] - l["weights_s"]
        python = l["info"]["python"]  # (boot: Python's start, from scratch or its snapshot)
        parts = (f" (boot {l['boot_s']:.2f} s [Python {python['ms'] / 1e3:.2f} s from "
                 f"{python['from']}], kernels {l['kernels_s']:.2f} s, weights "
                 f"{l['weights_s']:.2f} s, other {other:.2f} s)")
    print(f"{name:15s} load {l['load_s']:6.2f} s{parts}, first token {l['first_token_s']:.2f} s "
          f"-> time to first token {l['ttft_s']:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--artifact", type=Path, help="a compiled artifact directory (skips compiling)")
    ap.add_argument("--quantization", default="q0f32")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--headed", action="store_true")
    ap.add_argument("--skip-native", action="store_true")
    ap.add_argument("--attach-only", action="store_true",
                    help="only the attach-vs-fresh time to first token")
    ap.add_argument("--no-attach", action="store_true",
                    help="skip the attach-vs-fresh time to first token")
    ap.add_argument("--backend", default="webgpu", choices=("webgpu", "wasm"),
                    help="the browser engine's kernels (wasm: the start-up of issue #31)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]

    from playwright.sync_api import sync_playwright

    from wick.engine.artifact import Artifact
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    artifact = args.artifact
    if artifact is None:
        from wick.compiler.compile import compile_model

        artifact = compile_model(args.model, args.quantization)
    art = Artifact.load(lambda p: (artifact / p).read_bytes(), str(artifact))
    host = ArtifactHost()
    host.add(artifact)
    server = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    try:
        with sync_playwright() as pw:
            attach = None if args.no_attach else attach_runs(pw, args, server.url, art, artifact)
            if args.attach_only:
                attach_table(attach)
                return
            browser = pw.chromium.launch(executable_path=args.chromium, headless=not args.headed,
                                         args=ARGS)
            page = browser.new_page()
            page.route(server.url + PAGE, lambda r: r.fulfill(body="<!doctype html><title>bench</title>",
                                                             content_type="text/html"))
            page.goto(server.url + PAGE)
            page.set_default_timeout(3_600_000)
            out = page.evaluate(RUN, [art.model_id, art.quantization, args.prompt, args.tokens, batches,
                                      args.backend])
            browser.close()
    finally:
        server.stop()
    info = out["cold"]["info"]
    size = sum(s["nbytes"] for s in art.manifest["shards"]) / 2**20
    print(f"{info['model']} {info['quantization']} ({size:.1f} MiB of weights), prompt of "
          f"{len(args.prompt)} chars, {args.tokens} tokens per request")
    print(f"browser: {info['device']} (headless Chromium, Pyodide worker)")
    load_line("browser cold", out["cold"])
    load_line("browser warm", out["warm"])
    print(f"{'':15s} warm load made {out['warm']['info']['shardRequests']} shard requests")
    table("browser", out["runs"])
    if not args.skip_native:
        native = native_runs(artifact, args.prompt, args.tokens, batches)
        load_line("native", native)
        table("native", native["runs"])
        for b, n in zip(out["runs"], native["runs"]):
            print(f"batch {b['batch']:2d}: browser / native decode = "
                  f"{b['decode_tok_s_per_request'] / n['decode_tok_s_per_request']:.2f}x")
    if attach is not None:
        attach_table(attach)


if __name__ == "__main__":
    main()
