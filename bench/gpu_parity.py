"""Greedy parity of the GPU backends against lavapipe, for a GPU machine that has no lavapipe.

    python bench/gpu_parity.py record [--artifacts build/gpu/parity]   # here: the references
    python bench/gpu_parity.py check [--backends cuda vulkan]          # on the GPU machine

``record`` builds the artifacts (the tests' tiny random Llama in q0f32 and q4f16_1, and
SmolLM2-135M's shapes with synthetic weights in q0f32 and q4f16_1: its real weights are more than
one run may carry to that machine), runs each on lavapipe (``--device vulkan``) and writes what
it computed beside it: the greedy tokens of two prompts decoded together, and the last-position
logits of the first prompt's prefill. ``check`` runs the same on each backend and compares:
tokens must match, and logits within 1e-3 (f32) or 3e-2 (f16) of their largest magnitude; and
on each backend the first prompt decoded alone must give the same logprobs, bit for bit, as
decoded beside the second (batch invariance: the decode and decode1 plans agree).
Prints one line per artifact and backend; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from gpu import import_wick_from_tree  # noqa: E402

PROMPTS = [[(5 * i + 1) % 251 for i in range(7)], [(11 * i + 2) % 251 for i in range(40)]]
TOKENS = 16
EXPECTED = "parity-expected.json"


def build_artifacts(out: Path) -> list[Path]:
    from tests.tiny_models import make_tiny_llama
    from wick.compiler.compile import compile_model
    from wick.compiler.synthetic import compile_synthetic

    options = {"prefill_chunk_size": 64, "max_batch_size": 4}
    tiny = make_tiny_llama(out / "src-tiny-llama")
    arts = [compile_model(str(tiny), q, output=out / f"tiny-llama-{q}", **options)
            for q in ("q0f32", "q4f16_1")]
    config = ROOT / "bench/configs/smollm2-135m.json"
    arts += [compile_synthetic(config, q, output=out / f"smollm2-135m-synthetic-{q}", **options)
             for q in ("q0f32", "q4f16_1")]
    return arts


def compute(art: Path, device: str) -> dict:
    from wick.server.local import build_core

    core = build_core(str(art), device=device, kv_cache_bytes=64 << 20)
    tokens, logprobs = decode(core, PROMPTS)
    alone = decode(core, PROMPTS[:1])[1][0]
    logits = prefill_logits(core.runner, PROMPTS[0])
    return {"device": core.runner.backend.name, "tokens": tokens,
            "logits": base64.b64encode(array("f", logits).tobytes()).decode(),
            # the first prompt's logprobs decoded beside the second (the decode plan) and
            # alone (decode1): equal bit for bit where the kernels are batch-invariant
            "batch_invariant": logprobs[0] == alone}


def decode(core, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy tokens of ``prompts`` decoded together, and each token's logprob."""
    from wick.engine.sequence import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, stop_token_ids=(),
                            logprobs=True)
    rids = [core.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {r: [] for r in rids}
    logprobs: dict[str, list[float]] = {r: [] for r in rids}
    while core.has_unfinished():
        for out in core.step():
            tokens[out.request_id] += out.token_ids
            logprobs[out.request_id] += [t.logprob for t in out.logprobs]
    return [tokens[r] for r in rids], [logprobs[r] for r in rids]


def prefill_logits(runner, ids: list[int]) -> list[float]:
    """The last position's logits of ``ids`` prefilled as one step (Runner.read_logits)."""
    from wick.engine.batch import Batch
    from wick.engine.kv_cache import kv_cache_for

    kv = kv_cache_for(runner.page_size, runner.num_pages, window_pool=runner.window_pool,
                      num_window_pages=runner.num_window_pages)
    kv.allocate(0, len(ids))
    (row,) = runner.read_logits(Batch([0], list(ids), kv.index_for([(0, 0, len(ids))])))
    return [float(x) for x in row]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["record", "check"])
    p.add_argument("--artifacts", default=str(ROOT / "build/gpu/parity"))
    p.add_argument("--backends", nargs="+", default=["cuda", "vulkan"])
    p.add_argument("--reference", default="vulkan", help="record's device (lavapipe here)")
    args = p.parse_args(argv)
    import_wick_from_tree()
    root = Path(args.artifacts)
    if args.mode == "record":
        for art in build_artifacts(root):
            ref = compute(art, args.reference)
            (art / EXPECTED).write_text(json.dumps(ref))
            print(f"{art.name}: {ref['device']}: {ref['tokens']}")
        return 0
    failed = False
    for art in sorted(a for a in root.iterdir() if (a / EXPECTED).is_file()):
        ref = json.loads((art / EXPECTED).read_text())
        want = array("f", base64.b64decode(ref["logits"]))
        f16 = "f16" in art.name
        for device in args.backends:
            try:
                got = compute(art, device)
            except Exception as e:
                print(f"{art.name} on {device}: not run ({type(e).__name__}: {e})")
                failed = True
                continue
            have = array("f", base64.b64decode(got["logits"]))
            scale = max(1.0, max(abs(x) for x in want))
            delta = max(abs(a - b) for a, b in zip(have, want)) / scale
            same = got["tokens"] == ref["tokens"]
            ok = same and delta < (3e-2 if f16 else 1e-3) and got["batch_invariant"]
            failed |= not ok
            print(f"{art.name} on {got['device']}: tokens {'equal' if same else 'DIFFER'} "
                  f"to {ref['device']}'s, logits max |d| {delta:.2e} of their scale, "
                  f"logprobs alone {'equal' if got['batch_invariant'] else 'DIFFER'} to "
                  f"beside another prompt{'' if ok else '  <- MISMATCH'}")
            if not same:
                print(f"  got  {got['tokens']}\n  want {ref['tokens']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
