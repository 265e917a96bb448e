"""Decode benchmark: wick on the native wgpu backend vs transformers on the CPU, same weights.

    python bench/decode.py [--model smollm2-135m-instruct] [--quantization q4f16_1]
                           [--tokens 32] [--prompt-tokens 128] [--batch 8] [--skip-transformers]

wick: a ~128-token prompt, then ``--tokens`` greedy tokens with EOS ignored, at batch 1 and at
batch 8 (8 requests added to the engine core together, so their decodes share steps). Each step
is driven by hand (``begin_step`` -> ``runner.step`` -> ``finish_step``) to see its batch: a
step whose sequences all bring one new token is a decode step. Per decode step, the host time is
split into engine (schedule + postprocess: ``stats.last_step_host_ms``), plan (the runner
building inputs and dispatch lists) and backend (encode + submit + wait + read back).

transformers: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` (the GGUF dequantized
to float32), greedy ``generate`` of the same length from the same token ids; a logits processor
timestamps every step, so prefill and decode are split inside the one ``generate`` call.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based inks and a wooden press adapted from wine making. "
    "Books that had taken scribes months to copy could now be produced in days, and the price of "
    "knowledge fell sharply across Europe. Universities, merchants and reformers all found new "
    "uses for the printed page, from pamphlets and maps to calendars and scientific journals. "
    "Write a short summary of why this mattered, and list three consequences for ordinary people."
)


@dataclass(slots=True)
class Run:
    """One measured configuration (a batch size) of one engine."""

    batch: int
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    step_ms: dict[str, list[float]] = field(default_factory=dict)  # part -> per decode step
    first_ids: list[int] = field(default_factory=list)  # sequence 0's output tokens

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0

    def mean_ms(self, part: str) -> float:
        values = self.step_ms.get(part, [])
        return sum(values) / len(values) if values else 0.0


# ------------------------------------------------------------------------------------ wick


def wick_run(core, prompt: list[int], tokens: int, batch: int) -> Run:
    from wick.engine.sequence import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, stop_token_ids=())  # ignore EOS
    rids = [core.add_request(prompt, params) for _ in range(batch)]
    run = Run(batch, step_ms={"engine": [], "plan": [], "backend": [], "runner": []})
    while core.has_unfinished():
        t0 = time.perf_counter()
        state = core.begin_step()
        b = state.batch
        sampled = core.runner.step(b) if b is not None else []
        outputs = core.finish_step(state, sampled)
        elapsed = time.perf_counter() - t0
        for out in outputs:
            if out.request_id == rids[0]:
                run.first_ids += out.token_ids
        if b is None:
            continue
        if b.num_tokens > len(b.seq_ids):  # prefill (maybe with decodes riding along)
            run.prefill_tokens += b.num_tokens
            run.prefill_s += elapsed
        elif len(b.seq_ids) == batch:  # a full decode step
            run.decode_tokens += len(b.seq_ids)
            run.decode_s += elapsed
            t = core.runner.timings
            run.step_ms["engine"].append(core.stats.last_step_host_ms)
            run.step_ms["plan"].append(t.plan_ms)
            run.step_ms["backend"].append(t.backend_ms)
            run.step_ms["runner"].append(core.stats.last_step_runner_ms)
    return run


def bench_wick(args, prompt_text: str):
    from wick import Engine
    from wick.server.progress_bars import ProgressBars

    bars = ProgressBars()  # compile (first run only) and weight upload, on stderr
    engine = Engine(args.model, quantization=args.quantization, device=args.device,
                    kv_cache_bytes=args.kv_cache_mib << 20, progress=bars)
    bars.close()
    core = engine.core
    ids = core.prompt_ids(prompt_text)
    prompt = (ids * (args.prompt_tokens // len(ids) + 1))[: args.prompt_tokens]
    for b in sorted({1, args.batch}):  # warm up: first dispatches of each shape
        wick_run(core, prompt, 4, b)
    runs = {b: wick_run(core, prompt, args.tokens, b) for b in (1, args.batch)}
    return engine, prompt, runs


# ------------------------------------------------------------------------------------ transformers


def gguf_path(model: str) -> Path:
    from wick.compiler.sources import resolve_source

    source = resolve_source(model)
    if source.kind != "gguf":
        raise SystemExit(f"--skip-transformers: {model} is not a GGUF model")
    return source.path


def bench_transformers(args, prompt: list[int]) -> dict[int, Run]:
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    path = gguf_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    model.eval()

    class Clock(LogitsProcessor):  # called once per generated token, right after its forward
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    def generate(batch: int, tokens: int) -> Run:
        ids = torch.tensor([prompt] * batch)
        clock = Clock()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0,
                logits_processor=LogitsProcessorList([clock]),
            )
        run = Run(batch, first_ids=out[0, len(prompt):].tolist())
        run.prefill_tokens, run.prefill_s = batch * len(prompt), clock.times[0] - t0
        run.decode_tokens = batch * (len(clock.times) - 1)
        run.decode_s = clock.times[-1] - clock.times[0]
        return run

    generate(1, 4)  # warm up
    return {b: generate(b, args.tokens) for b in (1, args.batch)}


# ------------------------------------------------------------------------------------ report


def matching_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def report(args, engine, prompt, wick_runs, hf_runs) -> None:
    info = engine.core.info
    b = args.batch
    print(f"\nwick {info.model_id} {info.quantization} on {engine.device_name}")
    print(f"prompt {len(prompt)} tokens, {args.tokens} new tokens (greedy, EOS ignored); "
          f"transformers {'skipped' if hf_runs is None else 'float32 on CPU, '}"
          + ("" if hf_runs is None else f"{os.cpu_count()} cores"))
    rows = [
        ("prefill tok/s (batch 1)", wick_runs[1].prefill_tps, hf_runs and hf_runs[1].prefill_tps),
        (f"prefill tok/s (batch {b})", wick_runs[b].prefill_tps,
         hf_runs and hf_runs[b].prefill_tps),
        ("decode tok/s (batch 1)", wick_runs[1].decode_tps, hf_runs and hf_runs[1].decode_tps),
        (f"decode tok/s (batch {b})", wick_runs[b].decode_tps, hf_runs and hf_runs[b].decode_tps),
    ]
    print(f"\n{'':<26}{'wick':>10}{'transformers':>14}{'wick/hf':>9}")
    for name, ours, theirs in rows:
        if theirs:
            print(f"{name:<26}{ours:>10.1f}{theirs:>14.1f}{ours / theirs:>8.2f}x")
        else:
            print(f"{name:<26}{ours:>10.1f}{'-':>14}{'-':>9}")
    print(f"\nwick host ms per decode step{'':<2}{'engine':>8}{'plan':>8}{'backend':>9}"
          f"{'runner':>8}{'step':>8}")
    for batch, run in wick_runs.items():
        n = len(run.step_ms["engine"])
        step = run.decode_s / n * 1e3 if n else 0.0
        print(f"  batch {batch:<2} ({n:>3} steps){'':<9}{run.mean_ms('engine'):>8.2f}"
              f"{run.mean_ms('plan'):>8.2f}{run.mean_ms('backend'):>9.2f}"
              f"{run.mean_ms('runner'):>8.2f}{step:>8.2f}")
    print("  (engine = schedule + postprocess; plan = runner inputs + dispatch lists; "
          "backend = encode + submit + wait + read back)")
    if hf_runs is not None:
        same = matching_prefix(wick_runs[1].first_ids, hf_runs[1].first_ids)
        print(f"\ngreedy tokens equal to transformers' for the first {same}/{args.tokens} "
              f"(batch 1; {info.quantization} vs float32 may diverge later)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quantization", help="default: q4f16_1 with shader-f16, else q4f32_1")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu", "vulkan"))
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per sequence")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="the concurrent batch size")
    parser.add_argument("--kv-cache-mib", type=int, default=256)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args(argv)
    if args.tokens < 2:
        parser.error("--tokens must be >= 2 (one token comes from prefill)")

    engine, prompt, wick_runs = bench_wick(args, PROMPT)
    hf_runs = None if args.skip_transformers else bench_transformers(args, prompt)
    report(args, engine, prompt, wick_runs, hf_runs)


if __name__ == "__main__":
    main()
