"""The batched decode GEMV on CUDA, schedule by schedule: which one makes a step of b rows cost
close to a step of one (issue #28's verify steps, batched decode)?

    (here, TVM)   python bench/gpu_gemv.py build [--config bench/configs/llama-3-8b.json]
                                          [--quant q4f16_1] [--out build/gpu/gemv]
    (GPU machine) python bench/gpu_gemv.py run [--dir build/gpu/gemv] [--batches 1 2 4 8 16 32 64]
                                          [--json OUT]

A decode step's dequantize-matmul functions (the model's own TIR, from its decode plan: Llama-3-8B
shapes, one layer is enough, every shape is there) are scheduled for CUDA by each candidate rule
(``CANDIDATES``: dlight's LowBatchGEMV padded to 1..16 rows a block, dlight's tiled Matmul, and
compiler/batched_gemv.py's warp GEMV with 1..16 rows a pass, which the decode plans use)
and written as one CUDA source per candidate with its launches (the artifact's format:
compiler/targets/cuda.py). On the GPU each function runs at each batch size on random inputs,
timed with CUDA events (best of a few reps of 20 launches), and its output is compared with
dlight's LowBatchGEMV(4)'s (``lowbatch4``, which passed the parity run). Printed per function and batch
size: microseconds, the weights' GB/s (every weight byte read once: the roofline a batched GEMV
can reach) and the ratio to batch 1; the JSON has every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

# candidate -> dlight rules for the decode plan's functions (compiler/lower.schedule_rules shape);
# "webgpu4" is LowBatchGEMV(4) with the WebGPU target's parameters, lowered for CUDA: what the
# CUDA set ran before dlight's in-place scheduling was noticed (64-thread blocks, no vectors)
# "warpRxO": compiler/batched_gemv.py's schedule, R rows a pass, O outputs a warp
CANDIDATES = ("webgpu4", "lowbatch1", "lowbatch2", "lowbatch4", "lowbatch8", "lowbatch16",
              "matmul", "warp1x4", "warp4x4", "warp8x4", "warp8x2", "warp16x2")
BASELINE = "lowbatch4"  # the reference outputs: dlight's rule, the decode plans' before batched_gemv


def candidate_rules(name: str) -> list:
    from tvm.s_tir import dlight as dl

    from wick.compiler.targets.cuda import SimtMatmul

    tail = [dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    if name == "webgpu4":
        return [dl.gpu.LowBatchGEMV(4)] + tail
    if name.startswith("lowbatch"):
        return [dl.gpu.LowBatchGEMV(int(name.removeprefix("lowbatch")))] + tail
    if name == "matmul":
        return [SimtMatmul()] + tail
    raise ValueError(name)


# --------------------------------------------------------------------------- here: build


def decode_gemv_functions(config: Path, quant_name: str, max_batch: int):
    """The decode plan's dequantize-matmul TIR functions (unscheduled), by name."""
    from tvm import tirx

    from wick.compiler.compile import build_module
    from wick.compiler.lower import relax_passes
    from wick.compiler.targets.webgpu import webgpu_target
    from wick.compiler.models import family_for
    from wick.compiler.models.layers import MAX_BINDING_BYTES
    from wick.compiler.quantization import get_quantization

    hf = json.loads(config.read_text())
    hf["num_hidden_layers"] = 1  # (every layer has the same shapes)
    family = family_for(hf["model_type"])
    cfg = family.Config.from_hf(hf)
    _, modules, _ = build_module(family, cfg, get_quantization(quant_name), MAX_BINDING_BYTES)
    mod = modules[1]
    mod["decode"] = mod["decode"].with_attr("tir_var_upper_bound",
                                            {"b": max_batch, "b1": max_batch + 1})
    target = webgpu_target()
    with target:
        mod = relax_passes(target)(mod)
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and "dequantize" in gv.name_hint
            and "matmul" in gv.name_hint}


def build_candidate(funcs: dict, name: str) -> tuple[bytes, dict]:
    """``funcs`` scheduled by candidate ``name`` for CUDA: the source and its manifest entry."""
    import tvm
    from tvm.s_tir import dlight as dl

    from wick.compiler.targets.cuda import CudaSet, build_cuda_source, cuda_target
    from wick.compiler.targets.webgpu import webgpu_target
    from wick.compiler.tir_lower import host_launches, lower_split

    target = cuda_target()
    if name.startswith("warp"):
        from wick.compiler.batched_gemv import batched_gemv

        rows, outputs = (int(v) for v in name.removeprefix("warp").split("x"))
        funcs = {n: batched_gemv(f, rows, outputs=outputs) for n, f in funcs.items()}
        name = "lowbatch4"  # (for any function the schedule does not take)
    with webgpu_target() if name == "webgpu4" else target:
        scheduled = dl.ApplyDefaultSchedule(*candidate_rules(name))(
            tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in funcs.items()}))
    devices, dmod, hosts = lower_split(scheduled, target)
    out = CudaSet()
    for f in hosts:
        tf = host_launches(f, devices, block=True)
        out.tir_functions[tf.name] = tf
    out.kernels = {gv.name_hint: f for gv, f in dmod.functions.items()}
    return build_cuda_source(out)


def build(args) -> None:
    from gpu import import_wick_from_tree

    import_wick_from_tree()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    funcs = decode_gemv_functions(Path(args.config), args.quant, max(args.max_batch, 64))
    print(f"{len(funcs)} dequantize-matmul functions: {', '.join(sorted(funcs))}")
    for name in CANDIDATES:
        t = time.time()
        try:
            source, entry = build_candidate(funcs, name)
        except Exception as e:  # noqa: BLE001 - a rule that cannot schedule these is a result too
            print(f"{name}: not built ({type(e).__name__}: {str(e)[:200]})")
            for stale in (out / f"{name}.cu", out / f"{name}.json"):  # (an older build's)
                stale.unlink(missing_ok=True)
            continue
        (out / f"{name}.cu").write_bytes(source)
        entry["file"] = f"{name}.cu"
        (out / f"{name}.json").write_text(json.dumps(entry))
        blocks = sorted({tuple(k["block"]) for k in entry["kernels"]})
        print(f"{name}: {len(entry['kernels'])} kernels, blocks {blocks}, "
              f"{len(source) // 1024} KiB of source ({time.time() - t:.0f} s)")


# --------------------------------------------------------------------------- GPU: run


def _free_names(expr, names: set) -> None:
    if isinstance(expr, dict):
        names.add(expr["v"])
    elif isinstance(expr, list):
        for e in expr[1:]:
            _free_names(e, names)


def bound_shapes(params: list[dict], batch: int) -> list[tuple[int, ...]]:
    from wick.engine.plan import evaluate

    names: set = set()
    for p in params:
        for d in p["shape"]:
            _free_names(d, names)
    env = {n: batch for n in names}
    return [tuple(int(evaluate(d, env)) for d in p["shape"]) for p in params]


def random_bytes(rng, shape, dtype: str) -> bytes:
    import numpy as np

    if dtype == "float16":
        return (rng.standard_normal(shape) * 0.05).astype(np.float16).tobytes()
    if dtype == "float32":
        return (rng.standard_normal(shape) * 0.05).astype(np.float32).tobytes()
    return rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(dtype).tobytes()


class Runner:
    """One candidate's kernels loaded on the GPU, its functions run on random inputs."""

    def __init__(self, backend, directory: Path, name: str) -> None:
        from wick.engine.plan import SourceKernelTable

        self.backend = backend
        self.entry = json.loads((directory / f"{name}.json").read_text())
        data = (directory / self.entry["file"]).read_bytes()
        self.kernels = SourceKernelTable(self.entry, str(directory), data, backend)
        self.tir = self.entry["tir_functions"]

    def dispatches(self, func: str, tensors) -> list:
        from wick.engine.plan import tir_call

        out: list = []
        tir_call(func, tensors, self.tir, self.kernels, out)
        return out


def make_tensors(backend, params: list[dict], batch: int, seed: int):
    """Buffers for one call: inputs random (the same for every candidate: seeded per function
    and parameter), the output (the last parameter) zeroed."""
    import numpy as np

    from wick.engine.backend import TensorRef

    tensors, buffers = [], []
    for i, (p, shape) in enumerate(zip(params, bound_shapes(params, batch))):
        ref_size = 1
        for d in shape:
            ref_size *= d
        nbytes = max(4, ref_size * np.dtype(p["dtype"]).itemsize)
        buf = backend.alloc(nbytes)
        buffers.append(buf)
        rng = np.random.default_rng([seed, i])
        data = (random_bytes(rng, shape, p["dtype"]) if i < len(params) - 1
                else bytes(nbytes))
        backend.write(buf, 0, data.ljust(nbytes, b"\0"))
        tensors.append(TensorRef(buf, 0, shape, p["dtype"]))
    return tensors, buffers


def buffer_bytes(tensor) -> int:
    return max(4, tensor.nbytes)


def weight_bytes(params: list[dict]) -> int:
    """Bytes of the parameters whose shape does not depend on the batch: the weights."""
    import numpy as np

    total = 0
    for p, small, big in zip(params, bound_shapes(params, 1), bound_shapes(params, 2)):
        if small == big:
            n = 1
            for d in small:
                n *= d
            total += n * np.dtype(p["dtype"]).itemsize
    return total


def time_launches(backend, dispatches: list, reps: int = 20, rounds: int = 3) -> float:
    """Best microseconds per call of ``dispatches`` (``reps`` calls back to back per round)."""
    drv = backend.driver
    launches = [backend._launch(d) for d in dispatches]
    start, stop = drv.event(), drv.event()
    best = float("inf")
    for _ in range(rounds + 1):  # (the first round warms)
        drv.record(start)
        for _ in range(reps):
            for l in launches:
                drv.launch(l.function, l.grid, l.block, l.shared, l.params)
        drv.record(stop)
        drv.synchronize()
        best = min(best, 1000 * drv.elapsed_ms(start, stop) / reps)
    drv.destroy_event(start)
    drv.destroy_event(stop)
    return best


def read_output(backend, tensor) -> "np.ndarray":
    import numpy as np

    from wick.engine.backend import Read

    data = backend.run([], [], [Read(tensor.buffer, 0, tensor.nbytes)])[0]
    return np.frombuffer(data, dtype=tensor.dtype).astype(np.float64).reshape(tensor.shape)


def run(args) -> int:
    from gpu import import_wick_from_tree

    import_wick_from_tree()
    import numpy as np

    from wick.native.cuda_backend import CudaBackend

    directory = Path(args.dir)
    backend = CudaBackend.create("cuda")
    print(f"device: {backend.name}")
    names = [n for n in args.schedules or CANDIDATES if (directory / f"{n}.json").is_file()]
    runners = {}
    for n in names:
        try:
            runners[n] = Runner(backend, directory, n)
        except Exception as e:  # noqa: BLE001 - report and go on with the others
            print(f"{n}: does not load ({type(e).__name__}: {str(e)[:300]})")
    base = runners.get(BASELINE)
    funcs = sorted(base.tir if base else next(iter(runners.values())).tir)
    results = []
    failed = 0
    order = ([BASELINE] if base else []) + [m for m in runners if m != BASELINE]
    for fi, func in enumerate(funcs):
        params = (base or next(iter(runners.values()))).tir[func]["params"]
        wbytes = weight_bytes(params)
        print(f"{func}: {bound_shapes(params, 1)} ({wbytes / 2**20:.1f} MiB of weights)")
        for b in args.batches:
            tensors, buffers = make_tensors(backend, params, b, seed=fi)
            reference = None
            for n in order:
                if func not in runners[n].tir:
                    continue
                row = {"function": func, "schedule": n, "batch": b, "weight_bytes": wbytes}
                try:
                    backend.write(tensors[-1].buffer, 0, bytes(buffer_bytes(tensors[-1])))
                    ds = runners[n].dispatches(func, tensors)
                    row["us"] = time_launches(backend, ds)
                    out = read_output(backend, tensors[-1])
                except Exception as e:  # noqa: BLE001 - a failing candidate is a result
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    failed += 1
                    results.append(row)
                    continue
                finally:
                    backend._launches.clear()
                reference = out if reference is None else reference
                scale = float(np.abs(reference).max()) or 1.0
                row["max_rel_diff"] = float(np.abs(out - reference).max()) / scale
                row["ok"] = bool(np.isfinite(out).all()) and row["max_rel_diff"] < 2e-2
                row["weight_gbs"] = wbytes / (row["us"] * 1e3)
                failed += not row["ok"]
                results.append(row)
            for buf in buffers:
                backend.free(buf)
    for func in funcs:
        print(f"\n### {func}: us (weights GB/s)")
        print("| schedule | " + " | ".join(f"b={b}" for b in args.batches) + " |")
        print("|---|" + "---:|" * len(args.batches))
        for n in order:
            cells = []
            for b in args.batches:
                r = next((r for r in results if (r["function"], r["schedule"], r["batch"])
                          == (func, n, b)), None)
                cells.append("-" if r is None else "error" if "error" in r else
                             f"{r['us']:.1f} ({r['weight_gbs']:.0f})"
                             + ("" if r["ok"] else f" WRONG {r['max_rel_diff']:.1e}"))
            print(f"| {n} | " + " | ".join(cells) + " |")
    # per schedule, the sum over the functions (one layer's GEMVs + the head) by batch
    print("\n### all functions together (us), and the ratio to the same schedule's b=1")
    print("| schedule | " + " | ".join(f"b={b}" for b in args.batches) + " |")
    print("|---|" + "---:|" * len(args.batches))
    for n in order:
        row = []
        for b in args.batches:
            us = [r["us"] for r in results if r["schedule"] == n and r["batch"] == b and "us" in r]
            row.append(sum(us) if len(us) == len(funcs) else None)
        one = row[0] if args.batches[0] == 1 else None
        print(f"| {n} | " + " | ".join(
            "-" if v is None else f"{v:.0f}" + (f" ({v / one:.2f}x)" if one else "")
            for v in row) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": backend.name, "results": results},
                                              indent=1))
    backend.close()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("build")
    b.add_argument("--config", default=str(ROOT / "bench/configs/llama-3-8b.json"))
    b.add_argument("--quant", default="q4f16_1")
    b.add_argument("--max-batch", type=int, default=64)
    b.add_argument("--out", default=str(ROOT / "build/gpu/gemv"))
    r = sub.add_parser("run")
    r.add_argument("--dir", default=str(ROOT / "build/gpu/gemv"))
    r.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    r.add_argument("--schedules", nargs="+", choices=CANDIDATES,
                   help=f"the candidates to run (default: all built; {BASELINE} is the reference)")
    r.add_argument("--json")
    args = p.parse_args(argv)
    if args.mode == "build":
        build(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
