"""The kernel sets, one module per target, over the plans' target-neutral TIR functions
(compiler/lower.py extracts them).

Every lowering target (``targets()``) has the same parts:

* ``KIND``: the lowered set's name (the twin maps' key: compiler/compile.py ``kernel_twins``);
* ``lower(tir_mod, schedule, twins) -> set``: the TIR functions in that target's form, each
  named by ``twins`` replaced by its twin (a function written for the target);
* the set's ``names`` (its TIR functions) and ``merging(other, prefix)``, which
  compiler/lower.py ``merge`` asks whether two functions are the same in this set (one plan calls
  a function by one name in every set) and tells what to add under which name;
* ``build(set) -> {kind: BuiltSet}``: the kernel set(s) as the artifact stores them.

The WebAssembly sets build from the CPU's lowered set (the same functions for another LLVM
target): ``wasm.py`` has only ``build``, and ``builders()`` says which lowered set each build
reads. A new target is one module here
and one line in each table (and its name in KERNEL_SETS, what ``wick compile --kernel-sets``
chooses from). (The target modules are imported when asked for: this package is
also read where TVM is not installed, for ``built``.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable

from .built import BuiltSet


# What a compile may be asked to build (``wick compile --kernel-sets``; every one by default):
# each names one build of ``builders()`` ("wasm": the plain SIMD modules, one thread and
# threaded; "wasm_relaxed": the same two with relaxed SIMD, which browsers run where they can).
KERNEL_SETS = ("webgpu", "cpu", "wasm", "wasm_relaxed", "cuda")
BROWSER_KERNEL_SETS = ("webgpu", "wasm", "wasm_relaxed")  # what a browser engine runs


def chosen_kernel_sets(names) -> tuple[str, ...] | None:
    """``names`` (an iterable, or a comma-separated string) as KERNEL_SETS' names in their
    order; None (every set) for None or all of them. A ValueError names an unknown one."""
    if names is None:
        return None
    names = ([n for n in names.replace(" ", "").split(",") if n] if isinstance(names, str)
             else list(names))
    unknown = sorted(set(names) - set(KERNEL_SETS))
    if unknown or not names:
        what = f"unknown kernel set {', '.join(unknown)}" if unknown else "no kernel set given"
        raise ValueError(f"{what}: choose from {', '.join(KERNEL_SETS)} (comma-separated)")
    chosen = tuple(n for n in KERNEL_SETS if n in names)
    return None if chosen == KERNEL_SETS else chosen


def targets(chosen: tuple[str, ...] | None = None) -> dict:
    """The lowering targets by their KIND, in the order the artifact lists their sets: those
    the ``chosen`` builds read (every one for None)."""
    from . import cpu, cuda, webgpu

    reads = {read for _, read, _, _ in builders(chosen)}
    return {m.KIND: m for m in (webgpu, cpu, cuda) if m.KIND in reads}


def _kept(name: str, build: Callable) -> Callable:
    """``build`` through the build cache (compiler/targets/build_cache.py): an LLVM build is
    seconds to minutes, and a recompile with other options often builds the same functions."""
    import importlib

    from .build_cache import built

    facts = importlib.import_module(build.__module__).build_facts
    return lambda lowered: built(name, build, facts, lowered)


def builders(chosen: tuple[str, ...] | None = None) -> list[tuple[str, str, Callable, bool]]:
    """(its KERNEL_SETS name, the lowered set it reads, build, heavy: an LLVM build worth a
    thread of its own), in the order the artifact lists the sets: the ``chosen`` ones (every
    one for None)."""
    from . import cpu, cuda, wasm, webgpu

    every = [("webgpu", webgpu.KIND, webgpu.build, False), ("cpu", cpu.KIND, cpu.build, True),
             ("wasm", cpu.KIND, wasm.build, True),
             ("wasm_relaxed", cpu.KIND, wasm.build_relaxed, True),
             ("cuda", cuda.KIND, cuda.build, False)]
    return [job for job in every if chosen is None or job[0] in chosen]


Progress = Callable[[str, int, int], None]


def build_all(sets: dict, report: Progress,
              chosen: tuple[str, ...] | None = None) -> dict[str, BuiltSet]:
    """The ``chosen`` kernel sets (every one for None) of the lowered ``sets``. The LLVM builds
    (CPU, WebAssembly) run on two threads: TVM's build and the linkers release the GIL, so a
    2-core machine compiles a model's kernels in ~60 % of the time; the bytes are the same as
    built one after the other (tested). An LLVM build an earlier compile made is taken from the
    build cache (compiler/targets/build_cache.py)."""
    jobs = builders(chosen)
    heavy = [(i, read, _kept(name, build)) for i, (name, read, build, big) in enumerate(jobs)
             if big]
    done: dict[int, dict[str, BuiltSet]] = {}
    if heavy:
        report("compile CPU kernels", 0, len(heavy))
        with ThreadPoolExecutor(len(heavy), thread_name_prefix="wick-kernels") as pool:
            futures = {pool.submit(build, sets[read]): i for i, read, build in heavy}
            for finished, future in enumerate(as_completed(futures), 1):
                done[futures[future]] = future.result()
                report("compile CPU kernels", finished, len(heavy))
    for i, (_, read, build, big) in enumerate(jobs):
        if not big:
            done[i] = build(sets[read])
    return {kind: built for i in range(len(jobs)) for kind, built in done[i].items()}
