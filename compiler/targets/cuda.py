"""The CUDA kernel set: the plans' TIR functions scheduled and lowered by TVM for CUDA.

The same unscheduled TIR functions as the WebGPU set (compiler/targets/webgpu.py), scheduled by
the same dlight rules for a CUDA target (TVM tiles them for 1024-thread blocks and 32-lane warps),
and lowered the same way: each function's host part becomes launches read as data, its device
parts become CUDA C. Every kernel goes into one source file, ``kernels/cuda/kernels.cu``, which the
CUDA backend (native/cuda_backend.py) compiles with NVRTC once, at load, for the GPU it finds.
So the artifact holds source, not a binary: one file serves every NVIDIA GPU from ``CUDA_ARCH``
on, and nothing here needs a GPU or a CUDA toolkit.

The manifest's ``kernel_sets.cuda`` entry holds what the engine needs to launch them: each
kernel's scalar parameters, thread block and dynamic shared memory, and the TIR functions'
launches (the WebGPU set's format, docs/artifact.md). Kernels whose GPU form differs by target
(attention's tiles) are rebuilt for CUDA (the twin map's ``"cuda"`` part: compiler/compile.py
``kernel_twins``); the decode plans' dequantize-GEMVs take compiler/batched_gemv.py's schedule,
the rest dlight's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import tirx
from tvm.s_tir import dlight as dl

from ..batched_gemv import decode_gemvs
from ..tir_lower import (TirFunction, host_launches, lower_split, same_code, scalar_dtype,
                         schedule_rules)
from .built import BuiltSet, library

KIND = "cuda"
SOURCE = "kernels/cuda/kernels.cu"

# The oldest GPU architecture the source targets (Ampere): TVM's codegen and dlight's rules
# read it. The backend compiles for the device's own architecture, and refuses an older one.
CUDA_ARCH = "sm_80"
MAX_THREADS = 1024


def cuda_target(arch: str = CUDA_ARCH) -> tvm.target.Target:
    return tvm.target.Target({"kind": "cuda", "arch": arch, "max_num_threads": MAX_THREADS,
                              "thread_warp_size": 32, "max_shared_memory_per_block": 49152},
                             host={"kind": "llvm"})


def cuda_schedule_rules(schedule: str) -> list:
    """``schedule_rules(schedule)`` for CUDA: the same rules, with dlight's tiled matmul kept
    on CUDA cores (``SimtMatmul``)."""
    return [SimtMatmul() if type(rule) is dl.gpu.Matmul else rule
            for rule in schedule_rules(schedule)]


class SimtMatmul(dl.gpu.Matmul):
    """dlight's tiled matmul with CUDA's tiles but not its tensor-core path: that path's
    Tensorize crashes TVM (a segfault, not an error) on the model's dequantize-matmuls, so the
    rule is shown an architecture without tensor cores; the kernels are built for the real one."""

    def apply(self, func, target, tunable):
        return super().apply(func, cuda_target("sm_60"), tunable)


@dataclass
class CudaSet:
    """One lowering's CUDA kernels (device functions by name) and TIR functions' launches."""

    kernels: dict[str, tirx.PrimFunc] = field(default_factory=dict)
    tir_functions: dict[str, TirFunction] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.tir_functions)

    def merging(self, other: "CudaSet", prefix: str) -> "_Merge":
        return _Merge(self, other, prefix)


def lower(tir_mod: tvm.IRModule, schedule: str, twins: dict[str, tirx.PrimFunc]) -> CudaSet:
    """``tir_mod``'s functions (``twins`` replacing those with a CUDA form of their own)
    scheduled by ``cuda_schedule_rules(schedule)`` and lowered for CUDA."""
    target = cuda_target()
    funcs = {gv: twins.get(gv.name_hint, f) for gv, f in tir_mod.functions.items()}
    funcs = decode_gemvs(funcs, schedule)  # (warp reductions: shuffles)
    with target:
        scheduled = dl.ApplyDefaultSchedule(*cuda_schedule_rules(schedule))(tvm.IRModule(funcs))
    devices, dmod, hosts = lower_split(scheduled, target)
    out = CudaSet()
    for f in hosts:
        tf = host_launches(f, devices, block=True)
        out.tir_functions[tf.name] = tf
    used = {launch["kernel"] for tf in out.tir_functions.values() for launch in tf.launches}
    out.kernels = {gv.name_hint: f for gv, f in dmod.functions.items() if gv.name_hint in used}
    return out


class _Merge:
    """``other`` joining ``base`` (compiler/lower.py ``merge``): a kernel keeps its name where
    ``base`` has none or the same code under it, else takes the name of an equal kernel an
    earlier merge named apart, else ``prefix``; a function is the same as one of ``base``'s when
    its parameters, its launches and their kernels' code are."""

    def __init__(self, base: CudaSet, other: CudaSet, prefix: str) -> None:
        self.kernels = dict(base.kernels)
        self.renamed: dict[str, str] = {}
        for name, f in other.kernels.items():
            same = self.kernels.get(name)
            if same is None or same_code(same, f):
                new = name
            else:
                new = next((n for n, g in self.kernels.items()
                            if n != name and n.endswith(name) and same_code(g, f)), prefix + name)
            self.renamed[name] = new
            self.kernels.setdefault(new, f.with_attr("global_symbol", new))
        self.other = other
        self.functions = dict(base.tir_functions)

    def _launches(self, theirs: str) -> list[dict]:
        return [{**launch, "kernel": self.renamed[launch["kernel"]]}
                for launch in self.other.tir_functions[theirs].launches]

    def same(self, mine: str, theirs: str) -> bool:
        have, f = self.functions.get(mine), self.other.tir_functions[theirs]
        if have is None or have.params != f.params or len(have.launches) != len(f.launches):
            return False
        strip = lambda launch: {k: v for k, v in launch.items() if k != "kernel"}  # noqa: E731
        return all(strip(a) == strip(b) and same_code(self.kernels[a["kernel"]],
                                                        self.other.kernels[b["kernel"]])
                   for a, b in zip(have.launches, f.launches))

    def add(self, theirs: str, name: str) -> None:
        self.functions.setdefault(name, TirFunction(name, self.other.tir_functions[theirs].params,
                                                    self._launches(theirs)))

    def result(self) -> CudaSet:
        return CudaSet(self.kernels, self.functions)


def _static(value, what: str) -> int:
    if not isinstance(value, int):
        raise NotImplementedError(f"{what} depends on the shapes ({value}): not supported")
    return value


def kernel_entry(name: str, f: tirx.PrimFunc, launches: list[dict]) -> dict:
    """What the backend needs to launch ``name``: its scalar parameters (after its pointers:
    TVM puts buffer parameters first), its thread block and its dynamic shared memory."""
    dtypes = [scalar_dtype(p) for p in f.params]
    first_scalar = next((i for i, d in enumerate(dtypes) if d is not None), len(dtypes))
    if any(d is None for d in dtypes[first_scalar:]):
        raise NotImplementedError(f"{name}: a pointer parameter after a scalar one")
    blocks = {tuple(_static(b, f"{name}'s thread block") for b in launch["block"])
              for launch in launches}
    shared = {_static(launch["shared"], f"{name}'s shared memory") for launch in launches}
    if len(blocks) != 1 or len(shared) != 1:
        raise NotImplementedError(f"{name}: launched with different blocks {blocks}")
    block = blocks.pop()
    if block[0] * block[1] * block[2] > MAX_THREADS:
        raise NotImplementedError(f"{name}: block {block} over {MAX_THREADS} threads")
    return {"name": name, "scalar_dtypes": dtypes[first_scalar:], "block": list(block),
            "shared": shared.pop()}


def build_cuda_source(cuda: CudaSet) -> tuple[bytes, dict]:
    """All kernels as one CUDA C source, and the manifest entry (without file and hash):
    the architecture, each kernel's launch metadata, and the TIR functions' launches."""
    target = cuda_target()
    funcs = {tvm.ir.GlobalVar(n): f.with_attr("global_symbol", n) for n, f in cuda.kernels.items()}
    # TVM's CUDA codegen keeps the source and leaves compiling to whoever loads the module
    module = tvm.get_global_func("target.build.cuda")(tvm.IRModule(funcs), target)
    source = module.inspect_source("cuda")
    by_kernel: dict[str, list[dict]] = {n: [] for n in cuda.kernels}
    for tf in cuda.tir_functions.values():
        for launch in tf.launches:
            by_kernel[launch["kernel"]].append(launch)
    kernels = [kernel_entry(n, cuda.kernels[n], by_kernel[n]) for n in sorted(cuda.kernels)]
    tir_functions = {}
    for name, tf in cuda.tir_functions.items():
        # (block and shared memory are the kernel's: kept once, in its entry)
        launches = [{k: v for k, v in launch.items() if k not in ("block", "shared")}
                    for launch in tf.launches]
        tir_functions[name] = {"params": tf.params, "launches": launches}
    return source.encode("utf-8"), {"arch": CUDA_ARCH, "kernels": kernels,
                                    "tir_functions": tir_functions}


def build(lowered: CudaSet) -> dict[str, BuiltSet]:
    """The source file (NVRTC compiles it at load, for the GPU the backend finds)."""
    data, entry = build_cuda_source(lowered)
    return library(KIND, "source", SOURCE, data, entry)
