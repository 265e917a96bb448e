"""Where a CUDA decode step's time goes: each kernel of one decode step, timed on the GPU.

    python bench/gpu_profile.py ARTIFACT [--batch 1] [--prompt 64] [--json OUT]

Runs a few greedy decode steps to find the step's launch list (the list the CUDA backend would
replay as a graph), then launches that list once more with a CUDA event after every kernel,
all of it queued behind a spin kernel that holds the stream for a few milliseconds: the GPU
then runs the kernels back to back as a graph replay would, and the time between two events
is one kernel's, not the host's launch cost (each event adds ~2 us: a step's kernels sum to
6.55 ms where its graph replay takes 5.9). Per kernel: its name, grid, microseconds and the
bytes of the buffers it binds (weights and activations; the KV pages, bound whole and read in
part, are left out), so the bandwidth column is a lower bound for the GEMVs that dominate a
decode step and means nothing for attention.
Prints a table grouped by kernel name and, with ``--json``, writes every launch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import wick_run  # noqa: E402
from gpu import import_wick_from_tree  # noqa: E402

SPIN = r"""
extern "C" __global__ void wick_spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
}
"""


def decode_launch_list(core, batch: int, prompt: list[int]):
    """The dispatch list of a decode step at ``batch``: the list launched most often."""
    backend = core.runner.backend
    seen: dict = {}
    counts: dict = defaultdict(int)
    dispatch = backend._dispatch

    def spy(dispatches, step=None):  # (by the runner's step key: the decode step runs most)
        seen[step] = dispatches
        counts[step] += 1
        return dispatch(dispatches, step)

    backend._dispatch = spy
    try:
        wick_run(core, prompt, 8, batch)
    finally:
        backend._dispatch = dispatch
    return seen[max(counts, key=counts.get)]


def profile(core, dispatches) -> list[dict]:
    from wick.native import nvrtc

    backend = core.runner.backend
    kv_pages = {t.buffer for t in core.runner.kv_pages}
    drv = backend.driver
    module = drv.load_module(nvrtc.compile_cuda(SPIN, backend.arch, name="spin.cu"))
    spin = drv.function(module, "wick_spin")
    launches = [backend._launch(d) for d in dispatches]
    events = [drv.event() for _ in range(len(launches) + 1)]
    import ctypes

    cycles = ctypes.c_longlong(20_000_000)  # ~10 ms at ~2 GHz: the host queues the rest meanwhile
    arg = (ctypes.c_void_p * 1)(ctypes.addressof(cycles))
    drv.launch(spin, (1, 1, 1), (1, 1, 1), 0, arg)
    drv.record(events[0])
    for launch, event in zip(launches, events[1:]):
        drv.launch(launch.function, launch.grid, launch.block, launch.shared, launch.params)
        drv.record(event)
    drv.synchronize()
    rows = []
    for i, (d, launch) in enumerate(zip(dispatches, launches)):
        nbytes = sum(backend._buffers[s.buffer][1] for s in d.storage if s.buffer not in kv_pages)
        rows.append({"index": i, "kernel": backend._kernels[d.kernel].name, "grid": list(launch.grid),
                     "block": list(launch.block), "us": 1000 * drv.elapsed_ms(events[i], events[i + 1]),
                     "bytes_bound": nbytes})
    for e in events:
        drv.destroy_event(e)
    drv.unload_module(module)
    return rows


def report(rows: list[dict]) -> None:
    total = sum(r["us"] for r in rows)
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["kernel"]].append(r)
    print(f"one decode step: {len(rows)} kernels, {total:.0f} us on the GPU")
    print("| kernel | launches | us total | % step | us each | GB/s (bound bytes) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rs in sorted(groups.items(), key=lambda kv: -sum(r["us"] for r in kv[1])):
        us = sum(r["us"] for r in rs)
        gbs = sum(r["bytes_bound"] for r in rs) / (us * 1e3) if us else 0.0
        print(f"| {name} | {len(rs)} | {us:.0f} | {100 * us / total:.1f}% | {us / len(rs):.1f} | "
              f"{gbs:.0f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artifact")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--kv-mib", type=int, default=2048)
    p.add_argument("--json", help="write every launch here")
    args = p.parse_args(argv)
    import_wick_from_tree()
    from wick.server.local import build_core

    core = build_core(args.artifact, device="cuda", kv_cache_bytes=args.kv_mib << 20)
    prompt = [(7 * i + 3) % 251 for i in range(args.prompt)]
    dispatches = decode_launch_list(core, args.batch, prompt)
    rows = profile(core, dispatches)
    report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"artifact": Path(args.artifact).name,
                                               "device": core.runner.backend.name,
                                               "batch": args.batch, "launches": rows}, indent=1))
    core.runner.backend.close()


if __name__ == "__main__":
    main()
