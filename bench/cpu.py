"""CPU benchmark: wick's CPU backend vs llama.cpp on the same GGUF file, same threads.

    python bench/cpu.py [--model smollm2-135m-instruct] [--quantization q4f32_1]
                        [--tokens 32] [--prompt-tokens 128] [--batch 8] [--threads N]
                        [--browser [--browser-threads N] [--skip-native]]

Needs PyPI ``llama-cpp-python`` (it builds llama.cpp from source: ``pip install
llama-cpp-python``, a few minutes). Both engines get the same prompt token ids (wick's
tokenizer), ``--threads`` threads (default: every core this process may use), greedy decoding
with EOS ignored:

* prefill tok/s: the ``--prompt-tokens`` prompt in one step (batch 1), and ``--batch`` copies;
* decode tok/s at batch 1 and at ``--batch`` sequences decoding together (one step = one new
  token for each).

wick runs the model's artifact on ``--device cpu`` (the CPU kernel set) in ``--quantization``
(default q4f32_1: SmolLM2's GGUF is Q4_1, whose blocks q4f32_1 reproduces, docs/quantization.md);
llama.cpp runs the GGUF as it is. ``--browser`` adds the browser half: wick's WebAssembly
kernels vs wllama in the same Chromium (bench/cpu_browser.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import PROMPT, Run, bench_wick, gguf_path, matching_prefix  # noqa: E402


_quiet_log = None


def bench_llama_cpp(path: Path, prompt: list[int], tokens: int, batch: int,
                    threads: int) -> dict[int, Run]:
    """Prefill and greedy decode through llama.cpp's own batch API (llama_decode with one
    sequence id per stream), the way its server batches concurrent requests."""
    import ctypes

    import llama_cpp as L
    import numpy as np

    global _quiet_log  # (kept alive: llama.cpp calls it for every log line)
    _quiet_log = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(_quiet_log, ctypes.c_void_p(0))
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    cparams = L.llama_context_default_params()
    cparams.n_ctx = batch * (len(prompt) + tokens + 16)
    cparams.n_batch = cparams.n_ubatch = max(512, batch * len(prompt))
    cparams.n_seq_max = batch
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cparams)
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    lbatch = L.llama_batch_init(cparams.n_batch, 0, batch)

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence, wants logits)."""
        lbatch.n_tokens = len(entries)
        for i, (tok, pos, seq, out) in enumerate(entries):
            lbatch.token[i], lbatch.pos[i] = tok, pos
            lbatch.n_seq_id[i] = 1
            lbatch.seq_id[i][0] = seq
            lbatch.logits[i] = out
        if L.llama_decode(ctx, lbatch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(i: int) -> int:
        ptr = L.llama_get_logits_ith(ctx, i)
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                         shape=(vocab,)).argmax())

    def run(b: int, n_new: int) -> Run:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        r = Run(b)
        t0 = time.perf_counter()
        entries = [(tok, p, s, p == len(prompt) - 1) for s in range(b)
                   for p, tok in enumerate(prompt)]
        decode(entries)
        last = [argmax(s * len(prompt) + len(prompt) - 1) for s in range(b)]
        r.prefill_tokens, r.prefill_s = b * len(prompt), time.perf_counter() - t0
        r.first_ids.append(last[0])
        t0 = time.perf_counter()
        for step in range(n_new - 1):
            decode([(last[s], len(prompt) + step, s, True) for s in range(b)])
            last = [argmax(s) for s in range(b)]
            r.first_ids.append(last[0])
        r.decode_tokens, r.decode_s = b * (n_new - 1), time.perf_counter() - t0
        return r

    try:
        run(1, 4)  # warm up
        return {b: run(b, tokens) for b in sorted({1, batch})}
    finally:
        L.llama_batch_free(lbatch)
        L.llama_free(ctx)
        L.llama_model_free(model)


def main(argv: list[str] | None = None) -> None:
    from wick.native.cpu_backend import default_threads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quantization", default="q4f32_1")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per sequence")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--kv-cache-mib", type=int, default=256)
    parser.add_argument("--browser", action="store_true",
                        help="also wick's WebAssembly kernels vs wllama in Chromium")
    parser.add_argument("--browser-threads", type=int, default=None,
                        help="threads in the browser (default: --threads)")
    parser.add_argument("--skip-native", action="store_true", help="(with --browser)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the native table as JSON (e.g. bench/results/cpu.json)")
    args = parser.parse_args(argv)
    if args.browser:
        browser_half(args)
        if args.skip_native:
            return
    args.device = "cpu"
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("llama.cpp is the peer here: pip install llama-cpp-python") from None

    engine, prompt, ours = bench_wick(args, PROMPT)
    theirs = bench_llama_cpp(gguf_path(args.model), prompt, args.tokens, args.batch,
                             args.threads)
    b = args.batch
    info = engine.core.info
    print(f"\nwick {info.model_id} {info.quantization} on {engine.device_name}; llama.cpp "
          f"{gguf_path(args.model).name}, {args.threads} threads")
    print(f"prompt {len(prompt)} tokens, {args.tokens} new tokens per sequence (greedy, EOS "
          "ignored)\n")
    print(f"{'':<26}{'wick':>10}{'llama.cpp':>12}{'wick/llama.cpp':>16}")
    rows = [("prefill tok/s (batch 1)", "prefill_tps", 1),
            (f"prefill tok/s (batch {b})", "prefill_tps", b),
            ("decode tok/s (batch 1)", "decode_tps", 1),
            (f"decode tok/s (batch {b})", "decode_tps", b)]
    table = {}
    for name, attr, batch in rows:
        ours_v, theirs_v = getattr(ours[batch], attr), getattr(theirs[batch], attr)
        print(f"{name:<26}{ours_v:>10.1f}{theirs_v:>12.1f}{ours_v / theirs_v:>15.2f}x")
        table[name] = {"wick": round(ours_v, 1), "llama.cpp": round(theirs_v, 1),
                       "ratio": round(ours_v / theirs_v, 3)}
    same = matching_prefix(ours[1].first_ids, theirs[1].first_ids)
    print(f"\ngreedy tokens equal for the first {same}/{args.tokens} (batch 1; llama.cpp's "
          "own kernels round differently, so a late divergence is expected)")
    if args.out is not None:
        import platform
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
        args.out.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "commit": commit, "machine": engine.device_name,
            "python": platform.python_version(), "model": info.model_id,
            "quantization": info.quantization, "peer": gguf_path(args.model).name,
            "threads": args.threads, "prompt_tokens": len(prompt), "new_tokens": args.tokens,
            "rows": table, "greedy_tokens_equal": same}, indent=1) + "\n")


def browser_half(args) -> None:
    from cpu_browser import bench_browser, print_table

    from wick.compiler.compile import compile_model
    from wick.server.progress_bars import ProgressBars

    bars = ProgressBars()
    artifact = compile_model(args.model, args.quantization, progress=bars)
    bars.close()
    import json

    from tokenizers import Tokenizer

    manifest = json.loads((Path(artifact) / "wick-artifact.json").read_text())
    tok = Tokenizer.from_file(str(Path(artifact) / manifest["tokenizer"]["file"]))
    ids = tok.encode(PROMPT, add_special_tokens=False).ids
    text = tok.decode((ids * (args.prompt_tokens // len(ids) + 1))[: args.prompt_tokens])
    # (the engine names a model by its artifact's id: a GGUF path's file stem)
    ours, theirs = bench_browser(Path(artifact), manifest["model_id"], gguf_path(args.model), text,
                                 args.tokens, args.batch, args.browser_threads or args.threads)
    print_table(ours, theirs, args.batch)


if __name__ == "__main__":
    main()
