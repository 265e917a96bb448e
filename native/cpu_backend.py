"""The CPU backend: runs an artifact's CPU kernel set (compiler/targets/cpu.py) natively.

Same contract as the wgpu backend (engine/backend.py), ``kind = "cpu"``: buffers are host
memory, and a step is a list of ``Call``s, each one native function of the artifact's library
called on its tensors. The library is TVM LLVM code with TVM's packed calling convention,
linked with wick's kernel runtime (compiler/kernel_runtime.c: the thread pool behind
``T.parallel`` loops, scratch memory, error messages), so it is loaded with ctypes and needs
nothing of TVM: this is the whole CPU runtime (the twin of web/src/wasm_executor.ts).

Buffers are 64-byte aligned numpy arrays. A call's arguments (16-byte TVMFFIAny values, each
pointing at a DLTensor, and their shapes) are packed once per distinct argument list and
reused. A step's calls go to the library in one foreign call (``wick_run_calls``: arrays of
function and argument addresses, kept per distinct sequence of calls), so a step costs the
kernels plus a few microseconds; a library built before that entry point gets one ctypes call
per kernel (~2.5 us each).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct
from typing import Hashable, Sequence

import numpy as np

from ..engine.artifact import cpu_kernels_misfit
from ..engine.backend import DLPACK_DTYPES, Backend, BufferHandle, Call, Read, TensorRef, Write
from ..engine.errors import ArtifactError, DeviceError

ALIGN = 64  # bytes: what TVM's CPU code assumes of a tensor's data pointer


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
def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on: read once, before anything pins the calling thread
    to one core (TVM's pool does, where a compile in this process started it: a later backend
    would otherwise see one core, and the pool's helpers, started from that thread, inherit
    its set). Empty where the OS does not say."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return ()


def default_threads() -> int:
    """One thread per core this process may run on."""
    return len(allowed_cpus()) or os.cpu_count() or 1


# TVM's packed calling convention, native 64-bit layout: `int f(void* self, TVMFFIAny* args,
# int num_args, TVMFFIAny* result)`; TVMFFIAny {int32 type_index; uint32 pad; 8-byte value},
# DLTensor {void* data; {int32 device_type, device_id}; int32 ndim; {uint8 code, uint8 bits,
# uint16 lanes}; int64* shape; int64* strides (null: compact); uint64 byte_offset}.
_ANY = struct.Struct("<iIQ")
_TENSOR = struct.Struct("<QiiiBBHQQQ")
_FFI_DLTENSOR_PTR = 7
_DEVICE_CPU = 1
_PACKED_CALLS_KEPT = 1 << 14  # distinct argument lists kept packed (then packed afresh)
_STEPS_KEPT = 256  # distinct call sequences kept as address arrays (then built afresh)
_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                           ctypes.c_void_p)


class _Pool:
    """The process's one thread pool: that of the first kernel library loaded (libraries are
    never unloaded). Later libraries run their parallel loops on it, so helpers never spin on
    the cores twice over (a draft model beside its target, two models served at once)."""

    owner: "_Library | None" = None
    threads = 0

    @classmethod
    def adopt(cls, lib: "_Library") -> None:
        if cls.owner is None:
            cls.owner = lib
        else:
            launch = ctypes.cast(cls.owner.dll.wick_parallel_launch, ctypes.c_void_p).value
            lib.dll.wick_use_pool(ctypes.c_void_p(launch))

    @classmethod
    def use_threads(cls, threads: int) -> None:
        if cls.threads != threads and cls.owner is not None:
            cpus = allowed_cpus()
            array = (ctypes.c_int32 * max(1, len(cpus)))(*cpus)
            cls.owner.dll.wick_set_threads(ctypes.c_int32(threads), array,
                                           ctypes.c_int32(len(cpus)))
            cls.threads = threads


class _Library:
    """One loaded kernel library: its handle (never unloaded: the pool's threads may live in
    it) and the runtime's entry points."""

    def __init__(self, path: str) -> None:
        # (dlopen reads the file, not its name: a huggingface_hub cache blob loads as is)
        self.dll = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        self.dll.wick_init()
        self.dll.wick_set_threads.restype = ctypes.c_int32
        self.dll.wick_error.restype = ctypes.c_char_p
        self.dll.wick_helper_tasks.restype = ctypes.c_int32
        # (None: a library built before it; its calls then go one by one)
        self.run_calls = getattr(self.dll, "wick_run_calls", None)
        if self.run_calls is not None:
            self.run_calls.restype = ctypes.c_int32
            self.run_calls.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p]
        _Pool.adopt(self)

    def function(self, name: str):
        return _KERNEL(("__tvm_ffi_" + name, self.dll))

    def error(self) -> str:
        """The last kernel error of this thread, cleared once read."""
        text = (self.dll.wick_error() or b"").decode("utf-8", "replace")
        self.dll.wick_clear_error()
        return text or "(no message)"

    @staticmethod
    def helper_tasks() -> int:
        """Parallel-loop tasks the pool's helper threads ran so far (tests)."""
        return _Pool.owner.dll.wick_helper_tasks() if _Pool.owner else 0


class CpuBackend(Backend):
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
        self.threads = int(threads or default_threads())  # (reads allowed_cpus now)
        self.adapter_name = cpu_name()
        self.name = f"cpu: {self.adapter_name} ({self.threads} threads)"
        self._arrays: dict[BufferHandle, np.ndarray] = {}  # handle -> aligned uint8 array
        self._next_handle = 1
        self._functions: list = []  # (ctypes function, its library, its name, its address)
        self._libraries: list[_Library] = []
        # argument list -> (packed block, its address, count): packed once, reused
        self._packed: dict[tuple[TensorRef, ...], tuple[object, int, int]] = {}
        # a step (its ``step`` key; a keyless one by its calls' ids, the calls kept alive so
        # that no id is reused) -> the arrays wick_run_calls takes, and the packed blocks they
        # point into (kept alive too)
        self._steps: dict[Hashable, tuple] = {}
        self._run_calls = None  # a library's wick_run_calls, when every library has one
        self._result = ctypes.create_string_buffer(_ANY.size)  # (kernels return nothing)

    @classmethod
    def create(cls, threads: int | None = None) -> CpuBackend:
        return cls(threads)

    # -------------------------------------------------------------- kernels

    def load_library(self, entry: dict, path: str, data: bytes) -> int:
        misfit = cpu_kernels_misfit(entry)
        if misfit:
            raise ArtifactError(misfit, path=path, code="artifact_stale")
        try:
            lib = _Library(path)
        except (OSError, AttributeError) as e:
            raise ArtifactError(f"cannot load the CPU kernels: {e}", path=path) from None
        base = len(self._functions)
        for name in entry["functions"]:
            try:
                fn = lib.function(name)
                self._functions.append((fn, lib, name, ctypes.cast(fn, ctypes.c_void_p).value))
            except AttributeError:
                raise ArtifactError(f"function {name!r} missing from the CPU kernels",
                                    path=path) from None
        self._libraries.append(lib)
        self._run_calls = (self._libraries[0].run_calls
                           if all(lib.run_calls is not None for lib in self._libraries) else None)
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
        self._packed.clear()  # (packed addresses may point into it; frees are rare)
        self._steps.clear()

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

    def _pack(self, args: tuple[TensorRef, ...]) -> tuple[object, int, int]:
        """The call block of ``args``: the TVMFFIAny array, then the DLTensors, then their
        shapes, in one buffer that stays alive with the cache entry."""
        n = len(args)
        tensors_at = n * _ANY.size
        shapes_at = tensors_at + n * _TENSOR.size
        block = ctypes.create_string_buffer(shapes_at + 8 * sum(len(t.shape) for t in args))
        base = ctypes.addressof(block)
        shape = shapes_at
        for i, t in enumerate(args):
            arr = self._arrays[t.buffer]
            if t.offset + t.nbytes > arr.nbytes:
                raise DeviceError(f"tensor of {t.nbytes} bytes at {t.offset} overflows buffer "
                                  f"{t.buffer} of {arr.nbytes}")
            code, bits = DLPACK_DTYPES[t.dtype]
            tensor = base + tensors_at + i * _TENSOR.size
            _ANY.pack_into(block, i * _ANY.size, _FFI_DLTENSOR_PTR, 0, tensor)
            # (offsets keep the plan's own alignment; the buffer is 64-byte aligned)
            _TENSOR.pack_into(block, tensors_at + i * _TENSOR.size, arr.ctypes.data + t.offset,
                              _DEVICE_CPU, 0, len(t.shape), code, bits, 1, base + shape, 0, 0)
            struct.pack_into(f"<{len(t.shape)}q", block, shape, *t.shape)
            shape += 8 * len(t.shape)
        if len(self._packed) >= _PACKED_CALLS_KEPT:
            self._packed.clear()
        packed = self._packed[args] = (block, base, n)
        return packed

    def run(self, writes: Sequence[Write], dispatches: Sequence[Call],
            reads: Sequence[Read], step: Hashable | None = None) -> list[bytes]:
        for w in writes:
            self.write(w.buffer, w.offset, w.data)
        _Pool.use_threads(self.threads)  # (another backend may have set another count)
        result = ctypes.addressof(self._result)
        if self._run_calls is not None:
            # a step the runner may repeat is known by its key; a one-off by its calls
            key = step if step is not None else tuple(map(id, dispatches))
            prepared = self._steps.get(key) or self._prepare(key, dispatches)
            failed = self._run_calls(len(prepared[0]), prepared[2], prepared[3], prepared[4],
                                     result)
            if failed >= 0:
                self._raise_failed(dispatches[failed])
        else:
            functions, packed, pack = self._functions, self._packed, self._pack
            for call in dispatches:
                block = packed.get(call.args) or pack(call.args)
                if functions[call.function][0](None, block[1], block[2], result):
                    self._raise_failed(call)  # (a kernel's own check: shape, dtype)
        return [self._arrays[r.buffer][r.offset:r.offset + r.size].tobytes() for r in reads]

    def _prepare(self, key: Hashable, dispatches: Sequence[Call]) -> tuple:
        """The address arrays of a sequence of calls for wick_run_calls, kept for its next step."""
        calls = list(dispatches)
        blocks = [self._packed.get(c.args) or self._pack(c.args) for c in calls]
        n = len(calls)
        fns = (ctypes.c_void_p * n)(*[self._functions[c.function][3] for c in calls])
        args = (ctypes.c_void_p * n)(*[b[1] for b in blocks])
        counts = (ctypes.c_int32 * n)(*[b[2] for b in blocks])
        if len(self._steps) >= _STEPS_KEPT:
            self._steps.clear()
        step = self._steps[key] = (calls, blocks, fns, args, counts)
        return step

    def _raise_failed(self, call: Call) -> None:
        fn = self._functions[call.function]
        raise DeviceError(f"CPU kernel {fn[2]} failed: {fn[1].error()}")
