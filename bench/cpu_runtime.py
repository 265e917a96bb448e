"""wick's kernel runtime vs TVM's runtime, running the same CPU kernels.

    python bench/cpu_runtime.py [--model smollm2-135m-instruct] [--quantization q4f32_1]
                                [--tokens 64] [--prompt-tokens 128] [--batch 8] [--threads N]
                                [--rounds 3]

The CPU backend (native/cpu_backend.py) loads an artifact's ``kernels.so`` with ctypes and runs
it on the runtime linked into it (compiler/kernel_runtime.c: thread pool, scratch memory).
Before, TVM's runtime loaded the same library and ran its parallel loops on TVM's thread pool.
This runs both on the same artifact (the peer: TVM's loader fills the library's runtime slots
with its own functions, and calls go through TVM's FFI), alternating rounds, and prints prefill
and decode tok/s per side, the ratio, and whether the greedy tokens agree. Needs apache-tvm
(the compile extra) for the peer side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode import PROMPT, wick_run  # noqa: E402


def tvm_runtime_backend(threads: int):
    """The CPU backend with TVM's runtime under the same kernels (the way wick ran them
    before the kernel runtime)."""
    import tvm
    import tvm_ffi

    from wick.native.cpu_backend import CpuBackend

    class TvmRuntimeBackend(CpuBackend):
        def __init__(self, threads: int) -> None:
            super().__init__(threads)
            tvm.get_global_func("runtime.config_threadpool")(1, self.threads)
            self._views: dict = {}
            self.name += " [TVM runtime]"

        def load_library(self, entry: dict, path: str, data: bytes) -> int:
            lib = tvm.runtime.module._load_module(path)
            base = len(self._functions)
            self._functions += [(lib[name], lib, name) for name in entry["functions"]]
            self._libraries.append(lib)
            return base

        def _view(self, t):
            v = self._views.get(t)
            if v is None:
                arr = self._arrays[t.buffer][t.offset:t.offset + t.nbytes]
                typed = arr.view("bool" if t.dtype == "bool" else t.dtype).reshape(t.shape)
                v = self._views[t] = tvm_ffi.from_dlpack(typed, require_alignment=0)
            return v

        def run(self, writes, dispatches, reads, step=None):
            for w in writes:
                self.write(w.buffer, w.offset, w.data)
            for call in dispatches:
                self._functions[call.function][0](*[self._view(t) for t in call.args])
            return [self._arrays[r.buffer][r.offset:r.offset + r.size].tobytes() for r in reads]

    return TvmRuntimeBackend(threads)


def main(argv: list[str] | None = None) -> None:
    from wick.native.cpu_backend import CpuBackend, default_threads
    from wick.server.local import build_core

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quantization", default="q4f32_1")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    sides = {"wick runtime": CpuBackend(args.threads),
             "TVM runtime": tvm_runtime_backend(args.threads)}
    cores = {name: build_core(args.model, quantization=args.quantization, backend=backend,
                              kv_cache_bytes=256 << 20) for name, backend in sides.items()}
    core = next(iter(cores.values()))
    ids = core.prompt_ids(PROMPT)
    prompt = (ids * (args.prompt_tokens // len(ids) + 1))[: args.prompt_tokens]
    for c in cores.values():  # warm up each shape
        for b in sorted({1, args.batch}):
            wick_run(c, prompt, 4, b)
    best: dict[tuple[str, int], tuple[float, float, list[int]]] = {}
    for _ in range(args.rounds):
        for name, c in cores.items():
            for b in sorted({1, args.batch}):
                run = wick_run(c, prompt, args.tokens, b)
                old = best.get((name, b))
                best[name, b] = (max(run.prefill_tps, old[0] if old else 0.0),
                                 max(run.decode_tps, old[1] if old else 0.0), run.first_ids)
    print(f"{args.model} {args.quantization}, {args.threads} threads, prompt "
          f"{len(prompt)} tokens, {args.tokens} new, best of {args.rounds} rounds")
    print(f"{'':14}{'batch':>6}{'prefill tok/s':>15}{'decode tok/s':>14}")
    for b in sorted({1, args.batch}):
        for name in cores:
            prefill, decode, _ = best[name, b]
            print(f"{name:14}{b:>6}{prefill:>15.1f}{decode:>14.1f}")
        (p1, d1, t1), (p2, d2, t2) = best["wick runtime", b], best["TVM runtime", b]
        print(f"{'ratio':14}{b:>6}{p1 / p2:>14.2f}x{d1 / d2:>13.2f}x"
              f"   greedy tokens equal: {t1 == t2}")


if __name__ == "__main__":
    main()
