"""NVRTC, NVIDIA's runtime CUDA compiler, through its C API (ctypes): CUDA C -> PTX or cubin.

The CUDA backend compiles an artifact's ``kernels/cuda/kernels.cu`` with it at load, for the
GPU it runs on. NVRTC is a compiler only: it needs no GPU, so the compiler's tests run it on
machines without one. Its library comes from the ``nvidia-cuda-nvrtc`` wheel (``wick-llm[cuda]``)
or a CUDA toolkit; the headers TVM's source includes from the toolkit or the
``nvidia-cuda-runtime`` and ``nvidia-cuda-cccl`` wheels (``include_dirs``).
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

from ..engine.errors import DeviceError

_LIB: ctypes.CDLL | None = None


def _wheel_dirs(sub: str) -> list[Path]:
    """``nvidia/*/<sub>`` directories of installed NVIDIA wheels (cu13 and cu12 layouts)."""
    dirs = []
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return dirs
    for root in getattr(nvidia, "__path__", []):
        dirs += [Path(p) for p in sorted(glob.glob(os.path.join(root, "*", sub)))]
    return dirs


def _toolkit_dirs(sub: str) -> list[Path]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [Path(h) / sub for h in homes if h]


def library() -> ctypes.CDLL:
    """libnvrtc, loaded once: from an NVIDIA wheel, a toolkit, or the loader's path."""
    global _LIB
    if _LIB is not None:
        return _LIB
    candidates = []
    for d in _wheel_dirs("lib") + _toolkit_dirs("lib64") + _toolkit_dirs("lib"):
        candidates += sorted(glob.glob(str(d / "libnvrtc.so*")), reverse=True)
    candidates += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    errors = []
    for name in candidates:
        if "builtins" in name:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise DeviceError("NVRTC (libnvrtc) not found: install the CUDA extra "
                          "(`pip install 'wick-llm[cuda]'`) or a CUDA toolkit")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    _LIB = lib
    return lib


def include_dirs() -> list[str]:
    """Directories holding the CUDA headers TVM's source includes beyond NVRTC's built-in
    ones: ``cuda_fp16.h`` (a toolkit, or the nvidia-cuda-runtime wheel) and
    ``cuda/std/cstdint`` (a toolkit, or the nvidia-cuda-cccl wheel)."""
    dirs = []
    for d in _wheel_dirs("include") + _toolkit_dirs("include"):  # (the wheel beside its NVRTC first)
        for candidate in (d, d / "cccl"):
            if (candidate / "cuda_fp16.h").is_file() or (candidate / "cuda" / "std").is_dir():
                dirs.append(str(candidate))
    return list(dict.fromkeys(dirs))


def _check(status: int, what: str) -> None:
    if status != 0:
        message = library().nvrtcGetErrorString(status) or b"?"
        raise DeviceError(f"NVRTC {what} failed: {message.decode()}")


def compile_cuda(source: str | bytes, arch: str, name: str = "kernels.cu",
                 options: tuple[str, ...] = ()) -> bytes:
    """Compile ``source`` for ``arch``: a cubin for a real architecture ("sm_90"), PTX for a
    virtual one ("compute_80"). A compile error is a DeviceError carrying NVRTC's log."""
    lib = library()
    src = source.encode() if isinstance(source, str) else source
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", "--use_fast_math",
                *(f"--include-path={d}" for d in include_dirs()), *options]
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        if status != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            text = log.value.decode(errors="replace").strip()
            raise DeviceError(f"NVRTC could not compile {name} for {arch}:\n{text[:4000]}")
        kind = "CUBIN" if arch.startswith("sm_") else "PTX"
        size = ctypes.c_size_t()
        _check(getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"nvrtcGet{kind}Size")
        out = ctypes.create_string_buffer(size.value)
        _check(getattr(lib, f"nvrtcGet{kind}")(prog, out), f"nvrtcGet{kind}")
        return out.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
