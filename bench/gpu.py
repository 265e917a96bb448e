"""GPU benchmark: wick on real model shapes, per backend, beside the roofline and a peer.

    python bench/gpu.py [--config bench/configs/llama-3-8b.json] [--quant q4f16_1 q0f16]
                        [--backends cuda vulkan] [--batches 1 8 32 64] [--prefill 512]
                        [--tokens 32] [--prompt 64] [--peer torch|none] [--artifacts DIR]
                        [--compile-only [--webgpu-gemv batched|dlight]]

The model is a synthetic artifact (``wick compile --synthetic``): the config's shapes, weights
generated on the device at load. ``--compile-only`` builds the artifacts (TVM, here) into
``--artifacts`` (default build/gpu: a few MB each, small enough to carry to a GPU machine that
has no TVM); a run without it compiles what is missing, then measures on each backend:

* decode tok/s at each batch size (``--prompt`` tokens of context, then ``--tokens`` greedy
  steps, EOS ignored), and prefill tok/s of one ``--prefill``-token prompt;
* the roofline: bytes one decode step must read (every weight once, the embedding table only
  for the rows looked up, plus each sequence's KV cache at the mean context) divided by the
  device's measured copy bandwidth, as tok/s, and wick's share of it;
* the host ms per decode step: engine (schedule + postprocess), plan (inputs and launch
  lists), backend (submit + wait for the GPU + read back);
* the peer on the same GPU (bench/gpu_peer.py: PyTorch, static KV cache, torch.compile'd
  decode step, gpt-fast style) at the same batch sizes.

Backends: ``cuda`` (native/cuda_backend.py), ``vulkan`` (wgpu on any adapter; on an NVIDIA
machine, NVIDIA's Vulkan driver), ``cpu``. Without a GPU, ``--config bench/configs/tiny-llama.json
--backends cpu vulkan --peer torch`` runs the same script end to end on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import Run, wick_run  # noqa: E402

# pyproject's package-dir: the folders that make up the ``wick`` package
PACKAGES = {"wick": "wick", "wick.engine": "engine", "wick.compiler": "compiler",
            "wick.native": "native", "wick.server": "pyserver"}


def import_wick_from_tree() -> None:
    """Make ``wick.*`` importable from this checkout when wick is not installed (a GPU machine
    with no registry to install it from: bench/gpu_device.sh)."""
    import importlib.util

    try:
        import wick.engine  # noqa: F401
        return
    except ImportError:
        pass
    for name, folder in PACKAGES.items():
        spec = importlib.util.spec_from_file_location(
            name, ROOT / folder / "__init__.py", submodule_search_locations=[str(ROOT / folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        if "." in name:
            setattr(sys.modules["wick"], name.split(".")[1], module)


def artifact_path(args, quant: str) -> Path:
    return Path(args.artifacts) / f"{Path(args.config).stem}-{quant}"


def ensure_artifact(args, quant: str) -> Path:
    path = artifact_path(args, quant)
    if (path / "wick-artifact.json").is_file():
        return path
    from wick.compiler.synthetic import compile_synthetic
    from wick.server.progress_bars import ProgressBars

    bars = ProgressBars()
    try:
        return compile_synthetic(args.config, quant, output=path,
                                 prefill_chunk_size=max(256, args.prefill),
                                 max_batch_size=max(args.batches), progress=bars)
    finally:
        bars.close()


# ----------------------------------------------------------------------------- the roofline


def copy_bandwidth(backends: list[str]) -> tuple[float, str]:
    """Bytes/s of a device-to-device copy (read + write), on the GPU when there is one."""
    size, reps = 1 << 30, 20
    if "cuda" in backends:
        try:
            from wick.native.cuda_driver import CudaDriver

            drv = CudaDriver()
            a, b = drv.malloc(size), drv.malloc(size)
            drv.copy(b, a, size)
            drv.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                drv.copy(b, a, size)
            drv.synchronize()
            seconds = time.perf_counter() - t0
            drv.free(a)
            drv.free(b)
            return 2 * size * reps / seconds, f"cuMemcpyDtoD on {drv.name}"
        except Exception as e:  # (reported, then the CPU's figure)
            print(f"(CUDA copy bandwidth unavailable: {e})", file=sys.stderr)
    import numpy as np

    a, b = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
    np.copyto(b, a)
    t0 = time.perf_counter()
    for _ in range(3):
        np.copyto(b, a)
    return 2 * size * 3 / (time.perf_counter() - t0), "numpy copy on the CPU (no GPU)"


def step_bytes(manifest: dict, batch: int, context: int) -> int:
    """Bytes a decode step of ``batch`` sequences at ``context`` tokens must read."""
    params = manifest["params"]
    names = {p["name"] for p in params}
    tied = not any(n.startswith("lm_head") for n in names)
    weights = sum(p["nbytes"] for p in params if tied or "embed_tokens" not in p["name"])
    m = manifest["model"]
    kv_per_token = m["num_layers"] * 2 * m["num_kv_heads"] * m["head_dim"] * \
        (2 if m["dtype"] == "float16" else 4)
    return weights + batch * context * kv_per_token


# ----------------------------------------------------------------------------- wick


def bench_backend(args, art: Path, device: str) -> dict:
    from wick.server.local import build_core

    t0 = time.perf_counter()
    core = build_core(str(art), device=device, kv_cache_bytes=args.kv_mib << 20)
    load_s = time.perf_counter() - t0
    backend = core.runner.backend
    out = {"device": backend.name, "load_s": load_s, "decode": {}}
    prompt = [(7 * i + 3) % 251 for i in range(args.prompt)]
    long_prompt = [(7 * i + 3) % 251 for i in range(args.prefill)]
    wick_run(core, long_prompt, 2, 1)  # warm up every plan (and, on CUDA, its graphs)
    for b in args.batches:
        wick_run(core, prompt, 4, b)
    run: Run = wick_run(core, long_prompt, 2, 1)
    out["prefill"] = run.prefill_tps
    for b in args.batches:
        run = wick_run(core, prompt, args.tokens, b)
        out["decode"][b] = {"tps": run.decode_tps, "step_ms": 1000 * run.decode_s /
                            max(1, run.decode_tokens // b),
                            **{part: run.mean_ms(part) for part in ("engine", "plan", "backend")}}
    out["graphs"] = getattr(backend, "graph_launches", None)
    if hasattr(backend, "close"):  # (the next model, and the peer, get the GPU's memory)
        backend.close()
    return out


# ----------------------------------------------------------------------------- report


def _num(x: float | None) -> str:
    return f"{x:.1f}" if x else "-"


def _ratio(ours: float, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def decode_rows(args, manifest: dict, bandwidth: float, r: dict, peer: dict) -> list[dict]:
    """One backend's decode results per batch, each beside its roofline and the peer."""
    context = args.prompt + args.tokens // 2
    rows = []
    for b, d in r["decode"].items():
        roof = b * bandwidth / step_bytes(manifest, b, context)
        theirs = peer.get("decode", {}).get(b)
        rows.append({"batch": b, "tps": d["tps"], "step_ms": d["step_ms"], "roofline_tps": roof,
                     "roofline_share": d["tps"] / roof, "peer_tps": theirs,
                     "host_ms": d["engine"] + d["plan"], "backend_ms": d["backend"]})
    return rows


def report(args, quant: str, manifest: dict, bandwidth: float, results: dict, peer: dict) -> None:
    print(f"\n## {Path(args.config).stem} {quant}: weights "
          f"{sum(p['nbytes'] for p in manifest['params']) / 2**30:.2f} GiB")
    for device, r in results.items():
        if "error" in r:
            print(f"\n{device}: not run ({r['error']})")
            continue
        graphs = f", {r['graphs']} steps replayed as CUDA graphs" if r.get("graphs") else ""
        print(f"\n{device}: {r['device']} (load {r['load_s']:.1f} s{graphs})")
        print("| batch | decode tok/s | ms/step | roofline tok/s | % roofline | peer tok/s | "
              "wick/peer | host ms (engine+plan) | backend ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in decode_rows(args, manifest, bandwidth, r, peer):
            print(f"| {row['batch']} | {row['tps']:.1f} | {row['step_ms']:.2f} | "
                  f"{row['roofline_tps']:.1f} | {100 * row['roofline_share']:.0f}% | "
                  f"{_num(row['peer_tps'])} | {_ratio(row['tps'], row['peer_tps'])} | "
                  f"{row['host_ms']:.2f} | {row['backend_ms']:.2f} |")
        theirs = peer.get("prefill")
        print(f"| prefill {args.prefill} | {r['prefill']:.0f} | | | | {_num(theirs)} | "
              f"{_ratio(r['prefill'], theirs)} | | |")
    if peer.get("error"):
        print(f"\npeer: {peer['error']}")


def result_json(args, quant: str, manifest: dict, bandwidth: float, how: str, results: dict,
                peer: dict) -> dict:
    """What bench/results/gpu-*.json keeps of one quantization's run."""
    import datetime
    import os

    out = {"date": datetime.date.today().isoformat(), "commit": os.environ.get("WICK_COMMIT"),
           "config": Path(args.config).stem, "quantization": quant,
           "copy_bandwidth_gbs": bandwidth / 1e9, "bandwidth_from": how,
           "prompt": args.prompt, "tokens": args.tokens, "prefill_tokens": args.prefill,
           "peer": {k: v for k, v in peer.items()}, "backends": {}}
    for device, r in results.items():
        if "error" in r:
            out["backends"][device] = {"error": r["error"]}
            continue
        out["backends"][device] = {"device": r["device"], "load_s": r["load_s"],
                                   "graph_launches": r.get("graphs"), "prefill_tps": r["prefill"],
                                   "decode": decode_rows(args, manifest, bandwidth, r, peer)}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "bench/configs/llama-3-8b.json"))
    p.add_argument("--quant", nargs="+", default=["q4f16_1", "q0f16"])
    p.add_argument("--backends", nargs="+", default=["cuda", "vulkan"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--prompt", type=int, default=64, help="context of the decode runs")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--kv-mib", type=int, default=4096)
    p.add_argument("--peer", choices=["torch", "none"], default="torch")
    p.add_argument("--peer-device", default=None, help="default: cuda if there is one, else cpu")
    p.add_argument("--peer-mode", choices=["graph", "compile", "eager"], default="graph",
                   help="the peer's decode step on CUDA: eager kernels replayed as a CUDA graph, "
                        "or torch.compile (reduce-overhead: a minute or more per batch size)")
    p.add_argument("--json", help="write the results here (one object per quantization)")
    p.add_argument("--artifacts", default=str(ROOT / "build/gpu"))
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--webgpu-gemv", choices=["batched", "dlight"], default="batched",
                   help="compiling: the WebGPU set's decode GEMVs as the compiler makes them "
                        "(compiler/batched_gemv.py), or dlight's LowBatchGEMV as before it, to "
                        "measure the two side by side on Vulkan")
    args = p.parse_args(argv)
    if args.webgpu_gemv == "dlight" and not (
            args.compile_only and Path(args.artifacts) != ROOT / "build/gpu"):
        p.error("--webgpu-gemv dlight builds a comparison artifact: with --compile-only and an "
                "--artifacts folder of its own (not the default one that holds the real set)")

    import_wick_from_tree()
    if args.webgpu_gemv == "dlight":
        import wick.compiler.targets.webgpu as webgpu

        webgpu.decode_gemvs = lambda funcs, schedule, **options: funcs
    arts = {q: ensure_artifact(args, q) for q in args.quant}
    if args.compile_only:
        for q, path in arts.items():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            print(f"{q}: {path} ({size / 2**20:.1f} MiB)")
        return
    bandwidth, how = copy_bandwidth(args.backends)
    print(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s ({how})")
    hf = json.loads(Path(args.config).read_text())
    results: dict[str, dict] = {}
    for quant, art in arts.items():
        results[quant] = {}
        for device in args.backends:
            try:
                results[quant][device] = bench_backend(args, art, device)
            except Exception as e:  # (a backend this machine lacks: said, then the others)
                results[quant][device] = {"error": f"{type(e).__name__}: {e}"}
    saved: list[dict] = []
    for quant, art in arts.items():  # (the peers last: PyTorch's threads may pin the CPU)
        peer = {}
        if args.peer == "torch":
            import torch
            from gpu_peer import bench as bench_peer

            device = args.peer_device or ("cuda" if torch.cuda.is_available() else "cpu")
            mode = args.peer_mode if device.startswith("cuda") else "eager"
            peer = bench_peer(hf, args.batches, args.prompt, args.tokens, args.prefill, device,
                              int4=quant.startswith("q4"), mode=mode)
            peer["mode"] = mode
        manifest = json.loads((art / "wick-artifact.json").read_text())
        report(args, quant, manifest, bandwidth, results[quant], peer)
        saved.append(result_json(args, quant, manifest, bandwidth, how, results[quant], peer))
        if args.json:  # (after each quantization: a run cut short keeps what it measured)
            Path(args.json).write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
