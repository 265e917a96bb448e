"""Grammar benchmark: what structured output costs, natively and in wasm.

    python bench/grammar.py [--model smollm2-135m-instruct] [--quantization q4f16_1]
                            [--tokens 24] [--skip-decode] [--skip-wasm]

1. Compile time per JSON schema: cold (a fresh backend) and cached (the engine's cache).
2. Mask time per token along a valid instance of each schema, as the SmolLM2 tokenizer splits
   it: wick's matcher (xgrammar's C++ bindings + the bytes the engine uploads) beside xgrammar's
   own ``fill_next_token_bitmask`` into a numpy row; and the wasm build (web-xgrammar, in Node:
   Chromium's V8) over the same vocabulary and paths.
3. Decode tokens/s with and without a JSON schema on the same prompt at batch 1 and 8 (the
   native engine on this machine's wgpu adapter), and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = {
    "person": ({"type": "object", "properties": {"name": {"type": "string"},
                                                 "age": {"type": "integer"}},
                "required": ["name", "age"]}, {"name": "Ada Lovelace", "age": 36}),
    "nested": ({"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "number"}}}, "required": ["b"]}},
        "required": ["a"]}, {"a": {"b": [1.5, -2, 3e8]}}),
    "enum+pattern": ({"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["color", "zip"]},
        {"color": "green", "zip": "75001"}),
    "defs": ({"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"},
                                                              "y": {"type": "integer"}},
                              "required": ["x", "y"]}},
              "type": "object", "properties": {"from": {"$ref": "#/$defs/p"},
                                               "to": {"$ref": "#/$defs/p"}},
              "required": ["from", "to"]}, {"from": {"x": 0, "y": 1}, "to": {"x": 2, "y": 3}}),
    "list": ({"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["id", "tags"]}},
        [{"id": i, "tags": ["alpha", "beta"]} for i in range(6)]),
}


def median_us(samples: list[float]) -> float:
    return float(np.median(samples)) * 1e6 if samples else 0.0


def bench_native(tokenizer_json: str, vocab_size: int, eos: list[int]) -> dict:
    from tokenizers import Tokenizer

    from wick.engine.grammar import GrammarSpec, VocabInfo
    from wick.native.grammar import XGrammarBackend

    vocab = VocabInfo.from_tokenizer_json(tokenizer_json, vocab_size)
    tok = Tokenizer.from_str(tokenizer_json)
    out = {}
    for name, (schema, example) in SCHEMAS.items():
        spec = GrammarSpec("json_schema", json.dumps(schema))
        backend = XGrammarBackend(vocab, vocab_size, eos)
        t0 = time.perf_counter()
        compiled = backend.compile(spec)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend.compile(spec)
        cached = time.perf_counter() - t0
        path = [*tok.encode(json.dumps(example), add_special_tokens=False).ids, eos[0]]
        # wick's matcher: mask bytes + accept, as the engine does per token
        matcher = compiled.matcher()
        wick_s = []
        for token in path:
            t0 = time.perf_counter()
            matcher.next_token_bitmask()
            wick_s.append(time.perf_counter() - t0)
            assert matcher.accept(token), (name, token)
        # xgrammar's own call into a numpy row (no copy out)
        raw = matcher._m.__class__(compiled._compiled, None, False, -1)
        row = np.zeros((1, (vocab_size + 31) // 32), np.int32)
        own_s = []
        for token in path:
            t0 = time.perf_counter()
            raw.fill_next_token_bitmask(row, 0, False)
            own_s.append(time.perf_counter() - t0)
            raw.accept_token(token, False)
        out[name] = {"tokens": len(path), "compile_cold_ms": cold * 1e3,
                     "compile_cached_ms": cached * 1e3, "wick_us": median_us(wick_s),
                     "xgrammar_us": median_us(own_s), "ebnf": backend.json_ebnf(spec),
                     "path": path}
    return {"vocab": vocab.for_grammar()[:vocab_size], "vocab_type": vocab.vocab_type,
            "prefix": vocab.add_prefix_space, "schemas": out}


WASM_SCRIPT = r"""
const fs = require("fs");
const [lib, dataFile] = process.argv.slice(2);
(async () => {
  const err = console.error; console.error = () => {};
  // the bundle is UMD in a "type": "module" package: give its Node branch what it reaches for
  globalThis.require = require; globalThis.__filename = lib;
  await import(lib);
  const xgr = globalThis.xgrammar;
  const d = JSON.parse(fs.readFileSync(dataFile, "utf8"));
  const types = ["raw", "byte_fallback", "byte_level"];
  const info = await xgr.TokenizerInfo.createTokenizerInfo(d.vocab, types[d.vocab_type], d.prefix,
    d.vocab.length, d.eos);
  const compiler = await xgr.GrammarCompiler.createGrammarCompiler(info);
  const out = {};
  for (const [name, s] of Object.entries(d.schemas)) {
    let t0 = performance.now();
    const compiled = await compiler.compileGrammar(s.ebnf, "root");
    const compileMs = performance.now() - t0;
    const m = await xgr.GrammarMatcher.createGrammarMatcher(compiled);
    const us = [];
    for (const token of s.path) {
      t0 = performance.now();
      await m.getNextTokenBitmask();
      us.push((performance.now() - t0) * 1e3);
      if (!m.acceptToken(token)) throw new Error(`${name}: token ${token} refused`);
    }
    us.sort((a, b) => a - b);
    out[name] = {compile_ms: compileMs, mask_us: us[Math.floor(us.length / 2)]};
  }
  console.error = err;
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { process.stderr.write(String(e)); process.exit(1); });
"""


def bench_wasm(native: dict, eos: list[int]) -> dict | None:
    lib = ROOT / "web" / "node_modules" / "@mlc-ai" / "web-xgrammar" / "lib" / "index.js"
    if shutil.which("node") is None or not lib.is_file():
        print("wasm: skipped (needs node and web/node_modules: bash web/build.sh)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.json"
        data.write_text(json.dumps({
            "vocab": native["vocab"], "vocab_type": native["vocab_type"],
            "prefix": native["prefix"], "eos": eos,
            "schemas": {k: {"ebnf": v["ebnf"], "path": v["path"]}
                        for k, v in native["schemas"].items()}}))
        script = Path(tmp) / "bench.cjs"
        script.write_text(WASM_SCRIPT)
        done = subprocess.run(["node", str(script), str(lib), str(data)], capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            print(f"wasm: failed: {done.stderr.strip()[:300]}")
            return None
        return json.loads(done.stdout)


def bench_decode(engine, tokens: int) -> list[tuple[int, float, float]]:
    """(batch, unconstrained, constrained) decode tokens/s at batch 1 and 8: every step run by
    hand (schedule + grammar masks -> runner -> postprocess), timing the decode steps only
    (every row one new token), so that prefill and the batch's ragged end do not blur them."""
    from wick.engine.grammar import GrammarSpec
    from wick.engine.sequence import SamplingParams

    core = engine.core
    schema = {"type": "object", "properties": {"words": {"type": "array", "items": {
        "type": "string", "maxLength": 12}}}, "required": ["words"]}
    grammar = core.grammar.compile(GrammarSpec("json_schema", json.dumps(schema)))
    ids = core.chat_prompt_ids([{"role": "user",
                                 "content": "List twenty English words as JSON."}])

    def run(batch: int, constrained: bool) -> float:
        params = SamplingParams(temperature=0, max_tokens=tokens,
                                stop_token_ids=core.info.eos_token_ids if constrained else ())
        for _ in range(batch):
            core.add_request(ids, params, grammar=grammar if constrained else None)
        decode_tokens, decode_s = 0, 0.0
        while core.has_unfinished():
            t0 = time.perf_counter()
            state = core.begin_step()
            out = core.runner.step(state.batch) if state.batch is not None else []
            core.finish_step(state, out)
            b = state.batch
            if b is not None and b.num_tokens == len(b.seq_ids) == batch:
                decode_tokens += len(b.sample_rows)
                decode_s += time.perf_counter() - t0
        return decode_tokens / decode_s if decode_s else 0.0

    rows = []
    for batch in (1, 8):
        run(batch, False)  # warm: the plans of this batch size
        rows.append((batch, run(batch, False), run(batch, True)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--quantization", default="q4f16_1")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-wasm", action="store_true")
    args = ap.parse_args()

    from wick.server.local import Engine

    engine = Engine(args.model, quantization=args.quantization)
    info = engine.core.info
    tokenizer_json = engine.core.tokenizer._tok.to_str()
    eos = list(info.eos_token_ids)
    print(f"model {info.model_id} {info.quantization}, vocab {info.vocab_size}, "
          f"device {engine.device_name}")
    native = bench_native(tokenizer_json, info.vocab_size, eos)
    wasm = None if args.skip_wasm else bench_wasm(native, eos)
    print(f"\n{'schema':14} {'tokens':>6} {'compile ms':>10} {'cached ms':>9} "
          f"{'wick us/tok':>11} {'xgrammar us/tok':>15} {'wasm us/tok':>11} {'wasm compile':>12}")
    for name, r in native["schemas"].items():
        w = (wasm or {}).get(name, {})
        print(f"{name:14} {r['tokens']:>6} {r['compile_cold_ms']:>10.2f} "
              f"{r['compile_cached_ms']:>9.4f} {r['wick_us']:>11.1f} {r['xgrammar_us']:>15.1f} "
              f"{w.get('mask_us', float('nan')):>11.1f} {w.get('compile_ms', float('nan')):>12.2f}")
    if not args.skip_decode:
        print(f"\ndecode steps (every row one token), up to {args.tokens} tokens per "
              "sequence, greedy:")
        print(f"{'batch':>5} {'plain tok/s':>12} {'json tok/s':>11} {'ratio':>6}")
        for batch, plain, constrained in bench_decode(engine, args.tokens):
            print(f"{batch:>5} {plain:>12.2f} {constrained:>11.2f} {constrained / plain:>6.3f}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
