"""Embeddings (issue #29): sentences per second of all-MiniLM-L6-v2 for 1, 32 and 256 inputs of
about 20 tokens, wick beside a peer in the same run:

    python bench/embeddings.py              # native: wick's CPU kernels vs sentence-transformers
    python bench/embeddings.py --browser    # ... and Chromium: wick's wasm kernels vs
                                            # transformers.js (wasm), 1 thread and every core

Native: ``wick.Engine("all-minilm-l6-v2", device="cpu")`` (q0f32 and q8f32_1) against
``SentenceTransformer(...).encode`` (PyTorch, as many threads as wick's kernels use: every
core), the same weights. Browser: ``createEngine(..., {backend: "wasm"})`` against npm
``@huggingface/transformers`` 4.3.1's ``feature-extraction`` pipeline (mean pooling,
normalized) on the same weights exported to ONNX with ``torch.onnx.export``; onnxruntime-web's
wasm from its npm package (the CDN is not used). Each figure is the best of 3 timed calls
after a warm one; each side also reports its cosine to the other's first vectors.

Needs ``pip install sentence-transformers onnx onnxscript`` (bench-only) and, for the browser,
npm (packages fetched into build/bench/ on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from npm_packages import isolated_static, npm_package  # (bench/: the script's directory is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "all-minilm-l6-v2"
SIZES = (1, 32, 256)
TJS = "@huggingface/transformers@4.3.1"
ORT = "onnxruntime-web@1.31.0-dev.20260914-8d85527a0"  # (the one transformers.js 4.3.1 bundles)
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin",
             "Cross-Origin-Embedder-Policy": "require-corp"}
PAGE = "/__bench_embed__.html"
WORDS = ("the old lighthouse keeper climbed stairs every night to light lamp while storms "
         "rolled across bay and ships passed safely beyond rocks near harbor town where "
         "children watched waves crash against stone walls under grey winter skies").split()


def sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct sentences of 15-19 words (about 20 tokens with [CLS] and [SEP])."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 19))).capitalize() + "."
            for _ in range(count)]


def best_rate(run, count: int, repeats: int = 3) -> float:
    run()  # warm
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return count / best


def cosines(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def bench_native(path: Path, threads: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    from wick.server.local import Engine

    torch.set_num_threads(threads)
    st = SentenceTransformer(str(path), device="cpu")
    out: dict = {"threads": threads, "rows": {n: {} for n in SIZES}}
    probe = sentences(8, seed=1)
    ref = st.encode(probe)
    # the peer first, alone: wick's kernel threads do not exist yet (a thread pool of one
    # spinning beside the other's would slow it)
    for n in SIZES:
        texts = sentences(n)
        out["rows"][n]["sentence-transformers"] = best_rate(lambda: st.encode(texts), n)
    for q in ("q0f32", "q8f32_1"):
        engine = Engine(MODEL, quantization=q, device="cpu")
        got = [d.embedding for d in engine.embeddings.create(input=probe).data]
        out[f"cos_{q}"] = cosines(got, ref)
        for n in SIZES:
            texts = sentences(n)
            out["rows"][n][f"wick {q}"] = best_rate(
                lambda: engine.embeddings.create(input=texts), n)
        del engine
    for n, row in out["rows"].items():
        print(f"native, {n} inputs: " + ", ".join(f"{k} {v:.1f}/s" for k, v in row.items()),
              flush=True)
    return out


# ------------------------------------------------------------------------- the browser


def onnx_model(path: Path) -> Path:
    """The model as transformers.js reads it: config, tokenizer files and onnx/model.onnx
    (exported once from the same safetensors, fp32)."""
    import shutil

    import torch
    from transformers import AutoModel

    out = ROOT / "build" / "bench" / "tjs-models" / MODEL
    onnx = out / "onnx" / "model.onnx"
    if onnx.is_file():
        return out.parent
    (out / "onnx").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.txt"):
        if (path / name).is_file():
            shutil.copy(path / name, out / name)
    bert = AutoModel.from_pretrained(path).eval()

    class Wrapped(torch.nn.Module):  # (the three inputs by name: forward's order varies)
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    model = Wrapped().eval()
    ids = torch.ones((2, 8), dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    print("exporting the model to ONNX (torch.onnx.export)", flush=True)
    with torch.no_grad():
        torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(onnx),
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return out.parent


WICK_RUN = """async ([model, quantization, sizes, texts, probe]) => {
  const wick = await import('/static/wick.js');
  const engine = await wick.createEngine(model, {quantization, backend: "wasm"});
  const rates = {};
  for (const n of sizes) {
    const input = texts.slice(0, n);
    await engine.embeddings.create({input});
    let best = Infinity;
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      await engine.embeddings.create({input});
      best = Math.min(best, performance.now() - t0);
    }
    rates[n] = n / (best / 1000);
  }
  const vectors = (await engine.embeddings.create({input: probe})).data.map((d) => d.embedding);
  const threads = engine.info.threads;
  await engine.unload();
  return {rates, vectors, threads, isolated: crossOriginIsolated};
}"""

TJS_RUN = """async ([sizes, texts, probe, threads]) => {
  const t = await import('/__bench__/tjs/dist/transformers.js');
  t.env.allowRemoteModels = false;
  t.env.allowLocalModels = true;
  t.env.localModelPath = '/__bench__/models/';
  t.env.useBrowserCache = false;
  t.env.backends.onnx.wasm.wasmPaths = location.origin + '/__bench__/ort/dist/';
  t.env.backends.onnx.wasm.numThreads = threads;
  const extract = await t.pipeline('feature-extraction', 'all-minilm-l6-v2',
                                   {device: 'wasm', dtype: 'fp32'});
  const run = (input) => extract(input, {pooling: 'mean', normalize: true});
  const rates = {};
  for (const n of sizes) {
    const input = texts.slice(0, n);
    await run(input);
    let best = Infinity;
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      await run(input);
      best = Math.min(best, performance.now() - t0);
    }
    rates[n] = n / (best / 1000);
  }
  const vectors = (await run(probe)).tolist();
  return {rates, vectors, threads: t.env.backends.onnx.wasm.numThreads};
}"""


def bench_browser(path: Path, artifact: Path) -> dict:
    from playwright.sync_api import sync_playwright
    from starlette.routing import Mount

    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    served = ROOT / "build" / "bench" / "embed-served"
    served.mkdir(parents=True, exist_ok=True)
    for name, target in (("tjs", npm_package(TJS, "transformers-js")),
                         ("ort", npm_package(ORT, "onnxruntime-web")),
                         ("models", onnx_model(path))):
        link = served / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    host = ArtifactHost()
    host.add(artifact)
    app = create_app(ModelPool(state="ready"), artifacts=host)
    app.router.routes.insert(0, Mount("/__bench__", isolated_static(str(served))))
    live = ServerThread(app)
    html = "<!doctype html><meta charset=utf-8><title>wick embeddings bench</title>"
    texts, probe = sentences(max(SIZES)), sentences(8, seed=1)
    cores = os.cpu_count() or 1
    out: dict = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            for threads in sorted({1, cores}):
                ctx = browser.new_context()
                page = ctx.new_page()
                headers = ISOLATION if threads > 1 else {}

                def serve_page(route, headers=headers):  # (playwright passes one argument)
                    route.fulfill(body=html, content_type="text/html", headers=headers)

                page.route(live.url + PAGE, lambda route: serve_page(route))
                page.goto(live.url + PAGE)
                page.set_default_timeout(300_000)
                try:
                    ours = page.evaluate(WICK_RUN, [MODEL, "q0f32", list(SIZES), texts, probe])
                    theirs = page.evaluate(TJS_RUN, [list(SIZES), texts, probe, threads])
                except Exception as err:  # noqa: BLE001 - reported, the other runs go on
                    print(f"browser, {threads} thread(s): failed: {str(err)[:300]}", flush=True)
                    ctx.close()
                    continue
                out[threads] = {"wick": ours, "transformers.js": theirs,
                                "cos": cosines(ours["vectors"], theirs["vectors"])}
                for n in SIZES:
                    print(f"browser, {threads} thread(s), {n} inputs: wick "
                          f"{ours['rates'][str(n)]:.1f}/s, transformers.js "
                          f"{theirs['rates'][str(n)]:.1f}/s", flush=True)
                ctx.close()
            browser.close()
    finally:
        live.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--browser", action="store_true", help="also Chromium (wasm)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="PyTorch threads natively (default: every core, as wick's)")
    args = parser.parse_args()
    from wick.compiler.compile import compile_model
    from wick.compiler.sources import resolve_source

    path = resolve_source(MODEL).path
    native = bench_native(path, args.threads)
    browser = bench_browser(path, compile_model(MODEL, "q0f32")) if args.browser else {}
    cpu = " ".join(open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0]
                   .split(":")[1].split()) if Path("/proc/cpuinfo").is_file() else "?"
    print(f"\nall-MiniLM-L6-v2, sentences/s ({cpu}, {os.cpu_count()} cores; ~20 tokens each)")
    print(f"native ({native['threads']} threads)        " + "".join(f"{n:>10}" for n in SIZES))
    st = native["rows"]
    for key in ("wick q0f32", "wick q8f32_1", "sentence-transformers"):
        print(f"  {key:<28}" + "".join(f"{st[n][key]:>10.1f}" for n in SIZES))
    print("  wick q0f32 / s-t              " + "".join(
        f"{st[n]['wick q0f32'] / st[n]['sentence-transformers']:>9.2f}x" for n in SIZES))
    print(f"  cosine to sentence-transformers: q0f32 {native['cos_q0f32']:.6f}, "
          f"q8f32_1 {native['cos_q8f32_1']:.6f}")
    for threads, r in browser.items():
        ours, theirs = r["wick"]["rates"], r["transformers.js"]["rates"]
        print(f"Chromium wasm, {threads} thread(s) (wick {r['wick']['threads']})")
        print(f"  {'wick':<28}" + "".join(f"{ours[str(n)]:>10.1f}" for n in SIZES))
        print(f"  {'transformers.js':<28}" + "".join(f"{theirs[str(n)]:>10.1f}" for n in SIZES))
        print("  wick / transformers.js        " + "".join(
            f"{ours[str(n)] / theirs[str(n)]:>9.2f}x" for n in SIZES))
        print(f"  cosine wick to transformers.js: {r['cos']:.6f}")
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "embeddings.json").write_text(json.dumps(
        {"native": native, "browser": {str(k): {**v, "wick": {**v["wick"], "vectors": None},
                                                "transformers.js": {**v["transformers.js"],
                                                                    "vectors": None}}
                                       for k, v in browser.items()}}, indent=1))


if __name__ == "__main__":
    main()
