"""The CPU backend: runs an artifact's CPU kernel set (compiler/cpu_kernels.py) natively.

Same contract as the wgpu backend (engine/backend.py), ``kind = "cpu"``: buffers are host
memory, and a step is a list of ``Call``s, each one native function of the artifact's library
called on its tensors. The library is TVM LLVM code with TVM's packed calling convention, so
TVM's runtime loads it and provides what the kernels call back into: the thread pool behind
``T.parallel`` loops, scratch workspace and error reporting. No second runtime is written here.

Buffers are 64-byte aligned numpy arrays; a tensor handed to a kernel is a DLPack view of one,
made once per (buffer, offset, shape, dtype) and reused, so a step's cost is the kernels plus
about a microsecond per call.
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Sequence

import numpy as np

from ..engine.backend import BufferHandle, Call, Read, TensorRef, Write
from ..engine.errors import ArtifactError, DeviceError

ALIGN = 64  # bytes: what TVM's CPU code assumes of a tensor's data pointer
_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32,
                 "uint32": np.uint32, "int64": np.int64, "uint8": np.uint8, "int8": np.int8,
                 "bool": np.bool_}


def cpu_name() -> str:
    """The processor's marketing name where the OS tells it, else its architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def default_threads() -> int:
    """One thread per core this process may run on: read once, before TVM's pool pins the
    calling thread to one core (a second backend would otherwise see one core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CpuBackend:
    """``wick.engine.backend.Backend`` on this machine's CPU cores."""

    kind = "cpu"
    # f16 variants run (LLVM rounds each half-precision operation as a GPU does, through f32
    # arithmetic), but f32 is the CPU's native width: a model's default variant here is its
    # float32 twin (pyserver/local.py pick_quantization)
    features: frozenset[str] = frozenset({"shader-f16"})
    prefers_f32 = True
    is_software = False  # (not an emulated GPU: the CPU is the device)
    storage_offset_alignment = ALIGN
    max_storage_binding = 1 << 46
    max_buffer_size = 1 << 46

    def __init__(self, threads: int | None = None) -> None:
        try:
            import tvm  # noqa: F401  (its runtime loads and runs the kernel libraries)
            import tvm_ffi
        except Exception as e:
            raise DeviceError(f"the CPU backend needs TVM's runtime (apache-tvm): {e}") from None
        self._tvm, self._ffi = tvm, tvm_ffi
        self.threads = int(threads or default_threads())
        # TVM's pool otherwise starts with one thread on some machines (FIELD_NOTES)
        tvm.get_global_func("runtime.config_threadpool")(1, self.threads)
        self.adapter_name = cpu_name()
        self.name = f"cpu: {self.adapter_name} ({self.threads} threads)"
        self._arrays: dict[BufferHandle, np.ndarray] = {}  # handle -> aligned uint8 array
        self._next_handle = 1
        self._functions: list = []
        self._libraries: list = []  # loaded modules stay alive as long as the backend
        self._views: dict[TensorRef, object] = {}  # tensor -> its DLPack view, made once

    @classmethod
    def create(cls, threads: int | None = None) -> CpuBackend:
        return cls(threads)

    # -------------------------------------------------------------- kernels

    def load_library(self, entry: dict, path: str, data: bytes) -> int:
        from tvm.target import codegen

        mcpu, functions = entry["mcpu"], entry["functions"]
        here = str(codegen.llvm_get_system_cpu())
        if mcpu != here:
            raise ArtifactError(
                f"{path}: CPU kernels built for {mcpu!r}, this machine's CPU is {here!r}: "
                "recompile the model here (`wick compile --force`)", code="artifact_stale")
        try:
            # (TVM's loader, not tvm.runtime.load_module: that one resolves symlinks first
            # and then reads the format from the target's name, which huggingface_hub's
            # cache names by content hash, with no ".so")
            lib = self._tvm.runtime.module._load_module(path)
        except Exception as e:
            raise ArtifactError(f"cannot load the CPU kernels: {e}", path=path) from None
        base = len(self._functions)
        for name in functions:
            try:
                self._functions.append(lib[name])
            except Exception:
                raise ArtifactError(f"function {name!r} missing from the CPU kernels",
                                    path=path) from None
        self._libraries.append(lib)
        return base

    # -------------------------------------------------------------- buffers

    def alloc(self, nbytes: int) -> BufferHandle:
        size = max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)
        raw = np.zeros(size + ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGN
        h = self._next_handle
        self._next_handle += 1
        self._arrays[h] = raw[start:start + size]
        return h

    def free(self, buffer: BufferHandle) -> None:
        del self._arrays[buffer]
        for t in [t for t in self._views if t.buffer == buffer]:
            del self._views[t]

    def write(self, buffer: BufferHandle, offset: int, data: bytes | memoryview) -> None:
        mv = memoryview(data).cast("B")
        arr = self._arrays[buffer]
        if offset + mv.nbytes > arr.nbytes:
            raise ValueError(f"write of {mv.nbytes} bytes at {offset} overflows buffer of "
                             f"{arr.nbytes}")
        arr[offset:offset + mv.nbytes] = np.frombuffer(mv, dtype=np.uint8)

    def view(self, buffer: BufferHandle) -> np.ndarray:
        """The buffer's bytes, without a copy (tests and benchmarks)."""
        return self._arrays[buffer]

    # -------------------------------------------------------------- steps

    def _tensor(self, t: TensorRef):
        v = self._views.get(t)
        if v is None:
            arr = self._arrays[t.buffer]
            count = int(np.prod(t.shape, dtype=np.int64))
            typed = arr[t.offset:t.offset + t.nbytes].view(_NUMPY_DTYPES[t.dtype])[:count]
            # (alignment is the buffer's: offsets inside it follow the plan's own alignment)
            v = self._views[t] = self._ffi.from_dlpack(typed.reshape(t.shape),
                                                       require_alignment=0)
        return v

    def run(self, writes: Sequence[Write], dispatches: Sequence[Call],
            reads: Sequence[Read]) -> list[bytes]:
        for w in writes:
            self.write(w.buffer, w.offset, w.data)
        functions, tensor = self._functions, self._tensor
        for call in dispatches:
            try:
                functions[call.function](*[tensor(t) for t in call.args])
            except Exception as e:  # a kernel's own check (shape, dtype) failed
                raise DeviceError(f"CPU kernel {call.function} failed: {e}") from None
        return [self._arrays[r.buffer][r.offset:r.offset + r.size].tobytes() for r in reads]
