"""Decode speed of a model's variants side by side, on one backend, in one process.

    python bench/variants.py [--model smollm2-135m-instruct] [--quantizations q4f32_1,q4f32_m]
                             [--device cpu] [--tokens 64] [--prompt-tokens 128] [--batch 1]
                             [--rounds 3]

Each variant (compiled when needed) decodes ``--tokens`` greedy tokens after the same prompt,
rounds alternating between variants so that the VM's drift falls on all of them alike; prints
the best decode tok/s of each and its ratio to the first variant (issue #30's goal: a `_m`
variant within 15 % of `q4*_1`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode import PROMPT, wick_run  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    from wick.native.devices import create_backend
    from wick.server.local import build_core

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quantizations", default="q4f32_1,q4f32_m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    names = args.quantizations.split(",")
    backend = create_backend(args.device)
    cores = {q: build_core(args.model, quantization=q, backend=backend,
                           kv_cache_bytes=256 << 20) for q in names}
    ids = cores[names[0]].prompt_ids(PROMPT)
    prompt = (ids * (args.prompt_tokens // len(ids) + 1))[: args.prompt_tokens]
    for core in cores.values():  # warm up
        wick_run(core, prompt, 4, args.batch)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for q, core in cores.items():
            best[q] = max(best.get(q, 0.0), wick_run(core, prompt, args.tokens,
                                                     args.batch).decode_tps)
    print(f"{args.model} on {backend.name}: batch {args.batch}, prompt {len(prompt)}, "
          f"{args.tokens} new tokens, best of {args.rounds} rounds")
    for q in names:
        print(f"{q:10} {best[q]:8.1f} tok/s  {best[q] / best[names[0]]:.2f}x")


if __name__ == "__main__":
    main()
