"""The backend contract: the only way the engine touches a device.

A backend knows nothing about models. It compiles kernels once, owns buffers, and runs one
step = (small uploads, a list of dispatches, small readbacks) as ONE encoder and ONE submit.
Implementations (subclasses of ``Backend``): ``wick.native.wgpu_backend.WgpuBackend``
(wgpu-native), ``wick.native.cpu_backend.CpuBackend`` (the CPU kernel set),
``wick.native.cuda_backend.CudaBackend`` (the CUDA kernel set), and in the browser
``wasm/wick_web/backend.py``'s two, over ``web/src/executor.ts`` (WebGPU in a worker) and
``web/src/wasm_executor.ts`` (the WebAssembly kernel set in a worker).

The kernel sets run the same plans (``Backend.kind``):

* ``"webgpu"``: WGSL kernels; a plan call becomes ``Dispatch``es (the ABI below).
* ``"cpu"``: one native library holding each TIR function whole (compiler/targets/cpu.py); a
  plan call becomes one ``Call`` with its tensors, and the function reads their shapes itself.
* ``"wasm"`` / ``"wasm_threads"``: the same, as one WebAssembly module (compiler/targets/wasm.py),
  on one thread or over a shared memory with helper threads; ``"wasm_relaxed"`` /
  ``"wasm_threads_relaxed"`` the same compiled with relaxed SIMD (fused multiply-adds), where the
  browser has it (artifact.py ``WASM_KINDS``).
* ``"cuda"``: CUDA C the backend compiles with NVRTC (compiler/targets/cuda.py), with launches
  of its own; a plan call becomes ``Dispatch``es as for WebGPU.

Kernel ABI (what TVM's WebGPU codegen emits, see docs/artifact.md): storage buffers at bindings
``0..B-1`` of group 0 in the kernel's own order, each ``read`` or ``read_write``; then, when the
kernel has scalars, one uniform buffer at binding ``B`` holding the POD scalars (4 bytes each)
followed by ``packGridDimX: u32``. The engine packs that uniform; the backend only binds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

BufferHandle = int

DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint8": 1,
               "int8": 1, "bool": 1}
# DLPack (type code, bits) of the same dtypes, which a library kernel checks of its tensors
# (the cpu and wasm backends describe tensors to it): 0 int, 1 uint, 2 float, 6 bool
DLPACK_DTYPES = {"float32": (2, 32), "float16": (2, 16), "int32": (0, 32), "uint32": (1, 32),
                 "int64": (0, 64), "uint8": (1, 8), "int8": (0, 8), "bool": (6, 8)}


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor living in a device buffer."""

    buffer: BufferHandle
    offset: int  # bytes
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a function of a CPU kernel library, on these tensors (its parameters)."""

    function: int  # load_library's return value + index in the names given to it
    args: tuple[TensorRef, ...]


@dataclass(frozen=True, slots=True)
class KernelSpec:
    name: str
    wgsl: str  # full WGSL module source with one entry point
    entry_point: str
    storage_access: tuple[str, ...]  # per storage binding: "read" | "read_write"
    uniform: bool  # True when binding len(storage_access) is the scalar uniform


@dataclass(frozen=True, slots=True)
class KernelSet:
    """A kernel set to load (``Backend.load``): the manifest's ``kernel_sets[kind]`` ``entry``,
    with what its form needs: "shaders", the WGSL ``kernels`` to compile (those the plans
    call); "library" and "source", the ``path`` of its one file and that file's verified
    ``data``."""

    form: str  # engine/artifact.py FORMS
    entry: dict
    kernels: tuple[KernelSpec, ...] = ()
    path: str = ""
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class BufferSlice:
    buffer: BufferHandle
    offset: int  # bytes; a multiple of the device's minStorageBufferOffsetAlignment
    size: int  # bytes; a multiple of 4


@dataclass(frozen=True, slots=True)
class Dispatch:
    kernel: int  # load_kernels' return value + index in the list given to it
    storage: tuple[BufferSlice, ...]  # one per storage binding, in the kernel's binding order
    uniform: bytes  # packed scalars + packGridDimX; b"" when the kernel has no uniform
    grid: tuple[int, int, int]  # workgroup counts


@dataclass(frozen=True, slots=True)
class Write:
    buffer: BufferHandle
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Read:
    buffer: BufferHandle
    offset: int
    size: int


class Backend:
    """What a device must do for the engine: the base of every backend (native wgpu, CPU and
    CUDA; the browser's WebGPU and WebAssembly executors; the tests' fakes). The class
    attributes are the defaults a backend overrides where it differs; the methods without one
    raise ``NotImplementedError``.

    Repeated steps: a plan caches its dispatch list per input signature (engine/plan.py
    ``PlanFunction.signature``), so every run of a plan with the same inputs' buffers and
    shapes brings the same ``Dispatch``/``Call`` objects (they are immutable): a backend may
    keep per-dispatch work (encodings, launch records) keyed by a dispatch's identity while it
    holds a reference to it. A step the runner may repeat comes with its ``step`` key (the
    plans it runs and their signatures): the same key always brings the same dispatches, so a
    backend may keep per-step work (CUDA graphs) under it."""

    name: str = "backend"  # e.g. "wgpu: llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)"
    # the manifest's kernel set it runs (``kernel_sets[kind]``): "webgpu" (load_kernels +
    # Dispatch), a library ("cpu", the WASM_KINDS: load_library + Call) or "cuda"
    # (load_library + Dispatch)
    kind: str = "webgpu"
    features: frozenset[str] = frozenset()  # WebGPU feature names, e.g. {"shader-f16"}
    max_storage_binding: int = 128 << 20  # bytes
    max_buffer_size: int = 256 << 20  # bytes
    storage_offset_alignment: int = 256  # bytes
    # its float32 variants are its default (a CPU: f32 is its native width)
    prefers_f32: bool = False
    # an emulated GPU (lavapipe, SwiftShader): expect a few tokens/s at most
    is_software: bool = False
    # a step's readback is a promise (WebGPU in a worker): the runner awaits ``run_async``
    reads_async: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # (a backend with a run_async of its own but no reads_async would never be awaited)
        if "run_async" in vars(cls) and not cls.reads_async:
            raise TypeError(f"{cls.__name__} defines run_async: set reads_async = True")

    def load(self, kernel_set: KernelSet) -> int:
        """Load a kernel set once, at model load (what the engine calls); returns the index of
        its first kernel (``Dispatch.kernel``) or function (``Call.function``): indexes count
        across loads, so several models can share one device. A backend implements the hook of
        the forms it runs: ``load_kernels`` ("shaders") or ``load_library`` ("library",
        "source")."""
        if kernel_set.form == "shaders":
            return self.load_kernels(kernel_set.kernels)
        return self.load_library(kernel_set.entry, kernel_set.path, kernel_set.data)

    def load_kernels(self, kernels: Sequence[KernelSpec]) -> int:
        """(``load``'s hook for "shaders") Compile every kernel into a pipeline; returns the
        index of the first."""
        raise NotImplementedError(f"{self.name} runs no WGSL kernels")

    def load_library(self, entry: dict, path: str, data: bytes) -> int:
        """(``load``'s hook for a set of one file: "library" and "source") Load the set the
        manifest's ``kernel_sets[kind]`` ``entry`` describes (a library's ``functions``, a
        source's ``kernels``, what it was built for), stored at ``path`` with the verified
        bytes ``data``; returns the index of the first function (``Call.function``) or kernel
        (``Dispatch.kernel``)."""
        raise NotImplementedError(f"{self.name} loads no kernel library")

    def alloc(self, nbytes: int) -> BufferHandle:
        """A zero-filled device buffer usable as storage, copy source and copy destination."""
        raise NotImplementedError

    def free(self, buffer: BufferHandle) -> None:
        raise NotImplementedError

    def write(self, buffer: BufferHandle, offset: int, data: bytes | memoryview) -> None:
        """Upload now (weights at load time)."""
        raise NotImplementedError

    def run(
        self, writes: Sequence[Write], dispatches: Sequence[Dispatch | Call], reads: Sequence[Read],
        step: Hashable | None = None,
    ) -> list[bytes]:
        """One step: apply writes, record all dispatches (a CPU backend: calls) in one pass,
        submit once, then read. ``step``: the key of a step that may repeat (see the class
        docstring), None for a one-off.

        Returns the bytes of each read, in order. Blocks until they are available."""
        raise NotImplementedError

    async def run_async(
        self, writes: Sequence[Write], dispatches: Sequence[Dispatch | Call], reads: Sequence[Read],
        step: Hashable | None = None,
    ) -> list[bytes]:
        """The same step where the readback is a promise (``reads_async``)."""
        return self.run(writes, dispatches, reads, step)

    def profile_json(self) -> str:
        """Per-kernel timings so far, as JSON (a backend that keeps them)."""
        return "{}"

    def close(self) -> None:
        """Give back the device (a backend that holds more than memory: a CUDA context)."""
