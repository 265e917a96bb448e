"""native/cuda_driver.py's calls into the driver API, against a stand-in libcuda built from
tests/native/fake_libcuda.c: what the ctypes signatures pass (device pointers, copies, the
kernel parameter array, grid and block, stream capture and graph launches) reaches C as the
CUDA API declares it. The stand-in runs its one kernel on the CPU, so the values arrive too."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from wick.engine.backend import BufferSlice, Dispatch, Read, Write
from wick.engine.errors import DeviceError
from wick.native.cuda_backend import CudaBackend
from wick.native.cuda_driver import CudaDriver

SOURCE = ('typedef long long int64_t;\n'
          'extern "C" __global__ void __launch_bounds__(128) fake_scale_add('
          'float* __restrict__ x, int64_t n, float s) {\n'
          '  int64_t i = blockIdx.x * 128 + threadIdx.x;\n'
          '  if (i < n) x[i] = x[i] * s + 1.0f;\n}\n')
ENTRY = {"arch": "sm_80", "kernels": [{"name": "fake_scale_add", "scalar_dtypes": ["int64", "float32"],
                                       "block": [128, 1, 1], "shared": 0}]}


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda-fake.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out),
                    str(Path(__file__).with_name("fake_libcuda.c"))], check=True)
    return out


def test_backend_runs_a_kernel_through_the_driver_api(fake_libcuda):
    drv = CudaDriver(library=str(fake_libcuda))
    assert (drv.name, drv.compute_capability, drv.total_memory) == ("Fake H100", (9, 0), 80 << 30)
    be = CudaBackend(drv)
    assert be.name == "cuda: Fake H100 (sm_90)"
    base = be.load_library(ENTRY, "art/kernels.cu", SOURCE.encode())  # real NVRTC, sm_90 cubin
    buf = be.alloc(1024)
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    # x = the 3 floats at byte 8 of the buffer: x[i] * 2 + 1
    d = Dispatch(base, (BufferSlice(buf, 8, 12),), struct.pack("<qf", 3, 2.0), (1, 1, 1))
    (raw,) = be.run([Write(buf, 0, struct.pack("<5f", *values))], [d], [Read(buf, 0, 20)], "s")
    assert struct.unpack("<5f", raw) == (1.0, 2.0, 7.0, 9.0, 11.0)
    lib = drv.lib
    launches = ctypes.c_int.in_dll(lib, "fake_launches")
    graph_launches = ctypes.c_int.in_dll(lib, "fake_graph_launches")
    assert (launches.value, graph_launches.value) == (1, 0)
    # the second run of the same step is captured then launched as a graph, the third replayed
    be.run([], [d], [], "s")
    (raw,) = be.run([], [d], [Read(buf, 8, 12)], "s")
    assert struct.unpack("<3f", raw) == (31.0, 39.0, 47.0)  # (x * 2 + 1) twice more
    assert (launches.value, graph_launches.value, be.graph_launches) == (3, 2, 2)
    # device-to-device copies (bench/gpu.py's bandwidth) and frees
    a, b = drv.malloc(64), drv.malloc(64)
    drv.upload(a, bytes(range(64)))
    drv.copy(b, a, 64)
    out = drv.download(b, 64)
    drv.synchronize()
    assert bytes(out) == bytes(range(64))
    drv.free(a)
    drv.free(b)
    be.free(buf)
    be.close()


def test_steps_run_from_other_threads(fake_libcuda):
    """CUDA's context is current per thread: `wick serve` loads on one thread and steps on
    worker threads. The stand-in refuses calls on a thread without it, as CUDA does."""
    import threading

    be = CudaBackend(CudaDriver(library=str(fake_libcuda)))
    base = be.load_library(ENTRY, "art/kernels.cu", SOURCE.encode())
    buf = be.alloc(64)
    d = Dispatch(base, (BufferSlice(buf, 0, 8),), struct.pack("<qf", 2, 3.0), (1, 1, 1))
    results, errors = [], []

    def step():
        try:
            results.append(be.run([Write(buf, 0, struct.pack("<2f", 1.0, 2.0))], [d],
                                  [Read(buf, 0, 8)], "step"))
        except Exception as e:  # (reported below)
            errors.append(e)

    for _ in range(3):  # eager, captured, replayed: each on a fresh thread
        t = threading.Thread(target=step)
        t.start()
        t.join()
    assert errors == []
    assert [struct.unpack("<2f", r[0]) for r in results] == [(4.0, 7.0)] * 3


def test_driver_errors_name_the_call(fake_libcuda):
    be = CudaBackend(CudaDriver(library=str(fake_libcuda)))
    entry = {"arch": "sm_80", "kernels": [{"name": "missing", "scalar_dtypes": [],
                                           "block": [128, 1, 1], "shared": 0}]}
    source = 'extern "C" __global__ void missing() {}'
    with pytest.raises(DeviceError, match=r"cuModuleGetFunction\(missing\) failed: named symbol"):
        be.load_library(entry, "art/kernels.cu", source.encode())
    with pytest.raises(DeviceError, match="no CUDA driver"):
        CudaDriver(library="/nonexistent/libcuda.so")
    with pytest.raises(DeviceError, match="say cuda or cuda:N"):
        CudaBackend.create("cuda:x")
