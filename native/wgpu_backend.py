"""The native backend: TVM-compiled WGSL kernels run on wgpu-native through wgpu-py.

Three small things, as in tinygrad's ``ops_webgpu``: an allocator (``alloc``/``free``/``write``,
integer handles over ``GPUBuffer``s), programs (``load_kernels``: one shader module, bind group
layout and pipeline per kernel, built once) and the device (``create``/``run``: one step is one
command encoder, one compute pass, one submit, one readback).

Steady state creates no GPU objects: bind groups are cached by ``(kernel, storage slices)``; all
uniforms of a step go into one uniform buffer at 256-byte-aligned dynamic offsets with a single
``queue.write_buffer``; readbacks are copied into one MAP_READ staging buffer that only grows.

The kernel ABI (bindings, uniform layout, grid folding) is described in docs/kernel-abi.md; the
contract is ``wick.engine.backend.Backend``.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from wick.engine.backend import Backend, BufferHandle, Dispatch, KernelSpec, Read, Write

from wick.engine.errors import DeviceError, MissingFeatureError


class KernelCompileError(DeviceError):
    """A kernel's WGSL failed to compile or does not match its KernelSpec; names the kernel."""

    default_code = "kernel_compile_error"


# WebGPU feature names wick cares about -> wgpu-native's spelling (which differs for subgroups).
OPTIONAL_FEATURES = {"shader-f16": "shader-f16", "subgroups": "subgroup", "timestamp-query": "timestamp-query"}
# Limits requested at the adapter's maximum (larger is better for all of these).
MAX_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffers-per-shader-stage",
)
UNIFORM_SLOT = 256  # dynamic uniform offsets are multiples of this (WebGPU's default alignment)
_ADAPTER_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}
_CPU_NAMES = ("cpu", "lavapipe", "llvmpipe", "swiftshader")


# ---------------------------------------------------------------- kernel ABI helpers (pure)


_STORAGE_RE = re.compile(
    r"@group\(0\)\s*@binding\((\d+)\)\s*var<storage,\s*(read_write|read)>\s*(\w+)\s*:"
)
_UNIFORM_RE = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<uniform>\s*(\w+)\s*:\s*(\w+)")
_STRUCT_RE = re.compile(r"struct\s+(\w+)\s*\{([^}]*)\}")
_SCALAR_BYTES = {"i32": 4, "u32": 4, "f32": 4}


@dataclass(frozen=True, slots=True)
class WgslInterface:
    """What a TVM WGSL module declares: its bindings and its uniform struct."""

    storage_access: tuple[str, ...]  # per binding 0..B-1: "read" | "read_write"
    storage_names: tuple[str, ...]  # e.g. ("A_ptr", "B_ptr", "C_ptr")
    uniform_fields: tuple[tuple[str, str], ...]  # (name, wgsl type), last is packGridDimX
    uniform_binding: int | None  # B, or None when the module has no uniform
    uses_f16: bool  # `enable f16;` present
    uses_subgroups: bool  # `enable subgroups;` or subgroup builtins

    @property
    def uniform_size(self) -> int:
        """Bytes bound for the uniform: 4 per field, rounded up to 16."""
        return _round_up(4 * len(self.uniform_fields), 16) if self.uniform_binding is not None else 0


def parse_wgsl_interface(wgsl: str) -> WgslInterface:
    """Read binding order, access modes and the POD struct from a TVM WGSL module."""
    storage = sorted((int(b), acc, name) for b, acc, name in _STORAGE_RE.findall(wgsl))
    if [b for b, _, _ in storage] != list(range(len(storage))):
        raise ValueError(f"storage bindings are not 0..B-1: {[b for b, _, _ in storage]}")
    fields: tuple[tuple[str, str], ...] = ()
    ubinding = None
    um = _UNIFORM_RE.search(wgsl)
    if um:
        ubinding = int(um.group(1))
        structs = {m.group(1): m.group(2) for m in _STRUCT_RE.finditer(wgsl)}
        body = structs.get(um.group(3), "")
        fields = tuple(
            (n.strip(), t.strip())
            for n, t in (f.split(":", 1) for f in body.replace("\n", " ").split(",") if ":" in f)
        )
        for name, ty in fields:
            if ty not in _SCALAR_BYTES:
                raise ValueError(f"uniform field {name}: {ty} is not a 4-byte scalar")
    return WgslInterface(
        storage_access=tuple(acc for _, acc, _ in storage),
        storage_names=tuple(name for _, _, name in storage),
        uniform_fields=fields,
        uniform_binding=ubinding,
        uses_f16=re.search(r"^\s*enable\s+f16\s*;", wgsl, re.M) is not None,
        uses_subgroups=re.search(r"enable\s+subgroups\s*;|\bsubgroup[A-Z]\w*\(|subgroup_size", wgsl)
        is not None,
    )


def kernel_spec_from_wgsl(name: str, wgsl: str, entry_point: str | None = None) -> KernelSpec:
    """A KernelSpec whose bindings are read from the WGSL (entry point defaults to ``name``)."""
    iface = parse_wgsl_interface(wgsl)
    return KernelSpec(
        name=name,
        wgsl=wgsl,
        entry_point=entry_point or name,
        storage_access=iface.storage_access,
        uniform=iface.uniform_binding is not None,
    )


@functools.lru_cache(maxsize=1024)
def fold_grid(grid_x: int, limit: int = 65535) -> tuple[int, int]:
    """Fold a 1-D grid above ``limit`` into (x, z) with x, z <= limit and x*z >= grid_x; the
    kernel recovers blockIdx.z * gridDim.x + blockIdx.x.

    Exact (x*z == grid_x) whenever grid_x has such a factorization, because TVM's guard is
    ``flat > packGridDimX``, not ``>=``: with padding, the group flat == grid_x still runs, and
    a kernel with no bounds check of its own (exactly divisible static shapes) then writes one
    workgroup past its output. Otherwise (e.g. a prime grid_x) it pads, as tvmjs's halving does.
    """
    if grid_x <= limit:
        return grid_x, 1
    zmin = -(-grid_x // limit)
    for z in range(zmin, min(limit, zmin + 4096) + 1):
        if grid_x % z == 0:
            return grid_x // z, z
    if zmin > limit:
        raise ValueError(f"grid of {grid_x} workgroups exceeds {limit} x {limit}")
    return -(-grid_x // zmin), zmin  # padded by fewer than z groups


def pack_uniform(values: Sequence[int | float], types: Sequence[str], pack_grid_dim_x: int) -> bytes:
    """The POD uniform: each scalar 4 bytes little-endian in declaration order (``types`` are
    TVM dtypes "int32"/"uint32"/"float32" or WGSL "i32"/"u32"/"f32"), then packGridDimX: u32,
    zero-padded to a multiple of 16 bytes."""
    try:
        fmt = "<" + "".join(_POD_FORMAT[t] for t in types) + "I"
    except KeyError as e:
        raise ValueError(f"POD type {e.args[0]!r} cannot be passed in the WebGPU uniform (4-byte scalars only)") from None
    raw = struct.pack(fmt, *values, pack_grid_dim_x)
    return raw + bytes(_round_up(len(raw), 16) - len(raw))


_POD_FORMAT = {"int32": "i", "i32": "i", "uint32": "I", "u32": "I", "float32": "f", "f32": "f"}


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ---------------------------------------------------------------- the backend


@dataclass(slots=True)
class _Program:
    spec: KernelSpec
    pipeline: object  # GPUComputePipeline
    layout: object  # GPUBindGroupLayout
    uniform_size: int  # bytes bound for the uniform (0: none)


def _quiet_wayland_probe() -> None:
    """Vulkan drivers probe Wayland for presentation while listing adapters; libwayland prints
    "error: XDG_RUNTIME_DIR is invalid or not set" (four lines) in a container or service
    without that variable. wick never presents, so an empty private runtime directory quiets
    the probe without changing what it finds."""
    import atexit
    import os
    import shutil
    import tempfile

    if not os.environ.get("XDG_RUNTIME_DIR"):
        path = tempfile.mkdtemp(prefix="wick-runtime-")  # mode 0700, as libwayland requires
        os.environ["XDG_RUNTIME_DIR"] = path
        atexit.register(shutil.rmtree, path, True)


class WgpuBackend(Backend):
    """``wick.engine.backend.Backend`` on wgpu-native (Vulkan/Metal/D3D12, lavapipe on CPU)."""

    def __init__(
        self,
        adapter_preference: str = "auto",
        required_features: Iterable[str] = (),
        *,
        pass_per_dispatch: bool = False,
    ) -> None:
        """``adapter_preference``: "auto" (best real GPU, else the CPU adapter), "gpu" (a real
        GPU or fail), "cpu"/"lavapipe"/"llvmpipe" (the CPU Vulkan adapter), or any other
        substring of the adapter's name/vendor/backend. ``required_features`` (WebGPU names)
        must be present; "shader-f16", "subgroups", "timestamp-query" are requested when the
        adapter has them. ``pass_per_dispatch`` records one compute pass per dispatch (still
        one encoder and one submit) instead of one pass for the whole step."""
        try:
            import wgpu
        except Exception as e:  # missing wheel or wgpu-native library
            raise DeviceError(f"wgpu (wgpu-native) is not usable: {e}") from None
        self._wgpu = wgpu
        _quiet_wayland_probe()
        adapter = _pick_adapter(wgpu, adapter_preference)
        info = adapter.info
        native = set(adapter.features)
        have = {w for w, n in OPTIONAL_FEATURES.items() if n in native or w in native}
        missing = sorted(set(required_features) - have - native)
        if missing:
            raise DeviceError(
                f"adapter {info['device']!r} lacks required features {missing}; it has {sorted(have)}"
            )
        request = [OPTIONAL_FEATURES[w] for w in sorted(have)]
        request += [f for f in required_features if f not in OPTIONAL_FEATURES]
        limits = {k: adapter.limits[k] for k in MAX_LIMITS if k in adapter.limits}
        try:
            self._device = adapter.request_device_sync(
                label="wick", required_features=request, required_limits=limits
            )
        except Exception as e:
            raise DeviceError(f"requesting a device on {info['device']!r} failed: {e}") from None
        self._queue = self._device.queue
        dl = self._device.limits
        self.name = f"wgpu: {info['device']} ({info['backend_type']})"
        self.adapter_type: str = info["adapter_type"]  # "DiscreteGPU" | "IntegratedGPU" | "CPU" ...
        self.adapter_name: str = info["device"]
        # a GPU emulated on the CPU (lavapipe/llvmpipe, SwiftShader, WARP): correct, but slow
        self.is_software = self.adapter_type == "CPU" or any(
            n in f"{info['device']} {info['description']}".lower() for n in _SOFTWARE_NAMES)
        self.features = frozenset(w for w, n in OPTIONAL_FEATURES.items() if n in self._device.features)
        self.max_storage_binding = int(dl["max-storage-buffer-binding-size"])
        self.max_buffer_size = int(dl["max-buffer-size"])
        self.storage_offset_alignment = int(dl["min-storage-buffer-offset-alignment"])
        self.max_workgroups_per_dimension = int(dl["max-compute-workgroups-per-dimension"])
        self.max_workgroup_storage = int(dl["max-compute-workgroup-storage-size"])
        self.max_invocations_per_workgroup = int(dl["max-compute-invocations-per-workgroup"])
        self.pass_per_dispatch = pass_per_dispatch

        self._programs: list[_Program] = []
        self._buffers: dict[BufferHandle, object] = {}  # handle -> GPUBuffer
        self._sizes: dict[BufferHandle, int] = {}  # handle -> allocated bytes (rounded)
        self._next_handle = 1
        self._bind_groups: dict[tuple, object] = {}  # (kernel, storage slices) -> GPUBindGroup
        self._uniform = None
        self._uniform_cap = 0
        self._staging = None
        self._staging_cap = 0
        self._grow_uniform(64 * UNIFORM_SLOT)
        self._grow_staging(4096)

    @classmethod
    def create(cls, device: str = "auto", **kw) -> WgpuBackend:
        """The engine's entry point: ``device`` is an adapter preference (see ``__init__``)."""
        return cls(adapter_preference=device, **kw)

    # -------------------------------------------------------------- features

    def has_feature(self, feature: str) -> bool:
        return feature in self.features

    def require_features(
        self, features: Iterable[str], requested: str | None = None, working_variants: Iterable[str] = ()
    ) -> None:
        """MissingFeatureError for the first absent feature (e.g. a q4f16 model on an adapter
        without shader-f16), naming the variants that would work instead."""
        missing = sorted(set(features) - self.features)
        if missing:
            raise MissingFeatureError(missing[0], working_variants, requested=requested)

    @functools.cached_property
    def subgroup_size(self) -> int | None:
        """The subgroup size a 64-thread compute kernel actually runs with (None without the
        subgroups feature). Measured, because adapters report only a min..max range (lavapipe:
        4..128, runs 8). TVM's subgroup kernels assume the target's warp size (32): gate them
        on this value."""
        if "subgroups" not in self.features:
            return None
        wgsl = (
            "@group(0) @binding(0) var<storage, read_write> out : array<u32>;\n"
            "@compute @workgroup_size(64, 1, 1)\n"
            "fn probe(@builtin(local_invocation_id) t : vec3<u32>, @builtin(subgroup_size) n : u32) {\n"
            "  if (t.x == 0u) { out[0] = n; }\n}\n"
        )
        dev, u = self._device, self._wgpu.BufferUsage
        pipeline = dev.create_compute_pipeline(
            layout="auto", compute={"module": dev.create_shader_module(code=wgsl), "entry_point": "probe"}
        )
        buf = dev.create_buffer(size=16, usage=u.STORAGE | u.COPY_SRC)
        bg = dev.create_bind_group(
            layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
        )
        encoder = dev.create_command_encoder()
        p = encoder.begin_compute_pass()
        p.set_pipeline(pipeline)
        p.set_bind_group(0, bg)
        p.dispatch_workgroups(1)
        p.end()
        self._queue.submit([encoder.finish()])
        size = int(struct.unpack("<I", bytes(self._queue.read_buffer(buf, 0, 4)))[0])
        buf.destroy()
        return size

    # -------------------------------------------------------------- programs

    def load_kernels(self, kernels: Sequence[KernelSpec]) -> int:
        """Compile every kernel once; returns the index of the first. Kernels loaded earlier
        (another model on the same device) keep their indexes."""
        wgpu = self._wgpu
        programs = []
        for spec in kernels:
            try:
                iface = parse_wgsl_interface(spec.wgsl)
            except ValueError as e:
                raise KernelCompileError(f"kernel {spec.name!r}: {e}") from None
            self._check_spec(spec, iface)
            code = spec.wgsl
            if iface.uses_subgroups:
                # Chrome requires `enable subgroups;`, naga rejects it but accepts the builtins.
                code = re.sub(r"^\s*enable\s+subgroups\s*;[ \t]*$", "", code, flags=re.M)
            b = len(spec.storage_access)
            entries = [
                {
                    "binding": i,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": "storage" if acc == "read_write" else "read-only-storage"},
                }
                for i, acc in enumerate(spec.storage_access)
            ]
            usize = max(iface.uniform_size, 16) if spec.uniform else 0
            if spec.uniform:
                entries.append(
                    {
                        "binding": b,
                        "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": "uniform", "has_dynamic_offset": True},
                    }
                )
            try:
                module = self._device.create_shader_module(label=spec.name, code=code)
                layout = self._device.create_bind_group_layout(label=spec.name, entries=entries)
                playout = self._device.create_pipeline_layout(label=spec.name, bind_group_layouts=[layout])
                pipeline = self._device.create_compute_pipeline(
                    label=spec.name,
                    layout=playout,
                    compute={"module": module, "entry_point": spec.entry_point},
                )
            except Exception as e:
                raise KernelCompileError(f"kernel {spec.name!r} failed to compile: {e}") from None
            programs.append(_Program(spec, pipeline, layout, usize))
        base = len(self._programs)
        self._programs.extend(programs)
        return base

    def _check_spec(self, spec: KernelSpec, iface: WgslInterface) -> None:
        def fail(msg: str):
            raise KernelCompileError(f"kernel {spec.name!r}: {msg}")

        if iface.storage_access != tuple(spec.storage_access):
            fail(f"storage_access {tuple(spec.storage_access)} but the WGSL declares {iface.storage_access}")
        if spec.uniform != (iface.uniform_binding is not None):
            fail(f"uniform={spec.uniform} but the WGSL {'has' if iface.uniform_binding is not None else 'has no'} uniform")
        if spec.uniform and iface.uniform_binding != len(spec.storage_access):
            fail(f"uniform at binding {iface.uniform_binding}, expected {len(spec.storage_access)}")
        if not re.search(rf"\bfn\s+{re.escape(spec.entry_point)}\s*\(", spec.wgsl):
            fail(f"no entry point {spec.entry_point!r} in the WGSL")
        if iface.uses_f16 and "shader-f16" not in self.features:
            fail(f"uses f16 but {self.name} lacks shader-f16")
        if iface.uses_subgroups and "subgroups" not in self.features:
            fail(f"uses subgroups but {self.name} lacks them")

    # -------------------------------------------------------------- allocator

    def alloc(self, nbytes: int) -> BufferHandle:
        size = max(16, _round_up(int(nbytes), 16))
        if size > self.max_buffer_size:
            raise DeviceError(f"buffer of {nbytes} bytes exceeds maxBufferSize {self.max_buffer_size}")
        u = self._wgpu.BufferUsage
        buf = self._device.create_buffer(size=size, usage=u.STORAGE | u.COPY_SRC | u.COPY_DST)
        h = self._next_handle
        self._next_handle += 1
        self._buffers[h], self._sizes[h] = buf, size
        return h

    def free(self, buffer: BufferHandle) -> None:
        buf = self._buffers.pop(buffer)
        del self._sizes[buffer]
        stale = [k for k in self._bind_groups if any(s.buffer == buffer for s in k[1])]
        for k in stale:
            del self._bind_groups[k]
        buf.destroy()

    def write(self, buffer: BufferHandle, offset: int, data: bytes | memoryview) -> None:
        """Upload now. Offsets must be multiples of 4; a tail that is not is zero-padded to 4."""
        self._write(buffer, offset, data)

    def _write(self, buffer: BufferHandle, offset: int, data) -> None:
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if offset % 4:
            raise ValueError(f"write offset {offset} is not a multiple of 4")
        if offset + _round_up(n, 4) > self._sizes[buffer]:
            raise ValueError(f"write of {n} bytes at {offset} overflows buffer of {self._sizes[buffer]}")
        if n % 4:
            mv = memoryview(bytes(mv) + bytes(4 - n % 4))
        if n:
            self._queue.write_buffer(self._buffers[buffer], offset, mv)

    # -------------------------------------------------------------- device

    def run(
        self, writes: Sequence[Write], dispatches: Sequence[Dispatch], reads: Sequence[Read],
        step: Hashable | None = None,
    ) -> list[bytes]:
        """Apply writes, record every dispatch in one encoder, submit once, read back.

        Grids with x above maxComputeWorkgroupsPerDimension (and z == 1) are folded into x*z
        as tvmjs does; the uniform's packGridDimX must hold the unfolded x (see fold_grid).
        With no reads, returns [] without waiting for the GPU.
        """
        for w in writes:
            self._write(w.buffer, w.offset, w.data)
        programs, device = self._programs, self._device
        try:
            encoder = device.create_command_encoder()
            if dispatches:
                # Uniforms: one slot per dispatch that has one, one write for the whole step.
                offsets = []
                total = 0
                for d in dispatches:
                    offsets.append(total)
                    usize = programs[d.kernel].uniform_size
                    if len(d.uniform) > usize:
                        raise ValueError(
                            f"kernel {programs[d.kernel].spec.name!r}: uniform of {len(d.uniform)} "
                            f"bytes, its WGSL declares {usize}"
                        )
                    total += _round_up(usize, UNIFORM_SLOT)
                if total > self._uniform_cap:
                    self._grow_uniform(total)
                if total:
                    blob = bytearray(total)
                    for d, off in zip(dispatches, offsets):
                        blob[off : off + len(d.uniform)] = d.uniform
                    self._queue.write_buffer(self._uniform, 0, blob)
                cache = self._bind_groups
                limit = self.max_workgroups_per_dimension
                cpass = None if self.pass_per_dispatch else encoder.begin_compute_pass()
                last = -1
                for d, off in zip(dispatches, offsets):
                    key = (d.kernel, d.storage)
                    bg = cache.get(key)
                    if bg is None:
                        bg = self._bind_group(d)
                    if cpass is None:
                        p = encoder.begin_compute_pass()
                        p.set_pipeline(programs[d.kernel].pipeline)
                    else:
                        p = cpass
                        if d.kernel != last:
                            p.set_pipeline(programs[d.kernel].pipeline)
                            last = d.kernel
                    p.set_bind_group(0, bg, (off,) if programs[d.kernel].uniform_size else ())
                    x, y, z = d.grid
                    if x > limit or y > limit or z > limit:
                        x, y, z = self._fold(d, limit)
                    p.dispatch_workgroups(x, y, z)
                    if cpass is None:
                        p.end()
                if cpass is not None:
                    cpass.end()
            # Readbacks: each into the staging buffer at a 4-aligned offset.
            spans = []
            total = 0
            for r in reads:
                if r.offset % 4:
                    raise ValueError(f"read offset {r.offset} is not a multiple of 4")
                n = _round_up(r.size, 4)
                if r.offset + n > self._sizes[r.buffer]:
                    raise ValueError(f"read of {r.size} bytes at {r.offset} overflows buffer {r.buffer}")
                spans.append(total)
                total += n
            if total > self._staging_cap:
                self._grow_staging(total)
            for r, dst in zip(reads, spans):
                if r.size:
                    encoder.copy_buffer_to_buffer(
                        self._buffers[r.buffer], r.offset, self._staging, dst, _round_up(r.size, 4)
                    )
            self._queue.submit([encoder.finish()])
            if not total:
                return [b"" for _ in reads]
            self._staging.map_sync(self._wgpu.MapMode.READ, 0, total)
            try:
                data = self._staging.read_mapped(0, total, copy=False)
                out = [bytes(data[o : o + r.size]) for r, o in zip(reads, spans)]
            finally:
                self._staging.unmap()
            return out
        except self._wgpu.GPUError as e:
            raise DeviceError(f"{self.name}: {e}") from None

    def sync(self) -> None:
        """Block until all submitted work is done (a 4-byte readback; wgpu-py 0.32's
        on_submitted_work_done_sync is broken)."""
        encoder = self._device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self._uniform, 0, self._staging, 0, 4)
        self._queue.submit([encoder.finish()])
        self._staging.map_sync(self._wgpu.MapMode.READ, 0, 4)
        self._staging.unmap()

    def _fold(self, d: Dispatch, limit: int) -> tuple[int, int, int]:
        x, y, z = d.grid
        if y > limit or z != 1:
            raise ValueError(
                f"kernel {self._programs[d.kernel].spec.name!r}: grid {d.grid} exceeds "
                f"{limit} per dimension and cannot be folded (only x folds, into z)"
            )
        x, z = fold_grid(x, limit)
        return x, y, z

    def _bind_group(self, d: Dispatch):
        try:
            prog = self._programs[d.kernel]
        except IndexError:
            raise ValueError(f"dispatch of kernel {d.kernel}: only {len(self._programs)} loaded") from None
        spec = prog.spec
        if len(d.storage) != len(spec.storage_access):
            raise ValueError(
                f"kernel {spec.name!r} takes {len(spec.storage_access)} buffers, got {len(d.storage)}"
            )
        entries = []
        for i, s in enumerate(d.storage):
            if s.buffer not in self._buffers:
                raise ValueError(f"kernel {spec.name!r} binding {i}: buffer {s.buffer} is not allocated (freed?)")
            if s.offset % self.storage_offset_alignment or s.size % 4 or s.size <= 0:
                raise ValueError(
                    f"kernel {spec.name!r} binding {i}: slice offset {s.offset} must be a multiple of "
                    f"{self.storage_offset_alignment} and size {s.size} a positive multiple of 4"
                )
            if s.offset + s.size > self._sizes[s.buffer] or s.size > self.max_storage_binding:
                raise ValueError(
                    f"kernel {spec.name!r} binding {i}: slice {s.offset}+{s.size} exceeds buffer "
                    f"({self._sizes[s.buffer]} bytes) or maxStorageBufferBindingSize"
                )
            entries.append({"binding": i, "resource": {"buffer": self._buffers[s.buffer], "offset": s.offset, "size": s.size}})
        written = {s.buffer for s, acc in zip(d.storage, spec.storage_access) if acc == "read_write"}
        for i, (s, acc) in enumerate(zip(d.storage, spec.storage_access)):
            if acc == "read" and s.buffer in written:
                raise ValueError(
                    f"kernel {spec.name!r} binding {i}: buffer {s.buffer} is bound read-only and "
                    "read_write in one dispatch; WebGPU forbids that even at disjoint offsets"
                )
        if spec.uniform:
            entries.append(
                {"binding": len(d.storage), "resource": {"buffer": self._uniform, "offset": 0, "size": prog.uniform_size}}
            )
        bg = self._device.create_bind_group(label=spec.name, layout=prog.layout, entries=entries)
        self._bind_groups[(d.kernel, d.storage)] = bg
        return bg

    def _grow_uniform(self, nbytes: int) -> None:
        cap = max(self._uniform_cap * 2, _round_up(nbytes, UNIFORM_SLOT))
        u = self._wgpu.BufferUsage
        old = self._uniform
        self._uniform = self._device.create_buffer(
            label="wick-uniforms", size=cap, usage=u.UNIFORM | u.COPY_DST | u.COPY_SRC
        )
        self._uniform_cap = cap
        self._bind_groups.clear()  # they point at the old uniform buffer
        if old is not None:
            old.destroy()

    def _grow_staging(self, nbytes: int) -> None:
        cap = max(self._staging_cap * 2, _round_up(nbytes, 256))
        u = self._wgpu.BufferUsage
        if self._staging is not None:
            self._staging.destroy()
        self._staging = self._device.create_buffer(label="wick-readback", size=cap, usage=u.MAP_READ | u.COPY_DST)
        self._staging_cap = cap


_SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "swiftshader", "microsoft basic render", "warp")


def _pick_adapter(wgpu, preference: str):
    """The best adapter for ``preference``; DeviceError (never a wgpu traceback) when none."""
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:
        raise DeviceError(f"could not enumerate GPU adapters: {e}") from None
    if not adapters:
        raise DeviceError(
            "no GPU adapter found (no Vulkan/Metal/D3D12 driver). For a CPU fallback install "
            "Mesa's lavapipe (Debian: apt-get install mesa-vulkan-drivers)."
        )

    def rank(a):
        info = a.info
        native = 0 if info["backend_type"] in ("Vulkan", "Metal", "D3D12") else 1
        return (_ADAPTER_RANK.get(info["adapter_type"], 3), native)

    def text(a):
        i = a.info
        return f"{i['device']} {i['vendor']} {i['description']} {i['backend_type']} {i['adapter_type']}".lower()

    pref = preference.lower()
    if pref == "auto":
        pool = adapters
    elif pref == "gpu":
        pool = [a for a in adapters if a.info["adapter_type"] != "CPU"]
    elif pref in _CPU_NAMES:
        pool = [a for a in adapters if a.info["adapter_type"] == "CPU" or any(n in text(a) for n in _CPU_NAMES[1:])]
    else:
        pool = [a for a in adapters if pref in text(a)]
    if not pool:
        seen = "; ".join(f"{a.info['device']} ({a.info['backend_type']}, {a.info['adapter_type']})" for a in adapters)
        raise DeviceError(f"no GPU adapter matches {preference!r}; found: {seen}")
    return min(pool, key=rank)
