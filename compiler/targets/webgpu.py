"""The WebGPU kernel set: the plans' TIR functions scheduled by dlight and lowered to WGSL (the
decode plans' dequantize-GEMVs by compiler/batched_gemv.py, its sums meeting in workgroup memory).

Each TIR function's device parts become WGSL kernels (one file each in the artifact); its host
part becomes launches read as data (compiler/tir_lower.py), which the engine replays: a browser
has no TVM runtime to run host code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from ..batched_gemv import decode_gemvs
from ..tir_lower import TirFunction, host_launches, lower_split, scalar_dtype, schedule_rules
from .built import BuiltSet, digest

KIND = "webgpu"
# The decode GEMV's form here: no subgroup operations (an optional WebGPU feature), no 8-lane
# vectors, and 2 warps (of up to 32 lanes: fewer where K's words do not split 32 ways), whose
# sums take at most 8.1 KiB of workgroup memory (8 rows x 4 outputs x 2 warps x 32 lanes, the
# lanes' stride padded by one), under the 16 KiB every WebGPU device has.
DECODE_GEMV = {"reduction": "shared", "warps": 2, "vector_loads": False}
_STORAGE_DECL = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<storage,\s*(read_write|read)>")


def webgpu_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "webgpu"}, host={"kind": "llvm"})


@dataclass
class Kernel:
    name: str
    wgsl: str
    scalar_dtypes: list[str]  # POD args in uniform order: "int32" | "uint32" | "float32"
    storage_access: list[str] = field(default_factory=list)  # per binding: read | read_write
    entry_point: str = ""  # the WGSL function; differs from ``name`` after a merge rename

    def __post_init__(self) -> None:
        self.entry_point = self.entry_point or self.name


@dataclass
class WebGPUSet:
    """One lowering's WGSL kernels and the launches of its TIR functions."""

    kernels: list[Kernel]
    tir_functions: dict[str, TirFunction]

    @property
    def names(self) -> list[str]:
        return list(self.tir_functions)

    def merging(self, other: "WebGPUSet", prefix: str) -> "_Merge":
        return _Merge(self, other, prefix)


def lower(tir_mod: tvm.IRModule, schedule: str, twins: dict[str, tirx.PrimFunc]) -> WebGPUSet:
    """``tir_mod``'s functions (``twins`` replacing theirs, as for every target: none today, the
    TIR being written for WebGPU) scheduled by ``schedule_rules(schedule)``, lowered to WGSL."""
    from tvm.s_tir import dlight as dl

    target = webgpu_target()
    funcs = {gv: twins.get(gv.name_hint, f) for gv, f in tir_mod.functions.items()}
    funcs = decode_gemvs(funcs, schedule, **DECODE_GEMV)
    with target:  # (dlight schedules a module in place: a copy of the caller's)
        scheduled = dl.ApplyDefaultSchedule(*schedule_rules(schedule))(tvm.IRModule(funcs))
    kernels, functions = build_kernels(scheduled, target)
    used = {launch["kernel"] for tf in functions.values() for launch in tf.launches}
    return WebGPUSet([k for k in kernels if k.name in used], functions)


def build_kernels(tir_mod: tvm.IRModule, target) -> tuple[list[Kernel], dict[str, TirFunction]]:
    """A scheduled module's WGSL kernels and its functions' launches."""
    device_funcs, dmod, host_funcs = lower_split(tir_mod, target)
    codegen = tvm.get_global_func("target.build.webgpu")
    kernels = []
    for gv, f in dmod.functions.items():
        wgsl = codegen(tvm.IRModule({gv: f}), f.attrs["target"]).inspect_source()
        scalar_dtypes = [d for d in map(scalar_dtype, f.params) if d is not None]
        kernels.append(Kernel(gv.name_hint, wgsl, scalar_dtypes, _storage_access(wgsl)))
    functions = {}
    for f in host_funcs:
        tf = host_launches(f, device_funcs)
        functions[tf.name] = tf
    return kernels, functions


def _storage_access(wgsl: str) -> list[str]:
    decls = sorted((int(b), mode) for b, mode in _STORAGE_DECL.findall(wgsl))
    return [mode for _, mode in decls]


class _Merge:
    """``other`` joining ``base`` (compiler/lower.py ``merge``): a kernel keeps its name where
    ``base`` has none or the same WGSL under it, else takes ``prefix``; a function is the same
    as one of ``base``'s when its parameters and launches (kernels renamed) are."""

    def __init__(self, base: WebGPUSet, other: WebGPUSet, prefix: str) -> None:
        self.kernels = {k.name: k for k in base.kernels}
        renamed: dict[str, str] = {}
        for k in other.kernels:
            same = self.kernels.get(k.name)
            name = k.name if same is None or same.wgsl == k.wgsl else prefix + k.name
            renamed[k.name] = name
            if name not in self.kernels:
                self.kernels[name] = Kernel(name, k.wgsl, k.scalar_dtypes, k.storage_access,
                                            k.entry_point)
        self.theirs = {
            name: TirFunction(name, f.params, [{**launch, "kernel": renamed[launch["kernel"]]}
                                               for launch in f.launches])
            for name, f in other.tir_functions.items()}
        self.functions = dict(base.tir_functions)

    def same(self, mine: str, theirs: str) -> bool:
        have, f = self.functions.get(mine), self.theirs[theirs]
        return have is not None and (have.params, have.launches) == (f.params, f.launches)

    def add(self, theirs: str, name: str) -> None:
        f = self.theirs[theirs]
        self.functions.setdefault(name, TirFunction(name, f.params, f.launches))

    def result(self) -> WebGPUSet:
        return WebGPUSet(list(self.kernels.values()), self.functions)


def build(lowered: WebGPUSet) -> dict[str, BuiltSet]:
    """One WGSL file per kernel; the entry lists them with their launch metadata."""
    files, kernels = {}, []
    for k in lowered.kernels:
        src = k.wgsl.encode("utf-8")
        rel = f"kernels/webgpu/{_file_stem(k.name, src)}.wgsl"
        files[rel] = src
        kernels.append({"name": k.name, "entry_point": k.entry_point, "file": rel,
                        "sha256": digest(src), "scalar_dtypes": k.scalar_dtypes,
                        "storage_access": k.storage_access})
    tir_functions = {n: {"params": f.params, "launches": f.launches}
                     for n, f in lowered.tir_functions.items()}
    return {KIND: BuiltSet(files, {"form": "shaders", "kernels": kernels,
                                   "tir_functions": tir_functions})}


def _file_stem(name: str, src: bytes, limit: int = 120) -> str:
    """The kernel's name, or for a name too long for a file system (TVM names fused kernels
    after every op they fuse: a split vocabulary table makes names of 400+ characters) its
    start and a hash of the source. The manifest maps names to files, so nothing else cares."""
    if len(name) <= limit:
        return name
    return f"{name[:limit - 17]}-{digest(src)[:16]}"
