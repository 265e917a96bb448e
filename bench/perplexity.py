"""Perplexity of quantized variants over the King James Bible, wick (native) beside transformers:

    python bench/perplexity.py                                   # gemma-3-270m: q0f32 q8f32_1 q4f32_1
    python bench/perplexity.py --model qwen2.5-coder-0.5b-instruct --quantization q0f32 q4f16_1
    python bench/perplexity.py --passages 4 --tokens 64 --text my.txt

The text: ``--passages`` passages spread evenly through the corpus (40 verses from every
1/passages of it), each cut to its first ``--tokens`` tokens (BOS included). The corpus is
Debian's ``bible-kjv-text`` (public domain), fetched with ``apt-get download`` into
``$WICK_HOME/corpora`` and printed by the package's own ``bible`` program; ``--text FILE``
takes any text instead (one passage per non-empty line group).

wick: every variant is compiled (cached like ``wick compile``) and each passage's logits at
every position come from the native engine's prefill plan (the tests' perplexity path). The
reference: transformers on the source's weights (the GGUF dequantized to float32), which the
q0f32 column must match. Printed: perplexity per passage and variant, the ratio to q0f32, and
the perplexity of all passages' tokens together.

Why: a 4-bit bar measured on one famous passage (Genesis 1, which small models have memorized)
could be an artefact of that passage; this measures the corpus at large.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# transformers' GGUF conversion bar is a plain tqdm; tqdm reads this when it is first imported
os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VERSES_PER_PASSAGE = 40
DEBIAN_PACKAGES = ("bible-kjv-text", "bible-kjv")  # the data, and the program that prints it


def kjv_verses(cache: Path) -> list[str]:
    """Every verse of the KJV, in order, from Debian's packages (fetched once)."""
    text = cache / "kjv.txt"
    if not text.is_file():
        for tool in ("apt-get", "dpkg"):
            if shutil.which(tool) is None:
                sys.exit(f"perplexity: the KJV corpus comes from Debian's {DEBIAN_PACKAGES[0]} "
                         f"package, and '{tool}' is not here; pass --text FILE instead")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            got = subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=tmp,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if got.returncode:
                sys.exit(f"perplexity: could not download {' and '.join(DEBIAN_PACKAGES)} "
                         f"({(got.stderr.strip().splitlines() or ['no reason given'])[-1]}); "
                         "pass --text FILE instead")
            root = Path(tmp) / "root"
            for deb in Path(tmp).glob("*.deb"):
                subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
            # (the program cannot open an absolute data path: run it beside the data)
            printed = subprocess.run(
                [str(root / "usr/bin/bible"), "-f", "-d", "bible.data", "Gen1:1-Rev22:21"],
                cwd=root / "usr/lib", check=True, capture_output=True, text=True).stdout
        text.write_text(printed)
    # each line is "Ge1:1 In the beginning ...": drop the reference
    return [re.sub(r"^\S+\s+", "", line.strip()) for line in text.read_text().splitlines()
            if line.strip()]


def passages_of(verses: list[str], count: int) -> list[str]:
    starts = (i * len(verses) // count for i in range(count))
    return [" ".join(verses[s:s + VERSES_PER_PASSAGE]) for s in starts]


def text_passages(path: Path) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", path.read_text()) if p.strip()]


def pooled(nll_and_count: list[tuple[float, int]]) -> float:
    return math.exp(sum(n for n, _ in nll_and_count) / sum(c for _, c in nll_and_count))


def nll(logits, ids) -> tuple[float, int]:
    from tests.e2e.helpers import perplexity

    return math.log(perplexity(logits, ids)) * (len(ids) - 1), len(ids) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--quantization", nargs="+", default=["q0f32", "q8f32_1", "q4f32_1"])
    ap.add_argument("--passages", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--text", type=Path, help="passages separated by blank lines (else the KJV)")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()

    from wick.compiler.paths import wick_home
    from tests.e2e.helpers import all_position_logits, forward_plan_only, load_artifact, make_core
    from wick.compiler.compile import compile_model

    texts = (text_passages(args.text)[:args.passages] if args.text
             else passages_of(kjv_verses(wick_home() / "corpora"), args.passages))
    context = 1 << max(args.tokens - 1, 255).bit_length()
    results: dict[str, list[tuple[float, int]]] = {}
    ids_of: list[list[int]] = []
    for quant in args.quantization:
        t0 = time.perf_counter()
        art = compile_model(args.model, quant, context_window=context)
        model = load_artifact(art).model
        # the test path gives each position its own page table: a step holds max_batch of them
        pages = -(-args.tokens // model["page_size"])
        core = make_core(art, num_pages=model["max_batch_size"] * pages + pages)
        if not ids_of:
            ids_of = [core.prompt_ids(t)[:args.tokens] for t in texts]
        with forward_plan_only(core.runner):
            results[quant] = [nll(all_position_logits(core.runner, ids), ids) for ids in ids_of]
        print(f"wick {quant}: {time.perf_counter() - t0:.0f} s (compile + "
              f"{sum(len(i) for i in ids_of)} positions)", flush=True)
        del core

    if not args.skip_transformers:
        import torch
        from transformers.utils import logging as hf_logging

        from tests.e2e.helpers import hf_logits, load_hf

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        from wick.compiler.sources import resolve_source

        src = resolve_source(args.model).path
        hf = (load_hf(src.parent, gguf_file=src.name) if src.suffix == ".gguf" else load_hf(src))
        results["transformers"] = [nll(hf_logits(hf, ids), ids) for ids in ids_of]

    # ratios against q0f32, else transformers, else the first variant
    base = results.get("q0f32") or results.get("transformers") or next(iter(results.values()))
    names = list(results)
    print(f"\n{args.model}: perplexity of {len(ids_of)} passage(s), "
          f"{sum(len(i) for i in ids_of)} tokens" + ("" if args.text else " of the KJV"))
    print("passage " + "".join(f"{n:>14}" for n in names))
    for i in range(len(ids_of)):
        row = []
        for n in names:
            p = math.exp(results[n][i][0] / results[n][i][1])
            b = math.exp(base[i][0] / base[i][1])
            row.append(f"{p:8.3f} {p / b:4.2f}x")
        print(f"{i:7d} " + "".join(f"{c:>14}" for c in row))
    print("all     " + "".join(
        f"{f'{pooled(results[n]):8.3f} {pooled(results[n]) / pooled(base):4.2f}x':>14}"
        for n in names))


if __name__ == "__main__":
    main()
