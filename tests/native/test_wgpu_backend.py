"""WgpuBackend on real TVM-compiled WGSL, checked against numpy. Runs on lavapipe (no GPU).

Kernels are built here with TVM's WebGPU codegen; KernelSpec and Dispatch are built by hand from
``func_info`` (arg_types, launch_param_tags) the way the engine's plan interpreter will. Grids are
computed by hand from each schedule (the engine reads them from the lowered host TIR).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

wgpu = pytest.importorskip("wgpu")
tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402

from wick.engine.backend import BufferSlice, Dispatch, KernelSpec, Read, Write  # noqa: E402
from wick.engine.errors import DeviceError, MissingFeatureError  # noqa: E402
from wick.native.wgpu_backend import (  # noqa: E402
    KernelCompileError,
    WgpuBackend,
    fold_grid,
    kernel_spec_from_wgsl,
    pack_uniform,
    parse_wgsl_interface,
)

TARGET = {"kind": "webgpu"}
HOST = {"kind": "llvm"}


# ---------------------------------------------------------------- building kernels with TVM


def _axpy_func(name: str, dtype: str = "float32"):
    """C[i] = A[i] + B[i] * s over a dynamic n (so the uniform holds n, s, packGridDimX)."""
    n = te.var("n", "int32")
    a = te.placeholder((n,), dtype, name="A")
    b = te.placeholder((n,), dtype, name="B")
    s = te.var("s", "float32")
    c = te.compute((n,), lambda i: a[i] + b[i] * s.astype(dtype), name="C")
    return te.create_prim_func([a, b, c, s]).with_attr("global_symbol", name)


def _gemv_func(rows: int, cols: int):
    """Y[0, j] = sum_k X[0, k] * W[j, k]: the decode-shape matmul dlight's GEMV schedules."""
    x = te.placeholder((1, cols), "float32", name="X")
    w = te.placeholder((rows, cols), "float32", name="W")
    k = te.reduce_axis((0, cols), name="k")
    y = te.compute((1, rows), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="Y")
    return te.create_prim_func([x, w, y]).with_attr("global_symbol", "gemv")


def _scale16_func(n: int):
    a = te.placeholder((n,), "float16", name="A")
    c = te.compute((n,), lambda i: a[i] * tvm.tirx.const(2.0, "float16"), name="C")
    return te.create_prim_func([a, c]).with_attr("global_symbol", "scale16")


def split_wgsl(source: str) -> dict[str, str]:
    """``inspect_source()`` of the webgpu module -> {kernel name: its own WGSL module}."""
    parts = re.split(r"^// Function: (\w+)\n//-+\n", source, flags=re.M)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if body.strip():
            out[name] = body
    return out


def compile_kernels(mod) -> tuple[dict[str, str], dict[str, dict]]:
    exe = tvm.compile(mod, tvm.target.Target(TARGET, host=HOST))
    wm = exe.mod.imports[0]
    return split_wgsl(wm.inspect_source()), json.loads(wm.inspect_source("func_info"))


def spec_from_func_info(name: str, wgsl: str, info: dict) -> KernelSpec:
    """What the engine does: storage access from the ``paramWriteAccess:[...]`` launch tag."""
    tags = info["launch_param_tags"]
    access = json.loads(next(t for t in tags if t.startswith("paramWriteAccess:"))[17:])
    assert len(access) == info["arg_types"].count("handle")
    return KernelSpec(
        name=name,
        wgsl=wgsl,
        entry_point=info["name"],
        storage_access=tuple("read_write" if w else "read" for w in access),
        uniform=True,  # TVM's WGSL always declares PODArgs (at least packGridDimX)
    )


def pod_types(info: dict) -> list[str]:
    return [t for t in info["arg_types"] if t != "handle"]


@pytest.fixture(scope="module")
def compiled():
    import tvm.s_tir.dlight as dl

    target = tvm.target.Target(TARGET, host=HOST)
    # axpy4: the same axpy with 4 threads per workgroup, so a modest n needs > 65535 workgroups.
    sch = tvm.s_tir.Schedule(tvm.IRModule({"axpy4": _axpy_func("axpy4")}))
    (loop,) = sch.get_loops(sch.get_sblock("C", func_name="axpy4"))
    bx, tx = sch.split(loop, [None, 4])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    mod = sch.mod
    mod["axpy"] = _axpy_func("axpy")
    mod["gemv"] = _gemv_func(64, 256)
    mod["scale16"] = _scale16_func(1000)
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.GEMV(), dl.gpu.Fallback())(mod)
    wgsl, infos = compile_kernels(mod)
    specs = {
        k.removesuffix("_kernel"): spec_from_func_info(k.removesuffix("_kernel"), wgsl[k], infos[k])
        for k in wgsl
    }
    return specs, {k.removesuffix("_kernel"): v for k, v in infos.items()}


@pytest.fixture(scope="module")
def backend(compiled):
    try:
        be = WgpuBackend.create("auto")
    except DeviceError as e:
        pytest.skip(f"no wgpu adapter: {e}")
    specs, _ = compiled
    order = ["axpy", "axpy4", "gemv"] + (["scale16"] if be.has_feature("shader-f16") else [])
    be.load_kernels([specs[k] for k in order])
    be.kernel_index = {k: i for i, k in enumerate(order)}  # test-only bookkeeping
    return be


def upload(be: WgpuBackend, arr: np.ndarray) -> int:
    h = be.alloc(arr.nbytes)
    be.write(h, 0, arr.tobytes())
    return h


def whole(h: int, arr_or_nbytes) -> BufferSlice:
    n = arr_or_nbytes if isinstance(arr_or_nbytes, int) else arr_or_nbytes.nbytes
    return BufferSlice(h, 0, (n + 3) // 4 * 4)


def axpy_dispatch(be, kernel: str, a: BufferSlice, b: BufferSlice, c: BufferSlice, n: int, s: float,
                  threads: int = 256) -> Dispatch:
    gx = -(-n // threads)
    return Dispatch(
        kernel=be.kernel_index[kernel],
        storage=(a, b, c),  # binding order A, B, C (read, read, read_write)
        uniform=pack_uniform([n, s], ["int32", "float32"], gx),
        grid=(gx, 1, 1),
    )


# ---------------------------------------------------------------- ABI facts


def test_wgsl_abi_facts(compiled):
    specs, infos = compiled
    axpy = parse_wgsl_interface(specs["axpy"].wgsl)
    assert axpy.storage_access == ("read", "read", "read_write")
    assert axpy.storage_names == ("A_ptr", "B_ptr", "C_ptr")
    assert axpy.uniform_fields == (("n", "i32"), ("s", "f32"), ("packGridDimX", "u32"))
    assert axpy.uniform_binding == 3 and axpy.uniform_size == 16
    assert infos["axpy"]["arg_types"] == ["handle", "handle", "handle", "int32", "float32"]
    assert infos["axpy"]["launch_param_tags"] == ["blockIdx.x", "threadIdx.x", "paramWriteAccess:[0,0,1]"]
    # the kernel's binding order is not the PrimFunc's (X, W, Y): dlight's GEMV binds W first
    gemv = parse_wgsl_interface(specs["gemv"].wgsl)
    assert gemv.storage_names == ("W_ptr", "X_ptr", "Y_ptr")
    assert gemv.uniform_fields == (("packGridDimX", "u32"),)
    f16 = parse_wgsl_interface(specs["scale16"].wgsl)
    assert f16.uses_f16 and not axpy.uses_f16
    for name, spec in specs.items():  # func_info and the WGSL declarations agree
        assert kernel_spec_from_wgsl(name, spec.wgsl, spec.entry_point) == spec
    assert "> podArgs.packGridDimX" in specs["axpy"].wgsl  # TVM's guard (one padded group may run)


def test_pack_uniform_and_fold():
    raw = pack_uniform([100000, 2.5], ["int32", "float32"], 391)
    assert len(raw) == 16 and np.frombuffer(raw[:4], "<i4")[0] == 100000
    assert np.frombuffer(raw[4:8], "<f4")[0] == 2.5 and np.frombuffer(raw[8:12], "<u4")[0] == 391
    assert fold_grid(65535) == (65535, 1)
    assert fold_grid(65536) == (32768, 2)
    assert fold_grid(75003) == (25001, 3)  # exact (tvmjs's halving would pad to 37502 x 2)
    assert fold_grid(65537) == (32769, 2)  # prime: padded, like tvmjs's halving
    for gx in (10_000_000, 531_776, 2**31 - 1):
        x, z = fold_grid(gx)
        assert x <= 65535 and z <= 65535 and gx <= x * z < gx + z
    with pytest.raises(ValueError, match="exceeds"):
        fold_grid(65535 * 65535 + 1)
    with pytest.raises(ValueError, match="4-byte scalars"):
        pack_uniform([1], ["int64"], 1)


def test_adapter_description(backend):
    assert backend.name.startswith("wgpu: ")
    assert backend.features <= {"shader-f16", "subgroups", "timestamp-query"}
    assert backend.max_storage_binding >= 128 << 20
    assert backend.max_buffer_size >= backend.max_storage_binding
    assert backend.storage_offset_alignment in (32, 64, 128, 256)
    assert backend.max_workgroups_per_dimension >= 65535


# ---------------------------------------------------------------- running kernels


def test_axpy_dynamic_n(backend):
    rng = np.random.default_rng(0)
    n, s = 100_000, 0.75
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    ha, hb, hc = upload(backend, a), upload(backend, b), backend.alloc(a.nbytes)
    (out,) = backend.run(
        [], [axpy_dispatch(backend, "axpy", whole(ha, a), whole(hb, b), whole(hc, a), n, s)],
        [Read(hc, 0, a.nbytes)],
    )
    np.testing.assert_allclose(np.frombuffer(out, np.float32), a + b * np.float32(s), rtol=1e-6)
    for h in (ha, hb, hc):
        backend.free(h)


@pytest.mark.parametrize("n, folded", [(300_011, (25001, 1, 3)), (262_147, (32769, 1, 2))])
def test_grid_folding_beyond_65535(backend, n, folded):
    """4 threads per group: n = 300011 needs 75003 groups (folds exactly to 25001 x 3);
    n = 262147 needs 65537 (prime: padded to 32769 x 2, one extra group passes TVM's
    `> packGridDimX` guard and the kernel's own `< n` check keeps it harmless)."""
    rng = np.random.default_rng(1)
    s = -1.5
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    ha, hb = upload(backend, a), upload(backend, b)
    hc = backend.alloc(a.nbytes)
    d = axpy_dispatch(backend, "axpy4", whole(ha, a), whole(hb, b), whole(hc, a), n, s, threads=4)
    assert d.grid[0] > 65535  # unfolded: the backend folds it
    assert fold_grid(d.grid[0]) == (folded[0], folded[2])
    (out,) = backend.run([], [d], [Read(hc, 0, a.nbytes)])
    np.testing.assert_allclose(np.frombuffer(out, np.float32), a + b * np.float32(s), rtol=1e-6)
    # and pre-folded by the engine works the same
    backend.write(hc, 0, bytes(a.nbytes))
    (out,) = backend.run([], [Dispatch(d.kernel, d.storage, d.uniform, folded)], [Read(hc, 0, a.nbytes)])
    np.testing.assert_allclose(np.frombuffer(out, np.float32), a + b * np.float32(s), rtol=1e-6)
    for h in (ha, hb, hc):
        backend.free(h)


def test_padded_fold_of_unguarded_kernel_is_dropped_by_bounds_checks():
    """The hazard fold_grid avoids when it can: a static n = 4 * 65537 kernel has no bounds
    check, 65537 groups (prime) fold with padding and group 65537 runs. wgpu's bounds checks
    drop its writes only because the output slice is bound at its exact size."""
    n = 4 * 65537
    a = te.placeholder((n,), "float32", name="A")
    c = te.compute((n,), lambda i: a[i] + 1.0, name="C")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"inc4": te.create_prim_func([a, c]).with_attr("global_symbol", "inc4")}))
    (loop,) = sch.get_loops(sch.get_sblock("C", func_name="inc4"))
    bx, tx = sch.split(loop, [None, 4])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    wgsl, infos = compile_kernels(sch.mod)
    assert "podArgs.n" not in wgsl["inc4_kernel"] and " < " not in wgsl["inc4_kernel"].split("packGridDimX) {")[1]
    be = WgpuBackend.create("auto")
    be.load_kernels([spec_from_func_info("inc4", wgsl["inc4_kernel"], infos["inc4_kernel"])])
    ha = be.alloc((n + 64) * 4)
    hc = be.alloc((n + 64) * 4)
    be.write(hc, 0, np.full(n + 64, -7, np.float32).tobytes())
    d = Dispatch(0, (BufferSlice(ha, 0, (n + 64) * 4), BufferSlice(hc, 0, n * 4)), pack_uniform([], [], 65537), (65537, 1, 1))
    (out,) = be.run([], [d], [Read(hc, 0, (n + 8) * 4)])
    out = np.frombuffer(out, np.float32)
    assert (out[:n] == 1).all() and (out[n:] == -7).all()


def test_gemv_dlight(backend):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 256), dtype=np.float32)
    w = rng.standard_normal((64, 256), dtype=np.float32)
    hx, hw, hy = upload(backend, x), upload(backend, w), backend.alloc(64 * 4)
    d = Dispatch(
        kernel=backend.kernel_index["gemv"],
        storage=(whole(hw, w), whole(hx, x), whole(hy, 256)),  # kernel order W, X, Y
        uniform=pack_uniform([], [], 64),
        grid=(64, 1, 1),  # one workgroup (64 threads) per output row
    )
    (out,) = backend.run([], [d], [Read(hy, 0, 256)])
    np.testing.assert_allclose(np.frombuffer(out, np.float32), (x @ w.T)[0], rtol=1e-4, atol=1e-4)
    for h in (hx, hw, hy):
        backend.free(h)


def test_f16_kernel(backend):
    if not backend.has_feature("shader-f16"):
        pytest.skip("adapter lacks shader-f16")
    a = np.linspace(-3, 3, 1000).astype(np.float16)
    ha, hc = upload(backend, a), backend.alloc(a.nbytes)
    d = Dispatch(backend.kernel_index["scale16"], (whole(ha, a), whole(hc, a)), pack_uniform([], [], 4), (4, 1, 1))
    (out,) = backend.run([], [d], [Read(hc, 0, a.nbytes)])
    np.testing.assert_array_equal(np.frombuffer(out, np.float16), a * np.float16(2))
    backend.free(ha)
    backend.free(hc)


def test_chain_in_one_submit_with_writes_and_reads(backend, monkeypatch):
    """Writes, then d1 = a + b*s1, e = d1 + b*s2 (reads d1), one submit, two reads."""
    submits = []

    class CountingQueue:
        def __init__(self, q):
            self._q = q

        def submit(self, buffers):
            submits.append(len(buffers))
            return self._q.submit(buffers)

        def __getattr__(self, k):
            return getattr(self._q, k)

    monkeypatch.setattr(backend, "_queue", CountingQueue(backend._queue))
    n = 1000
    a = np.arange(n, dtype=np.float32)
    b = np.ones(n, np.float32)
    ha, hb, hd, he = (backend.alloc(a.nbytes) for _ in range(4))
    sl = lambda h: whole(h, a)  # noqa: E731
    d1 = axpy_dispatch(backend, "axpy", sl(ha), sl(hb), sl(hd), n, 2.0)
    d2 = axpy_dispatch(backend, "axpy", sl(hd), sl(hb), sl(he), n, 3.0)
    out_e, out_d = backend.run(
        [Write(ha, 0, a.tobytes()), Write(hb, 0, b.tobytes())], [d1, d2], [Read(he, 0, a.nbytes), Read(hd, 0, 40)]
    )
    assert submits == [1]
    np.testing.assert_array_equal(np.frombuffer(out_e, np.float32), a + 5)
    np.testing.assert_array_equal(np.frombuffer(out_d, np.float32), a[:10] + 2)
    for h in (ha, hb, hd, he):
        backend.free(h)


@pytest.mark.parametrize("pass_per_dispatch", [False, True])
def test_200_dependent_dispatches(compiled, pass_per_dispatch):
    """Ping-pong p -> q -> p ... 200 times in one run: each dispatch sees the previous one's
    output, in one pass (wgpu inserts the barriers) and with one pass per dispatch."""
    specs, _ = compiled
    try:
        be = WgpuBackend.create("auto", pass_per_dispatch=pass_per_dispatch)
    except DeviceError as e:
        pytest.skip(str(e))
    be.load_kernels([specs["axpy"]])
    be.kernel_index = {"axpy": 0}
    n = 256
    start = np.arange(n, dtype=np.float32)
    hp, hq, hone = upload(be, start), be.alloc(n * 4), upload(be, np.ones(n, np.float32))
    p, q, one = whole(hp, n * 4), whole(hq, n * 4), whole(hone, n * 4)
    ds = [axpy_dispatch(be, "axpy", *((p, one, q) if i % 2 == 0 else (q, one, p)), n, 1.0) for i in range(200)]
    (out,) = be.run([], ds, [Read(hp, 0, n * 4)])
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), start + 200)
    assert len(be._bind_groups) == 2  # cached by (kernel, slices): two distinct
    (out,) = be.run([], ds, [Read(hp, 0, n * 4)])
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), start + 400)


def test_slices_at_aligned_offsets(backend):
    """A and B live in one arena at nonzero aligned offsets; C is written mid-buffer."""
    align = backend.storage_offset_alignment
    n = 1000
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 2.0, np.float32)
    off_b = (a.nbytes + align - 1) // align * align + align  # nonzero, aligned, with a gap
    arena = backend.alloc(off_b + b.nbytes)
    out_buf = backend.alloc(4 * align + a.nbytes + 64)
    backend.write(arena, 0, a.tobytes())
    backend.write(arena, off_b, b.tobytes())
    d = axpy_dispatch(
        backend, "axpy", BufferSlice(arena, 0, a.nbytes), BufferSlice(arena, off_b, b.nbytes),
        BufferSlice(out_buf, 4 * align, a.nbytes), n, 0.5,
    )
    before, got, tail = backend.run(
        [], [d], [Read(out_buf, 0, 4 * align), Read(out_buf, 4 * align, a.nbytes), Read(out_buf, 4 * align + a.nbytes, 64)]
    )
    assert before == bytes(4 * align) and tail == bytes(64)  # untouched around the slice
    np.testing.assert_array_equal(np.frombuffer(got, np.float32), a + 1.0)
    with pytest.raises(ValueError, match="read-only and read_write"):  # even disjoint
        backend.run([], [axpy_dispatch(backend, "axpy", BufferSlice(arena, 0, a.nbytes), BufferSlice(arena, off_b, b.nbytes), BufferSlice(arena, off_b, b.nbytes), n, 1.0)], [])
    with pytest.raises(ValueError, match="multiple of"):
        bad = BufferSlice(arena, 4, a.nbytes)
        backend.run([], [axpy_dispatch(backend, "axpy", bad, bad, bad, n, 1.0)], [])
    backend.free(arena)
    backend.free(out_buf)


def test_alloc_is_zeroed_and_reads_odd_sizes(backend):
    h = backend.alloc(10)  # rounded up internally
    assert backend.run([], [], [Read(h, 0, 10)]) == [bytes(10)]
    backend.write(h, 0, b"\x01\x02\x03\x04\x05\x06")  # tail zero-padded to 8
    assert backend.run([], [], [Read(h, 0, 7), Read(h, 4, 2)]) == [b"\x01\x02\x03\x04\x05\x06\x00", b"\x05\x06"]
    assert backend.run([], [], []) == []
    backend.free(h)


def test_free_drops_buffer_and_cached_bind_groups(backend):
    n = 256
    ha, hb, hc = (backend.alloc(n * 4) for _ in range(3))
    d = axpy_dispatch(backend, "axpy", whole(ha, n * 4), whole(hb, n * 4), whole(hc, n * 4), n, 1.0)
    backend.run([], [d], [])
    assert any(k[1] == d.storage for k in backend._bind_groups)
    backend.free(hc)
    assert not any(k[1] == d.storage for k in backend._bind_groups)
    with pytest.raises(ValueError, match="not allocated"):
        backend.run([], [d], [])
    with pytest.raises(KeyError):
        backend.free(hc)
    assert backend.alloc(16) not in (ha, hb, hc)  # handles are never reused
    backend.free(ha)
    backend.free(hb)


def test_large_readback_grows_staging(backend):
    n = 1 << 20
    a = np.arange(n, dtype=np.float32)
    h = upload(backend, a)
    (out,) = backend.run([], [], [Read(h, 0, a.nbytes)])
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), a)
    backend.free(h)


# ---------------------------------------------------------------- errors


def test_bad_wgsl_names_the_kernel(compiled):
    specs, _ = compiled
    be = WgpuBackend.create("auto")
    broken = specs["axpy"].wgsl.replace("fma(", "fmaa(")
    with pytest.raises(KernelCompileError, match="'broken_axpy'.*fmaa"):
        be.load_kernels([specs["gemv"], KernelSpec("broken_axpy", broken, "axpy_kernel", ("read", "read", "read_write"), True)])
    with pytest.raises(KernelCompileError, match="'axpy'.*storage_access"):
        s = specs["axpy"]
        be.load_kernels([KernelSpec(s.name, s.wgsl, s.entry_point, ("read", "read_write", "read_write"), True)])
    with pytest.raises(KernelCompileError, match="no entry point 'nope'"):
        s = specs["axpy"]
        be.load_kernels([KernelSpec(s.name, s.wgsl, "nope", s.storage_access, True)])


def test_no_adapter_is_a_device_error(monkeypatch):
    with pytest.raises(DeviceError, match="no GPU adapter matches 'no-such-gpu'"):
        WgpuBackend.create("no-such-gpu")
    monkeypatch.setattr(wgpu.gpu, "enumerate_adapters_sync", lambda: [])
    with pytest.raises(DeviceError, match="mesa-vulkan-drivers"):
        WgpuBackend.create("auto")


def test_missing_required_feature(backend):
    with pytest.raises(DeviceError, match="lacks required features"):
        WgpuBackend(required_features=["made-up-feature"])
    backend.require_features(backend.features)
    with pytest.raises(MissingFeatureError, match="'q4f16_1' needs the WebGPU feature 'made-up'.*use q4f32_1"):
        backend.require_features(["made-up"], "q4f16_1", ["q4f32_1"])


def test_enable_subgroups_line_is_stripped():
    be = WgpuBackend.create("auto")
    if not be.has_feature("subgroups"):
        pytest.skip("adapter lacks subgroups")
    wgsl = """enable subgroups;
@group(0) @binding(0) var<storage, read_write> out : array<u32>;
struct PODArgs { packGridDimX: u32 }
@group(0) @binding(1) var<uniform> podArgs : PODArgs;
@compute @workgroup_size(32, 1, 1)
fn count_kernel(@builtin(local_invocation_id) t : vec3<u32>) {
  out[t.x] = subgroupAdd(1u);
}
"""
    be.load_kernels([kernel_spec_from_wgsl("count", wgsl, "count_kernel")])
    h = be.alloc(128)
    (out,) = be.run([], [Dispatch(0, (whole(h, 128),), pack_uniform([], [], 1), (1, 1, 1))], [Read(h, 0, 128)])
    sizes = np.frombuffer(out, np.uint32)
    assert (sizes == be.subgroup_size).all()  # the measured subgroup size (lavapipe: 8)
    assert be.subgroup_size & (be.subgroup_size - 1) == 0
