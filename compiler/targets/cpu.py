"""The CPU kernel set: the plans' TIR functions compiled by LLVM for this machine's CPU.

Every artifact carries its plans once; the WebGPU set runs them as WGSL launches, this set as
native functions in one shared library (``kernels/cpu/kernels.so``) that the native CPU
backend (native/cpu_backend.py) loads with ctypes. The functions keep TVM's packed calling
convention (tensors described by DLTensor), so the backend passes each plan call's tensors
directly. The library is linked with wick's kernel runtime (compiler/kernel_runtime.c: thread
pool, scratch memory, errors; the same file the WebAssembly kernel set links), so running it
needs libc and nothing of TVM's: a runtime-only install (no ``wick-llm[compile]``) serves it.

The TIR is the same as the GPU's, before scheduling, except where a kernel exists only in a
GPU form (thread bindings, shared memory): attention and sampling have CPU twins written for
it (compiler/models/cpu_attention.py, compiler/sampling.py, compiler/logits.py), swapped in by
name (the twin map's ``"cpu"`` part: compiler/compile.py ``kernel_twins``). The set is the
functions themselves, unscheduled: compiler/cpu_schedules.py schedules them at build, for this
CPU here and for wasm32 in compiler/targets/wasm.py; a function no rule matches compiles as
TVM's plain loops.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import tirx

from ...engine.artifact import KERNEL_RUNTIME_ABI, host_cpu_flags
from ..tir_lower import same_code
from .built import BuiltSet, library

KIND = "cpu"
LIBRARY = "kernels/cpu/kernels.so"
RUNTIME_SOURCE = Path(__file__).parent.parent / "kernel_runtime.c"


@dataclass
class CpuSet:
    """One lowering's TIR functions for the CPU (GPU-only ones replaced by their twins)."""

    functions: dict[str, tirx.PrimFunc]

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def merging(self, other: "CpuSet", prefix: str) -> "_Merge":
        return _Merge(self, other)


def lower(tir_mod: tvm.IRModule, schedule: str, twins: dict[str, tirx.PrimFunc]) -> CpuSet:
    """``tir_mod``'s functions, each named in ``twins`` replaced by its CPU twin. (Scheduled at
    build: one schedule serves every plan, the rows of a step being a loop bound here.)"""
    return CpuSet({gv.name_hint: twins.get(gv.name_hint, f) for gv, f in tir_mod.functions.items()})


class _Merge:
    """``other`` joining ``base`` (compiler/lower.py ``merge``): a function is the same as one
    of ``base``'s when it is the same code."""

    def __init__(self, base: CpuSet, other: CpuSet) -> None:
        self.functions, self.theirs = dict(base.functions), other.functions

    def same(self, mine: str, theirs: str) -> bool:
        have = self.functions.get(mine)
        return have is not None and same_code(have, self.theirs[theirs])

    def add(self, theirs: str, name: str) -> None:
        self.functions.setdefault(name, self.theirs[theirs])

    def result(self) -> CpuSet:
        return CpuSet(self.functions)


def build(lowered: CpuSet) -> dict[str, BuiltSet]:
    data, entry = build_cpu_library(lowered.functions)
    return library(KIND, "library", LIBRARY, data, entry)


def build_facts() -> dict:
    """What ``build`` depends on besides the functions (compiler/targets/build_cache.py)."""
    return {"mcpu": host_cpu(), "triple": host_triple(), "cpu_flags": sorted(host_cpu_flags()),
            "cc": _c_compiler_version(_c_compiler()), "runtime": KERNEL_RUNTIME_ABI}


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
    from ..cpu_schedules import build_scheduled

    target = cpu_target(mcpu)
    lib = build_scheduled(functions, target)
    with tempfile.TemporaryDirectory() as tmp:
        obj, path = Path(tmp) / "kernels.o", Path(tmp) / "kernels.so"
        lib.write_to_file(str(obj))
        link(obj, path)
        data = path.read_bytes()
    return data, {"mcpu": str(target.attrs["mcpu"]), "triple": host_triple(),
                  "cpu_flags": sorted(host_cpu_flags()), "runtime": KERNEL_RUNTIME_ABI,
                  "functions": sorted(functions)}


def link(obj: Path, out: Path) -> None:
    """Link the kernels' object with the kernel runtime into the shared library ``out``, with
    the system C compiler. -Bsymbolic: the kernels' calls into the runtime stay inside the
    library even in a process that has TVM's runtime loaded (its symbols have the same names)."""
    cc = _c_compiler()
    cmd = [cc, "-shared", "-fPIC", "-O2", "-pthread", "-Wl,-Bsymbolic", "-o", str(out),
           "-x", "c", str(RUNTIME_SOURCE), "-x", "none", str(obj), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"cannot run the C compiler ({cc}) to link the CPU kernels: {e}; "
                           "install one (apt-get install gcc)") from None
    if done.returncode:
        detail = (done.stderr or done.stdout).strip()
        raise RuntimeError(f"linking the CPU kernels failed: {detail[-2000:]}")


@functools.lru_cache(maxsize=4)
def _c_compiler_version(cc: str) -> str:
    """``cc`` and what ``cc --version`` says (it compiles the kernel runtime into the library)."""
    try:
        done = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cc}: {done.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):  # (the link will say what is missing)
        return cc


def _c_compiler() -> str:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"


def host_triple() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())
