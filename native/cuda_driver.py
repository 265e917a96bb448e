"""The CUDA driver API (libcuda, which comes with NVIDIA's driver) through ctypes: the dozen
calls the CUDA backend makes, nothing more.

Why not CuPy or cuda-python: the backend needs device memory, a module loaded from NVRTC's
output, kernel launches on one stream and CUDA graphs; each is one driver call, and going
through ctypes makes ``wick-llm[cuda]`` need nothing but NVRTC (native/nvrtc.py) beside the driver.
Every call is checked; a failure is a DeviceError naming the call and CUDA's own message.

The backend takes any object with these methods (the tests pass a fake one).
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p

from ..engine.errors import DeviceError

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
CUDA_ERROR_NO_DEVICE = 100


def _load(library: str | None = None) -> ctypes.CDLL:
    for name in ([library] if library else ["libcuda.so.1", "libcuda.so", "nvcuda.dll"]):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise DeviceError("no CUDA driver (libcuda) on this machine: CUDA needs an NVIDIA GPU "
                      "and its driver; use --device vulkan or cpu")


class CudaDriver:
    """One device's primary context and one stream."""

    def __init__(self, ordinal: int = 0, library: str | None = None) -> None:
        """``library``: the driver library's path, when it is not on the loader's path."""
        self.lib = lib = _load(library)
        self._keep: list = []  # host buffers of copies in flight
        lib.cuGetErrorString.argtypes = [c_int, POINTER(c_char_p)]
        status = lib.cuInit(0)
        if status == CUDA_ERROR_NO_DEVICE:
            raise DeviceError("no CUDA device: the driver found no NVIDIA GPU")
        self._check(status, "cuInit")
        count = c_int()
        self._check(lib.cuDeviceGetCount(byref(count)), "cuDeviceGetCount")
        if ordinal >= count.value:
            raise DeviceError(f"no CUDA device {ordinal}: this machine has {count.value}")
        self.device = c_int()
        self._check(lib.cuDeviceGet(byref(self.device), ordinal), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        self._check(lib.cuDeviceGetName(name, 256, self.device), "cuDeviceGetName")
        self.name = name.value.decode(errors="replace")
        major, minor = c_int(), c_int()
        self._check(lib.cuDeviceGetAttribute(byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                             self.device), "cuDeviceGetAttribute")
        self._check(lib.cuDeviceGetAttribute(byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                             self.device), "cuDeviceGetAttribute")
        self.compute_capability = (major.value, minor.value)
        total = c_size_t()
        self._check(lib.cuDeviceTotalMem_v2(byref(total), self.device), "cuDeviceTotalMem")
        self.total_memory = total.value
        self.context = c_void_p()
        self._check(lib.cuDevicePrimaryCtxRetain(byref(self.context), self.device),
                    "cuDevicePrimaryCtxRetain")
        self._thread = threading.local()  # where the context is current: per thread in CUDA
        self.make_current()
        self.stream = c_void_p()
        self._check(lib.cuStreamCreate(byref(self.stream), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        lib.cuMemcpyHtoDAsync_v2.argtypes = [c_uint64, c_void_p, c_size_t, c_void_p]
        lib.cuMemcpyDtoHAsync_v2.argtypes = [c_void_p, c_uint64, c_size_t, c_void_p]
        lib.cuMemsetD8Async.argtypes = [c_uint64, ctypes.c_ubyte, c_size_t, c_void_p]
        lib.cuMemFree_v2.argtypes = [c_uint64]
        lib.cuLaunchKernel.argtypes = [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                       c_uint, c_void_p, c_void_p, c_void_p]
        lib.cuGraphLaunch.argtypes = [c_void_p, c_void_p]

    def make_current(self) -> None:
        """Make the device's context current on the calling thread (CUDA keeps one per
        thread: `wick serve` loads on one thread and steps on others); once per thread."""
        if not getattr(self._thread, "current", False):
            self._check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            self._thread.current = True

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = c_char_p()
            self.lib.cuGetErrorString(status, byref(message))
            text = message.value.decode() if message.value else f"error {status}"
            raise DeviceError(f"CUDA {what} failed: {text}")

    # ---------------------------------------------------------------- memory

    def malloc(self, nbytes: int) -> int:
        ptr = c_uint64()
        self._check(self.lib.cuMemAlloc_v2(byref(ptr), c_size_t(nbytes)), f"cuMemAlloc({nbytes})")
        self._check(self.lib.cuMemsetD8Async(ptr.value, 0, nbytes, self.stream), "cuMemsetD8")
        return ptr.value

    def free(self, ptr: int) -> None:
        self.synchronize()  # (work in flight may still read it)
        self._check(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def upload(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        """Start copying ``data`` to ``ptr``; it must stay alive until ``synchronize``."""
        n = memoryview(data).nbytes
        host = (ctypes.c_char * n).from_buffer_copy(data) if isinstance(data, (bytes, memoryview)) \
            else (ctypes.c_char * n).from_buffer(data)
        self._keep.append(host)
        self._check(self.lib.cuMemcpyHtoDAsync_v2(ptr, host, n, self.stream), "cuMemcpyHtoD")

    def download(self, ptr: int, nbytes: int) -> bytearray:
        """Start copying ``nbytes`` from ``ptr`` into the returned buffer (valid after
        ``synchronize``)."""
        out = bytearray(nbytes)
        host = (ctypes.c_char * nbytes).from_buffer(out)
        self._keep.append(host)
        self._check(self.lib.cuMemcpyDtoHAsync_v2(host, ptr, nbytes, self.stream), "cuMemcpyDtoH")
        return out

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy on the stream (bench/gpu.py measures bandwidth with it)."""
        self._check(self.lib.cuMemcpyDtoDAsync_v2(c_uint64(dst), c_uint64(src), c_size_t(nbytes),
                                                  self.stream), "cuMemcpyDtoD")

    def synchronize(self) -> None:
        self._check(self.lib.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        self._keep = []

    # ---------------------------------------------------------------- kernels

    def load_module(self, image: bytes) -> c_void_p:
        module = c_void_p()
        self._check(self.lib.cuModuleLoadData(byref(module), image), "cuModuleLoadData")
        return module

    def unload_module(self, module: c_void_p) -> None:
        self._check(self.lib.cuModuleUnload(module), "cuModuleUnload")

    def close(self) -> None:
        """Destroy the stream and release the primary context (after freeing everything)."""
        self.synchronize()
        self._check(self.lib.cuStreamDestroy_v2(self.stream), "cuStreamDestroy")
        self._check(self.lib.cuDevicePrimaryCtxRelease_v2(self.device), "cuDevicePrimaryCtxRelease")

    def function(self, module: c_void_p, name: str, shared: int = 0) -> int:
        f = c_void_p()
        self._check(self.lib.cuModuleGetFunction(byref(f), module, name.encode()),
                    f"cuModuleGetFunction({name})")
        if shared > 48 * 1024:  # more dynamic shared memory than the default needs opting in
            self._check(self.lib.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    shared), "cuFuncSetAttribute")
        return f.value

    def launch(self, function: int, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared: int, params: ctypes.Array) -> None:
        """``params``: an array of pointers, one to each argument's value (cuLaunchKernel)."""
        self._check(self.lib.cuLaunchKernel(function, *grid, *block, shared, self.stream,
                                            params, None), "cuLaunchKernel")

    # ---------------------------------------------------------------- graphs

    def begin_capture(self) -> None:
        self._check(self.lib.cuStreamBeginCapture_v2(self.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                    "cuStreamBeginCapture")

    def end_capture(self) -> int:
        """The launches since ``begin_capture`` as an executable graph."""
        graph, exe = c_void_p(), c_void_p()
        self._check(self.lib.cuStreamEndCapture(self.stream, byref(graph)), "cuStreamEndCapture")
        try:
            self._check(self.lib.cuGraphInstantiateWithFlags(byref(exe), graph, c_uint64(0)),
                        "cuGraphInstantiate")
        finally:
            self.lib.cuGraphDestroy(graph)
        return exe.value

    def launch_graph(self, graph: int) -> None:
        self._check(self.lib.cuGraphLaunch(graph, self.stream), "cuGraphLaunch")

    def destroy_graph(self, graph: int) -> None:
        self.lib.cuGraphExecDestroy(c_void_p(graph))

    # ---------------------------------------------------------------- events (profiling)

    def event(self) -> c_void_p:
        """A timing event (bench/gpu_profile.py times each kernel of a step between two)."""
        e = c_void_p()
        self._check(self.lib.cuEventCreate(byref(e), 0), "cuEventCreate")
        return e

    def record(self, event: c_void_p) -> None:
        self._check(self.lib.cuEventRecord(event, self.stream), "cuEventRecord")

    def elapsed_ms(self, start: c_void_p, end: c_void_p) -> float:
        ms = ctypes.c_float()
        self._check(self.lib.cuEventElapsedTime(byref(ms), start, end), "cuEventElapsedTime")
        return ms.value

    def destroy_event(self, event: c_void_p) -> None:
        self.lib.cuEventDestroy_v2(event)
