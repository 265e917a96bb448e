"""Whether this install can compile: the compile extra (``pip install 'wick-llm[compile]'``).

A runtime-only install (``pip install wick-llm``) serves, chats and exports compiled artifacts
(a local artifact directory, an ``hf://`` repo holding one): its CPU kernels
run on the runtime linked into them (compiler/kernel_runtime.c), its GPU kernels on wgpu or
CUDA. Compiling a model needs TVM (lowering, LLVM) and zig's toolchain (the WebAssembly
kernels); without them, whatever would compile says which extra to install instead of failing
on an import deep inside.
"""

from __future__ import annotations

import importlib.util

from ..engine.errors import WickError

COMPILE_EXTRA = "wick-llm[compile]"
# the distributions behind the extra (pyproject.toml's `compile`; the wheel test holds the two
# equal), by import name
COMPILE_DISTRIBUTIONS = {"tvm": "apache-tvm", "tvm_ffi": "apache-tvm-ffi", "ziglang": "ziglang"}


class CompilerMissingError(WickError):
    """Compiling was needed, and this install has no compiler."""

    default_status = 501
    default_type = "server_error"
    default_code = "compiler_not_installed"


def missing_compiler_modules() -> list[str]:
    """The compile extra's distributions this install lacks (none: it can compile)."""
    return [dist for module, dist in COMPILE_DISTRIBUTIONS.items()
            if importlib.util.find_spec(module) is None]


def require_compiler(what: str) -> None:
    """Raise ``CompilerMissingError`` unless this install can compile ``what`` (a model)."""
    missing = missing_compiler_modules()
    if missing:
        raise CompilerMissingError(
            f"compiling {what} needs wick's compiler, and this install has none "
            f"({', '.join(missing)} missing): pip install '{COMPILE_EXTRA}'. A compiled artifact "
            "(a directory from `wick compile`, or an hf:// repo holding one) runs without it")
