"""compiler/batched_gemv.py's batched dequantize-GEMV schedule, run here: the same scheduled TIR
lowered for WebGPU (WGSL has no 8-lane vectors, so each row's inputs load one by one) on
lavapipe, against numpy's dequantize-then-matmul. The CUDA lowering of the same schedule ran on
an H200 (bench/results/README.md: parity, batch invariance, bench/gpu_gemv.py)."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import te, tirx  # noqa: E402

from wick.compiler.batched_gemv import schedule_batched_gemv  # noqa: E402

N, K = 48, 512  # (48 outputs: six blocks of 2 warps x 4; 512 = 64 words: two steps of 32 lanes)


def q4_gemv(with_residual: bool, dtype: str = "float16", K: int = K) -> tirx.PrimFunc:
    """The shape of a decode plan's q4 GEMV: ``w = nibble * scale + min`` in groups of 32, an
    f32 sum over K (q4f16_1: cast to f16, optionally plus a residual; q4f32_1: the sum is the
    output)."""
    b = tirx.Var("b", "int64")
    x = te.placeholder((b, K), dtype, name="x")
    q = te.placeholder((N, K // 8), "uint32", name="q")
    scale = te.placeholder((N, K // 32), dtype, name="scale")
    low = te.placeholder((N, K // 32), dtype, name="low")
    deq = te.compute((N, K), lambda o, i: (
        ((q[o, i // 8] >> ((i % 8) * 4).astype("uint32")) & tirx.const(15, "uint32"))
        .astype(dtype) * scale[o, i // 32] + low[o, i // 32]), name="dequantize")
    k = te.reduce_axis((0, K), name="k")
    mm = te.compute((b, N), lambda i, j: te.sum(
        x[i, k].astype("float32") * deq[j, k].astype("float32"), axis=k), name="matmul")
    if dtype == "float32":
        return te.create_prim_func([x, q, scale, low, mm]).with_attr("global_symbol", "gemv")
    out = te.compute((b, N), lambda i, j: mm[i, j].astype("float16"), name="cast")
    args = [x, q, scale, low, out]
    if with_residual:
        res = te.placeholder((b, N), "float16", name="res")
        out = te.compute((b, N), lambda i, j: res[i, j] + out[i, j], name="T_add")
        args = [x, q, scale, low, res, out]
    return te.create_prim_func(args).with_attr("global_symbol", "gemv")


def reference(arrays: list[np.ndarray]) -> np.ndarray:
    x, q, scale, low = arrays[:4]
    K = x.shape[1]
    shifts = ((np.arange(K) % 8) * 4).astype(np.uint32)
    nibbles = (np.repeat(q, 8, axis=1) >> shifts) & 15
    w = nibbles.astype(x.dtype) * np.repeat(scale, 32, axis=1) + np.repeat(low, 32, axis=1)
    out = (x.astype(np.float32) @ w.astype(np.float32).T).astype(x.dtype)
    return out + arrays[4] if len(arrays) == 5 else out  # (with the residual)


def run(backend, func: tirx.PrimFunc, arrays: list[np.ndarray]) -> np.ndarray:
    from wick.compiler.targets.webgpu import build_kernels, webgpu_target
    from wick.engine.backend import Read, TensorRef
    from wick.engine.plan import KernelTable, tir_call

    with webgpu_target():
        kernels, funcs = build_kernels(tvm.IRModule({tvm.ir.GlobalVar("gemv"): func}),
                                       webgpu_target())
    table = KernelTable([{"name": k.name, "wgsl": k.wgsl, "entry_point": k.entry_point,
                          "storage_access": k.storage_access, "scalar_dtypes": k.scalar_dtypes}
                         for k in kernels], backend)
    tir = {n: {"params": f.params, "launches": f.launches} for n, f in funcs.items()}
    refs = []
    for a in arrays:
        buf = backend.alloc(max(4, a.nbytes))
        backend.write(buf, 0, a.tobytes())
        refs.append(TensorRef(buf, 0, a.shape, str(a.dtype)))
    out_dtype = arrays[-1].dtype
    dispatches: list = []
    tir_call("gemv", refs, tir, table, dispatches)
    out = refs[-1]
    data = backend.run([], dispatches, [Read(out.buffer, 0, out.nbytes)])[0]
    for r in refs:
        backend.free(r.buffer)
    return np.frombuffer(data, out_dtype).reshape(out.shape)


def inputs(rows: int, with_residual: bool, dtype: str = "float16",
           seed: int = 0, K: int = K) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal((rows, K)) * 0.5).astype(dtype),
              rng.integers(0, 1 << 32, (N, K // 8), dtype=np.uint64).astype(np.uint32),
              (rng.random((N, K // 32)) * 0.02 + 0.01).astype(dtype),
              (rng.standard_normal((N, K // 32)) * 0.05).astype(dtype)]
    if with_residual:
        arrays.append((rng.standard_normal((rows, N)) * 0.5).astype(dtype))
    return arrays + [np.zeros((rows, N), dtype)]


@pytest.mark.parametrize("reduction", ["warp", "shared"])
@pytest.mark.parametrize("tile,with_residual,dtype,k", [(4, True, "float16", K),
                                                        (1, False, "float16", K),
                                                        (8, False, "float32", K),
                                                        (1, False, "float32", K),
                                                        (8, True, "float16", 576)])
def test_batched_gemv_equals_numpy_and_each_row_its_own(backend, tile, with_residual, dtype, k,
                                                        reduction):
    """(K = 576, SmolLM2's width: 72 words, split over 8 lanes, not 32; a tile of 8 rows x 4
    outputs then has more sums than lanes, each lane summing 4 in the shared form.)"""
    schedule = {"vector_loads": False, "reduction": reduction, "warps": 2}
    func = schedule_batched_gemv(q4_gemv(with_residual, dtype, k), rows=tile, **schedule)
    assert func is not None and func.attrs["tirx.is_scheduled"]
    batch = inputs(9, with_residual, dtype, K=k)  # (tiles of 4 or 8: a partial pass at the end)
    got = run(backend, func, batch)
    want = reference(batch[:-1])
    scale = float(np.abs(want.astype(np.float32)).max())
    assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() <= 2e-3 * scale
    # a row alone gives the same bits as in the batch (its sum's order does not depend on b),
    # and the same as with one row a pass (decode1's tile: nor on the tile)
    alone = run(backend, func, [a[:1] if a.shape[0] == 9 else a for a in batch])
    assert np.array_equal(alone[0], got[0])
    one_row = schedule_batched_gemv(q4_gemv(with_residual, dtype, k), rows=1, **schedule)
    assert np.array_equal(run(backend, one_row, batch), got)


def test_other_shapes_are_left_to_dlight():
    b = tirx.Var("b", "int64")
    x = te.placeholder((b, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    k = te.reduce_axis((0, K), name="k")
    mm = te.compute((b, N), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="matmul")
    plain = te.create_prim_func([x, w, mm])  # (no packed weights to dequantize: q0f16's GEMVs)
    assert schedule_batched_gemv(plain) is None


def test_a_result_read_twice_is_left_to_dlight():
    """A GEMV whose sums two blocks read is not this schedule's form: None (dlight's then),
    not a kernel with the second reader left outside it."""
    b = tirx.Var("b", "int64")
    xs = te.placeholder((b, K), "float32", name="x")
    qs = te.placeholder((N, K // 8), "uint32", name="q")
    sc = te.placeholder((N, K // 32), "float32", name="scale")
    lo = te.placeholder((N, K // 32), "float32", name="low")
    deq = te.compute((N, K), lambda o, i: (
        ((qs[o, i // 8] >> ((i % 8) * 4).astype("uint32")) & tirx.const(15, "uint32"))
        .astype("float32") * sc[o, i // 32] + lo[o, i // 32]), name="dequantize")
    k = te.reduce_axis((0, K), name="k")
    m = te.compute((b, N), lambda i, j: te.sum(xs[i, k] * deq[j, k], axis=k), name="matmul")
    double = te.compute((b, N), lambda i, j: m[i, j] * 2.0, name="double")
    square = te.compute((b, N), lambda i, j: m[i, j] * m[i, j], name="square")
    shared = te.create_prim_func([xs, qs, sc, lo, double, square])
    assert schedule_batched_gemv(shared) is None


def test_webgpu_decode_plans_take_it_with_sums_in_workgroup_memory(tiny_f16_artifact):
    """The WebGPU set's decode plans' dequantize-GEMVs are this schedule's shared form (2 warps
    a workgroup, the sums in workgroup memory), in decode and decode1 alike: a function taken
    by one plan and left to dlight by the other would sum its rows in two orders."""
    import json
    import re

    manifest = json.loads((tiny_f16_artifact / "wick-artifact.json").read_text())
    gemvs = {k["name"]: (tiny_f16_artifact / k["file"]).read_text()
             for k in manifest["kernel_sets"]["webgpu"]["kernels"]
             if k["name"].startswith(("decode_", "decode1_")) and "dequantize_matmul" in k["name"]}
    batched = {name for name, wgsl in gemvs.items() if "var<workgroup>" in wgsl
               and re.search(r"@workgroup_size\((32|16|8|4|2|1), 2, 1\)", wgsl)}
    assert len(batched) >= 6, sorted(gemvs)
    by_plan = {plan: {n.split("_", 1)[1] for n in batched if n.split("_", 1)[0] == plan}
               for plan in ("decode", "decode1")}
    assert by_plan["decode"] and by_plan["decode"] == by_plan["decode1"], by_plan
