"""Which backend a ``device`` name means on this machine (``Engine(device=...)``,
``wick serve/chat --device``).

* ``"auto"``: an NVIDIA GPU through CUDA when there is one (and NVRTC to compile for it), else
  a real GPU through wgpu-native, else the CPU backend. Never a software Vulkan adapter
  (lavapipe): the CPU kernels are far faster on the same cores.
* ``"cuda"`` (or ``"cuda:N"``): the CUDA backend, or a DeviceError saying what is missing.
* ``"gpu"``: a real GPU, or a DeviceError saying none was found.
* ``"cpu"``: the CPU backend (the artifact's LLVM kernels on every core).
* ``"vulkan"``: wgpu on the best adapter there is, software ones included (lavapipe on a
  machine without a GPU): what tests and WGSL checks use.
* anything else: a substring of a wgpu adapter's name, vendor or backend (e.g. "llvmpipe").
"""

from __future__ import annotations

DEVICES = ("auto", "gpu", "cpu", "vulkan", "cuda")
# "auto" minus CUDA: what "auto" falls back to when CUDA cannot run a model (pyserver/local.py)
AUTO_WITHOUT_CUDA = "auto-no-cuda"
DEVICE_HELP = ("auto: an NVIDIA GPU through CUDA, else a real GPU through Vulkan/Metal, else "
               "the CPU kernels; cuda, gpu, cpu: that one or an error; vulkan: wgpu on any "
               "adapter, software ones (lavapipe) included")


def device(value: str) -> str:
    """``--device``'s type: one of DEVICES, ``cuda:N`` or a wgpu adapter's name part."""
    value = value.lower()
    if value == AUTO_WITHOUT_CUDA or (value.startswith("cuda:") and not (value[5:].isascii() and value[5:].isdigit())):
        raise ValueError(value)
    return value


def create_backend(device: str = "auto"):
    from .cpu_backend import CpuBackend
    from .wgpu_backend import WgpuBackend

    device = (device or "auto").lower()
    if device == "cpu":
        return CpuBackend.create()
    if device == "cuda" or device.startswith("cuda:"):
        from .cuda_backend import CudaBackend

        return CudaBackend.create(device)
    if device == "vulkan":
        return WgpuBackend.create("auto")
    if device not in ("auto", AUTO_WITHOUT_CUDA):
        return WgpuBackend.create(device)
    from ..engine.errors import DeviceError

    cuda = _cuda_if_present() if device == "auto" else None
    if cuda is not None:
        return cuda
    try:
        gpu = WgpuBackend.create("gpu")
    except DeviceError:
        return CpuBackend.create()
    if gpu.is_software:  # (an emulated adapter reporting a GPU type)
        return CpuBackend.create()
    return gpu


def _cuda_if_present():
    """The CUDA backend when this machine has an NVIDIA driver, a GPU and NVRTC; else None."""
    from ..engine.errors import DeviceError

    try:
        from . import nvrtc
        from .cuda_backend import CudaBackend

        nvrtc.library()
        return CudaBackend.create("cuda")
    except DeviceError:
        return None
