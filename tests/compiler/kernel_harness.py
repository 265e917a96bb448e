"""Compile one hand-written TIR kernel the way wick lowers kernels (TIR -> WGSL + host call
order) and run it once on wgpu (lavapipe here): the harness of the sampling-kernel tests."""

from __future__ import annotations

import importlib
import json
import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
wgpu = pytest.importorskip("wgpu")

from tvm import tirx  # noqa: E402


def compile_prim(func, param_order) -> dict:
    """TIR PrimFunc -> {"wgsl", "entry", "buffers" (binding order), "access", "pod", "launch"}."""
    name = str(func.attrs["global_symbol"])
    assert [p.name for p in func.params] == ["var_" + p for p in param_order] or \
        [p.name for p in func.params] == list(param_order)
    mod = tvm.IRModule({name: func})
    target = tvm.target.Target({"kind": "webgpu"}, host={"kind": "llvm"})
    mod = tirx.transform.BindTarget(target)(mod)
    pipe, _fin_host, fin_dev = tirx.get_tir_pipeline("s_tir")
    identity = tvm.transform.module_pass(lambda m, _ctx: m, opt_level=0, name="WickIdentity")
    replaced = ("MakePackedAPI", "FP8StorageLegalize", "BF16StorageLegalize")
    saved = {n: getattr(tirx.transform, n) for n in replaced}
    try:
        for n in replaced:
            setattr(tirx.transform, n, lambda: identity)
        lowered = pipe(mod)
    finally:
        for n, f in saved.items():
            setattr(tirx.transform, n, f)
    build = importlib.import_module("tvm.tirx.build")
    host_mod, dev_mods = build.split_host_device_mods(lowered)
    host_funcs, kernels = {}, {}
    for m in [host_mod, *dev_mods.values()]:
        for gv, f in m.functions.items():
            cc = f.attrs.get("calling_conv", None) if f.attrs is not None else None
            (kernels if cc is not None and int(cc) == 2 else host_funcs)[gv] = f
    entry = name + "_kernel"
    assert [gv.name_hint for gv in kernels] == [entry]
    assert [gv.name_hint for gv in host_funcs] == [name]
    dev_mod = fin_dev()(tvm.IRModule(kernels))
    rt = tvm.get_global_func("target.build.webgpu")(dev_mod, tvm.target.Target({"kind": "webgpu"}))
    wgsl = rt.inspect_source()
    info = json.loads(rt.inspect_source("func_info"))[entry]

    # host call: T.call_ffi_kernel("<name>_kernel", bufs.data..., scalars..., extents...)
    host_text = list(host_funcs.values())[0].script()
    call = re.search(rf'T\.call_ffi_kernel\("{entry}", (.*?), launch_params=', host_text)
    assert call, host_text
    args = [a.strip() for a in call.group(1).split(",")]
    buffers = [re.sub(r"(_\d+)?\.data$", "", a) for a in args if a.endswith(".data")]
    scalars = [a for a in args if not a.endswith(".data")]
    n_pod = sum(1 for t in info["arg_types"] if t != "handle")
    assert len(buffers) == info["arg_types"].count("handle") == len(param_order)
    assert sorted(buffers) == sorted(param_order)
    tags = info["launch_param_tags"]
    assert tags[:2] == ["blockIdx.x", "threadIdx.x"]
    write = json.loads(tags[2].split(":", 1)[1])
    access = ["read_write" if w else "read" for w in write]
    # WGSL declarations agree with the host binding order and access modes
    decl = re.findall(r"@binding\((\d+)\) var<storage, (read|read_write)> (\w+)_ptr", wgsl)
    assert [(int(i), acc, n) for i, acc, n in decl] == [
        (i, access[i], buffers[i]) for i in range(len(buffers))
    ]
    assert f"@binding({len(buffers)}) var<uniform> podArgs" in wgsl
    assert "@workgroup_size(256, 1, 1)" in wgsl
    return {"wgsl": wgsl, "entry": entry, "buffers": buffers, "access": access,
            "pod": scalars[:n_pod], "launch": scalars[n_pod:]}


_DEVICE = None


def device():
    global _DEVICE
    if _DEVICE is None:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            pytest.skip("no wgpu adapter")
        feats = ["shader-f16"] if "shader-f16" in adapter.features else []
        _DEVICE = adapter.request_device_sync(required_features=feats)
    return _DEVICE


class KernelRunner:
    """One compiled kernel on the test device: ``run(arrays, env)`` binds every named array
    (inputs and preallocated outputs), dispatches ``repeat`` times and returns the arrays of
    the buffers the kernel writes."""

    def __init__(self, compiled: dict):
        dev = device()
        self.c = compiled
        usage = wgpu.BufferBindingType
        entries = [
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
             "buffer": {"type": usage.storage if acc == "read_write" else usage.read_only_storage}}
            for i, acc in enumerate(compiled["access"])
        ]
        entries.append({"binding": len(entries), "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": usage.uniform}})
        self.bgl = dev.create_bind_group_layout(entries=entries)
        shader = dev.create_shader_module(code=compiled["wgsl"])
        self.pipeline = dev.create_compute_pipeline(
            layout=dev.create_pipeline_layout(bind_group_layouts=[self.bgl]),
            compute={"module": shader, "entry_point": compiled["entry"]},
        )

    def run(self, arrays: dict[str, np.ndarray], env: dict[str, int], repeat: int = 1):
        dev = device()
        BU = wgpu.BufferUsage
        bufs = [
            dev.create_buffer_with_data(data=np.ascontiguousarray(arrays[n]).tobytes() or b"\0" * 4,
                                        usage=BU.STORAGE | BU.COPY_SRC | BU.COPY_DST)
            for n in self.c["buffers"]
        ]
        pod = [int(env[s]) if s in env else int(s) for s in self.c["pod"]]
        grid_x = int(env.get(self.c["launch"][0], self.c["launch"][0]))
        assert grid_x < 65536
        ubytes = np.array(pod, np.int32).tobytes() + np.array([grid_x], np.uint32).tobytes()
        ubuf = dev.create_buffer_with_data(data=ubytes, usage=BU.UNIFORM)
        bg = dev.create_bind_group(layout=self.bgl, entries=[
            {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
            for i, buf in enumerate([*bufs, ubuf])
        ])
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(self.pipeline)
        cp.set_bind_group(0, bg)
        for _ in range(repeat):
            cp.dispatch_workgroups(grid_x, 1, 1)
        cp.end()
        dev.queue.submit([enc.finish()])
        out = {}
        for n, acc, buf in zip(self.c["buffers"], self.c["access"], bufs):
            if acc == "read_write":
                a = arrays[n]
                out[n] = np.frombuffer(dev.queue.read_buffer(buf), a.dtype)[: a.size].reshape(
                    a.shape).copy()
        return out
