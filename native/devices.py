"""Which backend a ``device`` name means on this machine (``Engine(device=...)``,
``wick serve/chat --device``).

* ``"auto"``: a real GPU through wgpu-native when there is one, else the CPU backend. Never a
  software Vulkan adapter (lavapipe): the CPU kernels are far faster on the same cores.
* ``"gpu"``: a real GPU, or a DeviceError saying none was found.
* ``"cpu"``: the CPU backend (the artifact's LLVM kernels on every core).
* ``"vulkan"``: wgpu on the best adapter there is, software ones included (lavapipe on a
  machine without a GPU): what tests and WGSL checks use.
* anything else: a substring of a wgpu adapter's name, vendor or backend (e.g. "llvmpipe").
"""

from __future__ import annotations

DEVICES = ("auto", "gpu", "cpu", "vulkan")


def create_backend(device: str = "auto"):
    from .cpu_backend import CpuBackend
    from .wgpu_backend import WgpuBackend

    device = (device or "auto").lower()
    if device == "cpu":
        return CpuBackend.create()
    if device == "vulkan":
        return WgpuBackend.create("auto")
    if device != "auto":
        return WgpuBackend.create(device)
    from ..engine.errors import DeviceError

    try:
        gpu = WgpuBackend.create("gpu")
    except DeviceError:
        return CpuBackend.create()
    if gpu.is_software:  # (an emulated adapter reporting a GPU type)
        return CpuBackend.create()
    return gpu
