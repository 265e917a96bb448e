"""The WebAssembly kernel set: the plan's TIR functions compiled by LLVM for wasm32 + SIMD.

The browser twin of compiler/cpu_kernels.py: the same functions (GPU-only ones swapped for
their CPU twins), scheduled by the same rules (compiler/cpu_schedules.py), compiled for
``wasm32`` with 128-bit SIMD instead of for this machine's CPU, and linked into one
self-contained module, ``kernels/wasm/kernels.wasm``, that the worker's wasm executor
(web/src/wasm_executor.ts) instantiates when a browser has no usable WebGPU adapter.

The module imports nothing. It holds, besides the kernels:

* the runtime hooks TVM's code calls (compiler/wasm_runtime.c: scratch memory, parallel
  loops, error messages) and the executor's allocator (``wick_alloc`` / ``wick_free``);
* wasi-libc's math (``expf``, ``logf``, ...) and ``malloc``, linked in by zig's toolchain
  (PyPI ``ziglang``: clang, wasm-ld and wasi-libc in one wheel).

Each kernel is exported as ``__tvm_ffi_<name>`` with TVM's packed calling convention:
``int f(void* self, TVMFFIAny* args, int num_args, TVMFFIAny* result)``, each argument a
DLTensor pointer (docs/artifact.md, "wasm_kernels").
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import tvm
from tvm import tirx

RUNTIME_SOURCE = Path(__file__).with_name("wasm_runtime.c")
# what every browser with WebAssembly SIMD (Chrome 91+, Firefox 89+, Safari 16.4+) also has
FEATURES = ("+simd128", "+bulk-memory", "+nontrapping-fptoint", "+sign-ext", "+mutable-globals")
TRIPLE = "wasm32-unknown-unknown-wasm"
STACK_BYTES = 1 << 20  # kernels keep scratch under 1 KiB on the stack; the rest is malloc'd
MAX_MEMORY = 65535 * 65536  # wasm32 allows 65536 pages; zig takes a 32-bit number
EXPORT_PREFIX = "__tvm_ffi_"


def wasm_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mtriple": TRIPLE, "mattr": list(FEATURES),
                              "vector-width": 128})  # (said, TVM does not warn about it)


def build_wasm_library(functions: dict[str, tirx.PrimFunc]) -> tuple[bytes, dict]:
    """Compile ``functions`` into one WebAssembly module: its bytes, and its manifest entry
    (without file and hash)."""
    from .cpu_schedules import schedule

    target = wasm_target()
    funcs = {}
    for name, f in functions.items():
        funcs[tvm.ir.GlobalVar(name)] = schedule(f, target).with_attr("global_symbol", name)
    lib = tvm.tirx.build(tvm.IRModule(funcs), target=target)
    with tempfile.TemporaryDirectory() as tmp:
        obj, out = Path(tmp) / "kernels.o", Path(tmp) / "kernels.wasm"
        lib.write_to_file(str(obj))
        link(obj, out, [EXPORT_PREFIX + name for name in sorted(functions)])
        data = out.read_bytes()
    return data, {"triple": TRIPLE, "features": list(FEATURES), "export_prefix": EXPORT_PREFIX,
                  "functions": sorted(functions)}


def link(obj: Path, out: Path, exports: list[str]) -> None:
    """Link the kernels' object with the runtime hooks and wasi-libc into ``out``."""
    flags = [f.replace("+", "-m", 1) for f in FEATURES if f != "+mutable-globals"]
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
