"""The CPU kernel set: the plan's TIR functions compiled by LLVM for this machine's CPU.

Every artifact carries its plans once; the WebGPU set runs them as WGSL launches, this set as
native functions in one shared library (``kernels/cpu/kernels.so``) that the native CPU
backend (native/cpu_backend.py) loads. The functions keep TVM's packed calling convention
(tensors described by DLTensor), so the backend passes each plan call's tensors directly.

The TIR is the same as the GPU's, before scheduling, except where a kernel exists only in a
GPU form (thread bindings, shared memory): attention and sampling have CPU twins written for
it (compiler/models/cpu_attention.py, compiler/sampling.py, compiler/logits.py), swapped in by
name (``lower(..., cpu_twins=...)``). compiler/cpu_schedules.py is where wick's own CPU
schedules apply; a function no rule matches compiles as TVM's plain loops.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import tvm
from tvm import tirx

def host_cpu() -> str:
    """LLVM's name for this machine's CPU (e.g. "znver4", "skylake-avx512")."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def cpu_target(mcpu: str | None = None) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu or host_cpu(),
                              "num-cores": os.cpu_count() or 1})


def build_cpu_library(functions: dict[str, tirx.PrimFunc],
                      mcpu: str | None = None) -> tuple[bytes, dict]:
    """Compile ``functions`` into one shared library: its bytes, and its manifest entry
    (without file and hash): the CPU it was built for and the functions it exports."""
    from .cpu_schedules import build_scheduled

    target = cpu_target(mcpu)
    lib = build_scheduled(functions, target)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.so"
        lib.export_library(str(path))  # links with the system C compiler
        data = path.read_bytes()
    return data, {"mcpu": str(target.attrs["mcpu"]), "triple": host_triple(),
                  "functions": sorted(functions)}


def host_triple() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())
