"""The CPU kernel set: the plan's TIR functions compiled by LLVM for this machine's CPU.

Every artifact carries its plans once; the WebGPU set runs them as WGSL launches, this set as
native functions in one shared library (``kernels/cpu/kernels.so``) that the native CPU
backend (native/cpu_backend.py) loads. The functions keep TVM's packed calling convention
(tensors described by DLTensor), so the backend passes each plan call's tensors directly.

The TIR is the same as the GPU's, before scheduling, except where a kernel exists only in a
GPU form (thread bindings, shared memory): attention and sampling have CPU twins written for
it (compiler/models/cpu_attention.py, compiler/sampling.py, compiler/logits.py), swapped in by
name (``lower(..., cpu_twins=...)``). ``schedule_for_cpu`` is where wick's own CPU schedules
apply; a function no rule matches compiles as TVM's plain loops.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import tvm
from tvm import tirx

LIBRARY_FILE = "kernels/cpu/kernels.so"


def host_cpu() -> str:
    """LLVM's name for this machine's CPU (e.g. "znver4", "skylake-avx512")."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def cpu_target(mcpu: str | None = None) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu or host_cpu(),
                              "num-cores": os.cpu_count() or 1})


def schedule_for_cpu(name: str, func: tirx.PrimFunc, target) -> tirx.PrimFunc:
    """wick's CPU schedule for one function (compiler/cpu_schedules.py), or the function as
    it is when no rule applies."""
    from .cpu_schedules import schedule

    return schedule(name, func, target)


def build_cpu_library(functions: dict[str, tirx.PrimFunc], path: Path,
                      mcpu: str | None = None) -> dict:
    """Compile ``functions`` into the shared library ``path``; returns the manifest entry
    (without the file's hash): the CPU it was built for and the functions it exports."""
    target = cpu_target(mcpu)
    funcs = {}
    for name, f in functions.items():
        scheduled = schedule_for_cpu(name, f, target)  # (maybe a new function: name it after)
        funcs[tvm.ir.GlobalVar(name)] = scheduled.with_attr("global_symbol", name)
    mod = tvm.IRModule(funcs)
    lib = tvm.tirx.build(mod, target=target)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # export_library links with the system C compiler (object files -> .so)
        tmp_path = Path(tmp) / path.name
        lib.export_library(str(tmp_path))
        tmp_path.replace(path)
    return {"mcpu": str(target.attrs["mcpu"]), "triple": host_triple(),
            "functions": sorted(functions)}


def host_triple() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())
