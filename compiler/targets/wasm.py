"""The WebAssembly kernel sets: the plans' TIR functions compiled by LLVM for wasm32 + SIMD.

The browser twin of compiler/targets/cpu.py, built from its lowered set: the same functions
(GPU-only ones swapped for their CPU twins), scheduled by the same rules
(compiler/cpu_schedules.py), compiled for
``wasm32`` with 128-bit SIMD instead of for this machine's CPU, and linked into one
self-contained module, ``kernels/wasm/kernels.wasm``, that the worker's wasm executor
(web/src/wasm_executor.ts) instantiates when a browser has no usable WebGPU adapter.

Two modules are linked from the same object: ``kernels.wasm`` imports nothing and runs on one
thread; ``kernels-threads.wasm`` imports a shared memory and splits parallel loops between
the worker and helper threads instantiated over that memory (only a cross-origin isolated page
may share memory). The same two are built again from an object compiled with relaxed SIMD
(``*-relaxed.wasm``, kinds ``wasm_relaxed`` and ``wasm_threads_relaxed``): LLVM fuses each
multiply and its add into ``f32x4.relaxed_madd``, which a CPU with FMA runs as one instruction
(WebAssembly's own SIMD has no fused multiply-add). The executor runs them where the browser
validates relaxed SIMD (Chrome 114+), else the plain ones. A relaxed multiply-add may be fused
or not, as the browser's CPU has it, the same way for every call on one machine; which
operations fuse depends on a kernel's code, not on its step's rows, so the q4 matmul gives a row
the same bits alone or beside others (tests/compiler/test_wasm_kernels.py). Each holds, besides
the kernels:

* the runtime hooks TVM's code calls (compiler/kernel_runtime.c: scratch memory, parallel
  loops, error messages) and the executor's allocator (``wick_alloc`` / ``wick_free``);
* wasi-libc's math (``expf``, ``logf``, ...) and ``malloc``, linked in by zig's toolchain
  (PyPI ``ziglang``: clang, wasm-ld and wasi-libc in one wheel).

Each kernel is exported as ``__tvm_ffi_<name>`` with TVM's packed calling convention:
``int f(void* self, TVMFFIAny* args, int num_args, TVMFFIAny* result)``, each argument a
DLTensor pointer (docs/artifact.md, "Kernel sets").
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import tvm
from tvm import tirx

from .built import BuiltSet, library
from .cpu import RUNTIME_SOURCE, CpuSet

# kind -> (threads, relaxed SIMD, the module's file in the artifact)
MODULES = {"wasm": (False, False, "kernels/wasm/kernels.wasm"),
           "wasm_threads": (True, False, "kernels/wasm/kernels-threads.wasm"),
           "wasm_relaxed": (False, True, "kernels/wasm/kernels-relaxed.wasm"),
           "wasm_threads_relaxed": (True, True, "kernels/wasm/kernels-threads-relaxed.wasm")}
# what every browser with WebAssembly SIMD (Chrome 91+, Firefox 89+, Safari 16.4+) also has
FEATURES = ("+simd128", "+bulk-memory", "+nontrapping-fptoint", "+sign-ext", "+mutable-globals",
            "+atomics")  # (atomics: the threaded module's pool and its shared memory)
RELAXED = "+relaxed-simd"  # (Chrome 114+: the relaxed modules' one more feature)
TRIPLE = "wasm32-unknown-unknown-wasm"
STACK_BYTES = 1 << 20  # kernels keep scratch under 1 KiB on the stack; the rest is malloc'd
MAX_MEMORY = 65535 * 65536  # wasm32 allows 65536 pages; zig takes a 32-bit number
INITIAL_MEMORY = 16 << 20  # the threaded module's shared memory starts this big (then grows)
EXPORT_PREFIX = "__tvm_ffi_"


def features(relaxed: bool = False) -> list[str]:
    return [*FEATURES, RELAXED] if relaxed else list(FEATURES)


def wasm_target(relaxed: bool = False) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mtriple": TRIPLE, "mattr": features(relaxed),
                              "vector-width": 128})  # (stated, or TVM warns on every build)


def build_wasm_libraries(functions: dict[str, tirx.PrimFunc],
                         relaxed: bool = False) -> dict[str, tuple[bytes, dict]]:
    """Compile ``functions`` into two WebAssembly modules: per kind (``"wasm"``, one thread;
    ``"wasm_threads"``, shared memory; with ``relaxed``, ``"wasm_relaxed"`` and
    ``"wasm_threads_relaxed"``), its bytes and its manifest entry (without file and hash)."""
    from ..cpu_schedules import build_scheduled

    lib = build_scheduled(functions, wasm_target(relaxed))
    entry = {"triple": TRIPLE, "features": features(relaxed), "export_prefix": EXPORT_PREFIX,
             "functions": sorted(functions)}
    exports = [EXPORT_PREFIX + name for name in sorted(functions)]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        obj = Path(tmp) / "kernels.o"
        lib.write_to_file(str(obj))
        for kind, (threads, relaxed_kind, _) in MODULES.items():
            if relaxed_kind != relaxed:
                continue
            path = Path(tmp) / f"{kind}.wasm"
            link(obj, path, exports, threads=threads, relaxed=relaxed)
            extra = {"initial_memory": INITIAL_MEMORY, "max_memory": MAX_MEMORY} if threads else {}
            out[kind] = (path.read_bytes(), {**entry, "threads": threads, **extra})
    return out


def link(obj: Path, out: Path, exports: list[str], threads: bool = False,
         relaxed: bool = False) -> None:
    """Link the kernels' object with the runtime hooks and wasi-libc into ``out``; with
    ``threads``, over an imported shared memory, with the helper threads' entry point."""
    flags = [f.replace("+", "-m", 1) for f in features(relaxed) if f != "+mutable-globals"]
    if threads:  # (each helper instance gets its own stack: __stack_pointer is exported)
        flags += ["-DWICK_THREADS", "-Wl,--shared-memory", "-Wl,--import-memory",
                  f"-Wl,--initial-memory={INITIAL_MEMORY}", "-Wl,--export=__stack_pointer"]
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "wasm32-wasi", "-O2", *flags,
           "-mexec-model=reactor",  # a library: no main, _initialize runs libc's constructors
           "-Wl,--strip-all", f"-Wl,-z,stack-size={STACK_BYTES}",
           f"-Wl,--max-memory={MAX_MEMORY}",
           *[f"-Wl,--export={name}" for name in exports],
           "-o", str(out), str(RUNTIME_SOURCE), str(obj)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"cannot run zig's linker for the WebAssembly kernels: {e}") from None
    if done.returncode:
        detail = (done.stderr or done.stdout).strip()
        if "No module named ziglang" in detail:
            detail = "the ziglang package is missing (pip install ziglang==0.17.1)"
        raise RuntimeError(f"linking the WebAssembly kernels failed: {detail[-2000:]}")


def build_facts() -> dict:
    """What ``build`` depends on besides the functions (compiler/targets/build_cache.py)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        zig = version("ziglang")
    except PackageNotFoundError:  # (the link will say what is missing)
        zig = None
    return {"triple": TRIPLE, "features": list(FEATURES), "relaxed": RELAXED, "ziglang": zig}


def build(lowered: CpuSet) -> dict[str, BuiltSet]:
    """The plain pair of modules of the CPU's lowered set."""
    return _pair(lowered, relaxed=False)


def build_relaxed(lowered: CpuSet) -> dict[str, BuiltSet]:
    """The relaxed-SIMD pair (``wick compile --kernel-sets``' ``wasm_relaxed``)."""
    return _pair(lowered, relaxed=True)


def _pair(lowered: CpuSet, relaxed: bool) -> dict[str, BuiltSet]:
    out: dict[str, BuiltSet] = {}
    for kind, (data, entry) in build_wasm_libraries(lowered.functions, relaxed).items():
        out.update(library(kind, "library", MODULES[kind][2], data, entry))
    return out
