"""Browser engine benchmark: wick in Pyodide in a Web Worker on WebGPU (headless Chromium),
against the native engine (wgpu) on the same artifact.

    python bench/browser.py [--model smollm2-135m-instruct | --artifact DIR]
                            [--quantization q0f32] [--tokens 32] [--batch 1,4] [--prompt TEXT]
                            [--chromium /usr/bin/chromium] [--headed] [--skip-native]

Prints: load time cold (download + verify + upload, empty Cache API) and warm (from the cache),
then for each batch size the prefill time (first token) and decode tokens/s of ``--tokens``
greedy tokens (EOS ignored) per request, batch requests issued together so their decodes share
steps; the same for the native engine. Headless Chromium's WebGPU here is SwiftShader (CPU):
numbers describe the host, not a GPU. Needs ``bash web/build.sh`` first.
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

RUN = """async ([model, quantization, prompt, tokens, batches]) => {
  const wick = await import('/static/wick.js');
  const out = {};
  let t = performance.now();
  let engine = await wick.createEngine(model, {quantization});
  out.load_cold_s = (performance.now() - t) / 1000;
  out.info = engine.info;
  await engine.unload();
  t = performance.now();
  engine = await wick.createEngine(model, {quantization});
  out.load_warm_s = (performance.now() - t) / 1000;
  out.warm_shard_requests = engine.info.shardRequests;
  const body = {prompt, max_tokens: tokens, temperature: 0, ignore_eos: true, stream: true,
                stream_options: {include_usage: true}};
  await engine.completions.create({prompt, max_tokens: 2, temperature: 0});  // warm-up
  out.runs = [];
  for (const b of batches) {
    const one = async () => {
      const t0 = performance.now(); let first = null; let n = 0;
      for await (const c of await engine.completions.create(body)) {
        if (c.choices.length && c.choices[0].text) { first ??= performance.now(); }
        if (c.usage) n = c.usage.completion_tokens;
      }
      const t1 = performance.now();
      return {first_s: (first - t0) / 1000, decode_tok_s: (n - 1) / ((t1 - first) / 1000), n};
    };
    const t0 = performance.now();
    const rs = await Promise.all(Array.from({length: b}, one));
    const wall = (performance.now() - t0) / 1000;
    out.runs.push({batch: b, wall_s: wall, total_tok_s: rs.reduce((s, r) => s + r.n, 0) / wall,
                   first_s: Math.max(...rs.map((r) => r.first_s)),
                   decode_tok_s_per_request: rs.reduce((s, r) => s + r.decode_tok_s, 0) / b});
  }
  await engine.unload();
  return out;
}"""


def native_runs(artifact: Path, prompt: str, tokens: int, batches: list[int]) -> list[dict]:
    import asyncio

    from wick.server.local import AsyncEngine

    eng = AsyncEngine(str(artifact))

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

    async def main() -> list[dict]:
        await eng.completions.create(prompt=prompt, max_tokens=2, temperature=0)
        runs = []
        for b in batches:
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(one() for _ in range(b)))
            wall = time.perf_counter() - t0
            runs.append({"batch": b, "wall_s": wall, "total_tok_s": sum(r["n"] for r in rs) / wall,
                         "first_s": max(r["first_s"] for r in rs),
                         "decode_tok_s_per_request": sum(r["decode_tok_s"] for r in rs) / b})
        await eng.aclose()
        return runs

    return asyncio.run(main())


def table(name: str, runs: list[dict]) -> None:
    for r in runs:
        print(f"{name:8s} batch {r['batch']:2d}: first token {r['first_s']:6.2f} s, decode "
              f"{r['decode_tok_s_per_request']:7.1f} tok/s per request, "
              f"{r['total_tok_s']:7.1f} tok/s total")


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
            browser = pw.chromium.launch(executable_path=args.chromium, headless=not args.headed,
                                         args=ARGS)
            page = browser.new_page()
            page.route(server.url + PAGE, lambda r: r.fulfill(body="<!doctype html><title>bench</title>",
                                                             content_type="text/html"))
            page.goto(server.url + PAGE)
            page.set_default_timeout(3_600_000)
            out = page.evaluate(RUN, [art.model_id, art.quantization, args.prompt, args.tokens, batches])
            browser.close()
    finally:
        server.stop()
    info = out["info"]
    size = sum(s["nbytes"] for s in art.manifest["shards"]) / 2**20
    print(f"{info['model']} {info['quantization']} ({size:.1f} MiB of weights) on {info['device']}")
    print(f"load: cold {out['load_cold_s']:.2f} s, warm (Cache API) {out['load_warm_s']:.2f} s "
          f"({out['warm_shard_requests']} shard requests)")
    table("browser", out["runs"])
    if not args.skip_native:
        table("native", native_runs(artifact, args.prompt, args.tokens, batches))


if __name__ == "__main__":
    main()
