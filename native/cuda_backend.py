"""The CUDA backend: runs an artifact's CUDA kernel set (compiler/targets/cuda.py) on an NVIDIA
GPU.

Same contract as the wgpu backend (engine/backend.py), ``kind = "cuda"``: the engine plans a
step as ``Dispatch``es (device buffers, packed scalars, a grid) from the CUDA set's own launches;
this backend adds what each kernel declared (its thread block and shared memory) and launches
them in order on one stream. Its own work is small:

* ``load_library`` compiles ``kernels.cu`` with NVRTC (native/nvrtc.py) for this GPU's
  architecture, once per load, and looks up every kernel;
* each ``Dispatch`` becomes a launch record once (device addresses and scalars in the
  kernel's parameter order, as cuLaunchKernel takes them) and is reused every step after;
* a step the runner names (``Backend.run``'s ``step`` key: a decode step of a given batch
  size has the same key, and so the same launches, every step) is captured as a CUDA graph
  the second time and replayed after that: one driver call per step instead of one per
  kernel, which at a few microseconds each would otherwise cost
  more than an 8B model's whole decode step on an H100.

The driver calls go through ``driver`` (native/cuda_driver.py), which the tests replace.
"""

from __future__ import annotations

import ctypes
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from ..engine.backend import Backend, BufferHandle, Dispatch, Read, Write
from ..engine.errors import ArtifactError, DeviceError
from ..engine.plan import scalar_format

_CTYPES = {"int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64,
           "uint64": ctypes.c_uint64, "float32": ctypes.c_float}
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class _Kernel:
    name: str
    function: int
    block: tuple[int, int, int]
    shared: int
    scalar_format: str
    scalar_types: tuple


@dataclass(frozen=True)
class _Launch:
    """One dispatch as cuLaunchKernel takes it; holds the dispatch (its id is this record's
    key) and the argument values its pointer array points at."""

    dispatch: Dispatch
    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: Any  # (c_void_p * n): the address of each value
    values: tuple


def _arch_number(arch: str) -> int:
    """"sm_80" -> 80."""
    try:
        return int(arch.removeprefix("sm_").removeprefix("compute_"))
    except ValueError:
        raise ArtifactError(f"unknown CUDA architecture {arch!r} in the artifact") from None


class CudaBackend(Backend):
    """``wick.engine.backend.Backend`` on an NVIDIA GPU through CUDA."""

    kind = "cuda"
    features: frozenset[str] = frozenset({"shader-f16"})  # every variant runs
    prefers_f32 = False
    is_software = False
    storage_offset_alignment = 256
    GRAPH_AFTER = 2  # runs of one step (its key) before it is captured as a graph
    MAX_GRAPHS = 64

    def __init__(self, driver=None, *, graphs: bool = True) -> None:
        if driver is None:
            from .cuda_driver import CudaDriver

            driver = CudaDriver()
        self.driver = driver
        major, minor = driver.compute_capability
        self.arch = f"sm_{major}{minor}"
        self.adapter_name = driver.name
        self.name = f"cuda: {driver.name} ({self.arch})"
        self.max_storage_binding = self.max_buffer_size = int(driver.total_memory)
        self.use_graphs = graphs
        self._buffers: dict[BufferHandle, tuple[int, int]] = {}  # handle -> (address, bytes)
        self._next_handle = 1
        self._kernels: list[_Kernel] = []
        self._modules: list = []
        self._launches: dict[int, _Launch] = {}  # id(dispatch) -> its launch record
        # a step's key (Backend.run's ``step``) -> (graph, the dispatches it runs)
        self._graphs: OrderedDict[Hashable, tuple[int, list[Dispatch]]] = OrderedDict()
        self._runs: dict[Hashable, int] = {}  # steps not yet captured: runs so far
        self.graph_launches = 0  # steps replayed from a graph (benchmarks report it)

    @classmethod
    def create(cls, device: str = "cuda") -> CudaBackend:
        """``"cuda"`` or ``"cuda:N"`` (the N-th GPU)."""
        from .cuda_driver import CudaDriver

        _, _, ordinal = device.partition(":")
        if ordinal and not (ordinal.isascii() and ordinal.isdigit()):
            raise DeviceError(f"unknown device {device!r}: say cuda or cuda:N (N = 0, 1, ...)")
        return cls(CudaDriver(int(ordinal or 0)))

    # -------------------------------------------------------------- kernels

    def load_library(self, entry: dict, path: str, data: bytes) -> int:
        from . import nvrtc

        self.driver.make_current()
        need = _arch_number(entry["arch"])
        if _arch_number(self.arch) < need:
            raise DeviceError(f"{self.name}: the artifact's CUDA kernels need sm_{need} or "
                              "newer; run this GPU through Vulkan (--device vulkan)")
        image = nvrtc.compile_cuda(data, self.arch, name=path.rsplit("/", 1)[-1])
        module = self.driver.load_module(image)
        self._modules.append(module)
        base = len(self._kernels)
        for k in entry["kernels"]:
            dtypes = k["scalar_dtypes"]
            try:
                types = tuple(_CTYPES[d] for d in dtypes)
            except KeyError as e:
                raise ArtifactError(f"CUDA kernel {k['name']}: scalar type {e} is not supported",
                                    path=path) from None
            self._kernels.append(_Kernel(k["name"], self.driver.function(module, k["name"], k["shared"]),
                                         tuple(k["block"]), int(k["shared"]),
                                         scalar_format(dtypes), types))
        return base

    def load_kernels(self, kernels) -> int:
        raise DeviceError("the CUDA backend runs CUDA kernels, not WGSL (engine/backend.py)")

    # -------------------------------------------------------------- buffers

    def alloc(self, nbytes: int) -> BufferHandle:
        size = max(256, -(-int(nbytes) // 256) * 256)
        self.driver.make_current()
        address = self.driver.malloc(size)  # zero-filled, as WebGPU buffers are
        h = self._next_handle
        self._next_handle += 1
        self._buffers[h] = (address, size)
        return h

    def free(self, buffer: BufferHandle) -> None:
        self.driver.make_current()
        address, _ = self._buffers.pop(buffer)
        # its launches go, and every graph (rare: a buffer the engine outgrew, a fill's spec)
        self._launches = {k: v for k, v in self._launches.items()
                          if all(s.buffer != buffer for s in v.dispatch.storage)}
        self._drop_graphs()
        self.driver.free(address)

    def close(self) -> None:
        """Release everything on the device: buffers, graphs, modules, stream, context (a
        benchmark measuring several models, or another library, in one process)."""
        self.driver.make_current()
        self._drop_graphs()
        self._launches.clear()
        for address, _ in self._buffers.values():
            self.driver.free(address)
        self._buffers.clear()
        for module in self._modules:
            self.driver.unload_module(module)
        self._modules.clear()
        self._kernels.clear()
        self.driver.close()

    def _drop_graphs(self) -> None:
        for graph, _ in self._graphs.values():
            self.driver.destroy_graph(graph)
        self._graphs.clear()
        self._runs.clear()

    def _address(self, buffer: BufferHandle, offset: int, nbytes: int) -> int:
        address, size = self._buffers[buffer]
        if offset < 0 or offset + nbytes > size:
            raise ValueError(f"{nbytes} bytes at {offset} overflow buffer {buffer} of {size}")
        return address + offset

    def write(self, buffer: BufferHandle, offset: int, data: bytes | memoryview) -> None:
        self.driver.make_current()
        self.driver.upload(self._address(buffer, offset, memoryview(data).nbytes), data)
        self.driver.synchronize()

    # -------------------------------------------------------------- steps

    def _launch(self, d: Dispatch) -> _Launch:
        hit = self._launches.get(id(d))
        if hit is not None and hit.dispatch is d:
            return hit
        k = self._kernels[d.kernel]
        values = [ctypes.c_uint64(self._address(s.buffer, s.offset, 0)) for s in d.storage]
        scalars = struct.unpack(k.scalar_format, d.uniform) if k.scalar_types else ()
        values += [t(v) for t, v in zip(k.scalar_types, scalars)]
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        gx, gy, gz = d.grid
        if gy > MAX_GRID_YZ or gz > MAX_GRID_YZ or gx >= 1 << 31:
            raise DeviceError(f"CUDA kernel {k.name}: grid {d.grid} over CUDA's limits")
        launch = _Launch(d, k.function, (gx, gy, gz), k.block, k.shared, params, tuple(values))
        self._launches[id(d)] = launch
        return launch

    def _run_launches(self, launches: list[_Launch]) -> None:
        drv = self.driver
        for l in launches:
            drv.launch(l.function, l.grid, l.block, l.shared, l.params)

    def run(self, writes: Sequence[Write], dispatches: Sequence[Dispatch],
            reads: Sequence[Read], step: Hashable | None = None) -> list[bytes]:
        drv = self.driver
        drv.make_current()
        for w in writes:
            drv.upload(self._address(w.buffer, w.offset, len(w.data)), w.data)
        if dispatches:
            self._dispatch(list(dispatches), step)
        outs = [drv.download(self._address(r.buffer, r.offset, r.size), r.size) for r in reads]
        drv.synchronize()
        return [bytes(o) for o in outs]

    def _dispatch(self, dispatches: list[Dispatch], step: Hashable | None) -> None:
        """Launch a step's dispatches: the graph of its ``step`` key when that step ran
        before, else one by one (capturing a graph on the GRAPH_AFTER-th run of a step). The
        same key always brings the same dispatches (Backend's docstring); a one-off step
        (no key) is never captured."""
        known = self._graphs.get(step) if step is not None else None
        if known is not None:
            self._graphs.move_to_end(step)
            self.driver.launch_graph(known[0])
            self.graph_launches += 1
            return
        launches = [self._launch(d) for d in dispatches]
        if step is None or not self.use_graphs:
            self._run_launches(launches)
            return
        runs = self._runs.get(step, 0) + 1
        if runs >= self.GRAPH_AFTER:
            self._capture(step, dispatches, launches)
            return
        if len(self._runs) > 4096:  # (prefill steps of many lengths: forget them)
            self._runs.clear()
        self._runs[step] = runs
        self._run_launches(launches)

    def _capture(self, key: Hashable, dispatches: list[Dispatch], launches: list[_Launch]) -> None:
        drv = self.driver
        drv.begin_capture()
        try:
            self._run_launches(launches)
        except BaseException:
            try:  # end the capture (the stream is unusable inside one) and drop its graph
                drv.destroy_graph(drv.end_capture())
            except Exception:  # noqa: BLE001 - the launch's error is the one to report
                pass
            raise
        graph = drv.end_capture()
        self._runs.pop(key, None)
        old = self._graphs.pop(key, None)
        if old is not None:
            drv.destroy_graph(old[0])
        self._graphs[key] = (graph, dispatches)
        while len(self._graphs) > self.MAX_GRAPHS:
            evicted = self._graphs.popitem(last=False)[1]
            drv.destroy_graph(evicted[0])
        drv.launch_graph(graph)
        self.graph_launches += 1
