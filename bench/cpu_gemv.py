"""The CPU q4 matmul kernel (compiler/cpu_gemv.py) in isolation: a step of many rows with each
task's chunk of weights dequantized once (``dequantized_chunks=True``) against dequantizing per
tile of rows (``False``), on this machine's vector ISA, and whether their outputs are the same
bits. ``--wasm``: instead, the kernel in WebAssembly under node (V8, Chromium's engine), one
thread, the relaxed-SIMD module (fused multiply-adds) against the plain one, and how far apart
their outputs are.

    python bench/cpu_gemv.py [--rows 1 8 16 32 128] [--shapes 3072x576 960x576 576x1536 896x4864]
                             [--wasm]

Threads: TVM_NUM_THREADS (default: every core). Shapes are N x K (outputs x inputs): SmolLM2's
gate/up, qkv and down projections, and Qwen2.5-0.5B's down projection (a K whose chunk of floats
is past ``CHUNK_BYTES``). Prints microseconds per call, the best of 10 rounds of 30 calls
(the two kernels' rounds alternating).
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 128])
    parser.add_argument("--shapes", nargs="+", default=["3072x576", "960x576", "576x1536",
                                                         "896x4864"])
    parser.add_argument("--wasm", action="store_true",
                        help="relaxed against plain WebAssembly SIMD, under node")
    args = parser.parse_args()
    if args.wasm:
        return wasm_main(args)

    import tvm

    from wick.compiler.cpu_gemv import CHUNK_TILES, ISA_TILES, q4_matmul_prim_func
    from wick.compiler.cpu_schedules import vector_isa
    from wick.compiler.quantization import get_quantization, quantize
    from wick.compiler.targets.cpu import cpu_target

    target = cpu_target()
    isa = vector_isa(target)
    print(f"{isa} kernels on {target.attrs.get('mcpu', '?')}, microseconds per call")
    for shape in args.shapes:
        N, K = (int(d) for d in shape.split("x"))
        rng = np.random.default_rng(0)
        packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32),
                                          get_quantization("q4f32_1"))
        libs = {}
        for chunks in (False, True):
            func = q4_matmul_prim_func(N, K, (), isa=isa, dequantized_chunks=chunks)
            libs[chunks] = tvm.tirx.build(
                tvm.IRModule({"f": func.with_attr("global_symbol", "f")}), target=target)
        for rows in args.rows:
            x = rng.standard_normal((rows, K)).astype(np.float32)
            us, out = {False: float("inf"), True: float("inf")}, {}
            for _ in range(2):  # (alternating: the first kernel timed paid for a cold start)
                for chunks, lib in libs.items():
                    tensors = [tvm.runtime.tensor(a) for a in
                               (x, packed, scale, minimum, np.zeros((rows, N), np.float32))]
                    lib["f"](*tensors)
                    timer = lib.time_evaluator("f", tvm.cpu(), number=30, repeat=5)
                    us[chunks] = min(us[chunks], min(timer(*tensors).results) * 1e6)
                    out[chunks] = tensors[-1].numpy()
            same = "same bits" if np.array_equal(out[False], out[True]) else "BITS DIFFER"
            # (below the threshold both run the per-tile loop: their ratio is the noise)
            path = ("" if rows >= CHUNK_TILES[isa] * ISA_TILES[isa][0]
                    else ", both per tile below CHUNK_TILES")
            print(f"{N}x{K}, {rows:4d} rows: per tile {us[False]:8.0f}  chunked "
                  f"{us[True]:8.0f}  ({us[False] / us[True]:.2f}x, {same}{path})", flush=True)


def wasm_main(args) -> None:
    """The one-thread modules of both kinds under node (tests/compiler/wasm_call.py calls a
    kernel ``repeat`` times and says the mean), rounds alternating between them; the best
    round of each."""
    import sys
    import tempfile
    from pathlib import Path

    from wick.compiler.cpu_gemv import q4_matmul_prim_func
    from wick.compiler.quantization import get_quantization, quantize
    from wick.compiler.targets.wasm import build_wasm_libraries

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.compiler.wasm_call import call, node_with_relaxed_simd

    node = node_with_relaxed_simd()
    if node is None:
        sys.exit("error: this node cannot run relaxed SIMD (node 20 or later with "
                 "--experimental-wasm-relaxed-simd, or node 22+)")
    print("q4f32_1 matmul in wasm32 under node, one thread: microseconds per call")
    tmp = Path(tempfile.mkdtemp())
    for shape in args.shapes:
        N, K = (int(d) for d in shape.split("x"))
        rng = np.random.default_rng(0)
        packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32),
                                          get_quantization("q4f32_1"))
        func = q4_matmul_prim_func(N, K, (), isa="wasm")
        modules = {}
        for relaxed in (False, True):
            data, _ = build_wasm_libraries({"f": func}, relaxed=relaxed)[
                "wasm_relaxed" if relaxed else "wasm"]
            modules[relaxed] = tmp / f"{relaxed}.wasm"
            modules[relaxed].write_bytes(data)
        for rows in args.rows:
            x = rng.standard_normal((rows, K)).astype(np.float32)
            arrays = [x, packed, scale, minimum, np.zeros((rows, N), np.float32)]
            us, out = {False: float("inf"), True: float("inf")}, {}
            for _ in range(5):
                for relaxed, module in modules.items():
                    answer, after = call(module, "f", arrays, tmp, node,
                                         repeat=max(3, 3000 // rows))
                    us[relaxed] = min(us[relaxed], answer["ms"] * 1e3)
                    out[relaxed] = after[-1]
            apart = np.abs(out[True] - out[False]).max() / np.abs(out[False]).max()
            print(f"{N}x{K}, {rows:4d} rows: plain {us[False]:8.0f}  relaxed {us[True]:8.0f}  "
                  f"(relaxed {us[False] / us[True]:.2f}x as fast; outputs within "
                  f"{apart:.1e} of the largest)", flush=True)


if __name__ == "__main__":
    main()
