"""compiler/cpu_gemm.py: the hand-written float32 matmuls of plain weights for CPUs (tiles of
rows x columns; rows in lanes for a function marked WIDE_BATCHES), against numpy in float64,
which functions they take over, and a row's bits whatever rows run beside it."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402

from wick.compiler.cpu_gemm import (  # noqa: E402
    ROW_BLOCK,
    f32_matmul_prim_func,
    f32_matmul_rows_in_lanes,
    match_f32_matmul,
)
from wick.compiler.targets.cpu import cpu_target  # noqa: E402
from wick.compiler.cpu_schedules import WIDE_BATCHES, schedule, vector_isa  # noqa: E402

ADDS = [(), ("residual",), ("bias",), ("bias", "residual")]


def te_f32_matmul(N: int, K: int, *, adds: tuple[str, ...] = (), dtype: str = "float32"):
    """The function Relax fuses from compiler/models/layers.py's plain QLinear: NT_matmul
    [-> + bias] [-> + residual] (blocks named as Relax names them)."""
    x = te.placeholder((te.var("b", "int64"), K), dtype, name="x")
    b = x.shape[0]
    w = te.placeholder((N, K), dtype, name="w")
    k = te.reduce_axis((0, K), name="k")
    out = te.compute((b, N), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="NT_matmul")
    extra = []
    for n, kind in enumerate(adds):
        prev, name = out, ("T_add" if n == 0 else "T_add1")
        if kind == "bias":
            p = te.placeholder((N,), dtype, name=f"bias{n}")
            out = te.compute((b, N), lambda i, j: prev[i, j] + p[j], name=name)
        else:
            p = te.placeholder((b, N), dtype, name=f"r{n}")
            out = te.compute((b, N), lambda i, j: prev[i, j] + p[i, j], name=name)
        extra.append(p)
    return te.create_prim_func([x, w, *extra, out])


# each kernel with each native tile (an AVX-512 tile runs on an AVX2 machine too, its vectors
# in halves; an AVX2 one anywhere)
KINDS = [f"{kind}-{isa}" for kind in ("tiles", "rows_in_lanes") for isa in ("avx512", "avx2")]


def _build(func, kind="tiles-avx512"):
    kind, isa = kind.split("-")
    match = match_f32_matmul(func)
    f = (f32_matmul_rows_in_lanes if kind == "rows_in_lanes" else f32_matmul_prim_func)(
        **match, isa=isa)
    return tvm.tirx.build(tvm.IRModule({"f": f.with_attr("global_symbol", "f")}),
                          target=cpu_target())


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("N,adds", [(48, ()), (48, ("residual",)), (45, ("bias", "residual"))])
def test_the_schedule_takes_the_kernel_with_this_machines_tile(N, adds, wide):
    func = te_f32_matmul(N, 64, adds=adds)
    if wide:
        func = func.with_attr(WIDE_BATCHES, True)
    got = schedule(func, cpu_target())
    build = f32_matmul_rows_in_lanes if wide else f32_matmul_prim_func
    here = vector_isa(cpu_target())  # (this machine's: the next test checks it)
    assert got.script() == build(N, 64, adds, isa=here).script()
    other = "avx2" if here == "avx512" else "avx512"
    if N == 48:  # (45 columns go one at a time: rows in lanes is then one kernel for both)
        assert got.script() != build(N, 64, adds, isa=other).script()


def test_the_tile_follows_the_vector_registers():
    from wick.compiler.targets.wasm import wasm_target
    from wick.engine.artifact import host_cpu_flags

    flags = host_cpu_flags()
    if flags:  # (Linux: /proc/cpuinfo's flags; LLVM's name for this CPU must agree)
        assert vector_isa(cpu_target()) == ("avx512" if "avx512f" in flags else "avx2")

    assert vector_isa(cpu_target("skylake-avx512")) == vector_isa(cpu_target("znver4")) == "avx512"
    assert vector_isa(cpu_target("znver3")) == vector_isa(cpu_target("haswell")) == "avx2"
    assert vector_isa(wasm_target()) == "wasm"


def _run(lib, x, w, extra, N):
    tensors = [tvm.runtime.tensor(a) for a in (x, w, *extra, np.zeros((len(x), N), np.float32))]
    lib["f"](*tensors)
    return tensors[-1].numpy()


def test_it_takes_over_the_float32_matmul_of_plain_weights_only():
    assert match_f32_matmul(te_f32_matmul(64, 96)) == {"N": 64, "K": 96, "adds": ()}
    for adds in ADDS:
        assert match_f32_matmul(te_f32_matmul(64, 96, adds=adds))["adds"] == adds
    assert match_f32_matmul(te_f32_matmul(64, 96, dtype="float16")) is None
    assert match_f32_matmul(te_f32_matmul(64, 100)) is None  # K not in chunks of 16
    from tests.compiler.test_cpu_gemv import te_matmul

    assert match_f32_matmul(te_matmul(64, 96)) is None  # q4: cpu_gemv's


# every add combination on one shape; the other shapes (column tiles of 2 and 1, a long K)
# with both adds (each build costs ~0.5 s of CI)
CASES = [(48, 64, adds) for adds in ADDS] + [(N, K, ("bias", "residual"))
                                             for N, K in ((200, 320), (42, 32), (45, 48))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,K,adds", CASES)
def test_matches_numpy(N, K, adds, kind):
    """N in tiles of 16/8/4 columns, of 2 (42) and of 1 (45); batches of one row, of a partial
    tile, and across row blocks."""
    rng = np.random.default_rng(N + K)
    w = rng.standard_normal((N, K)).astype(np.float32)
    lib = _build(te_f32_matmul(N, K, adds=adds), kind)
    for b in (1, 7, 17, ROW_BLOCK + 3):
        x = rng.standard_normal((b, K)).astype(np.float32)
        arrays = {"bias": rng.standard_normal(N).astype(np.float32),
                  "residual": rng.standard_normal((b, N)).astype(np.float32)}
        want = x.astype(np.float64) @ w.T.astype(np.float64) + sum(arrays[a] for a in adds)
        got = _run(lib, x, w, [arrays[a] for a in adds], N)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("adds", [(), ("bias", "residual")])
def test_a_row_gets_the_same_bits_whatever_rows_run_beside_it(adds, kind):
    """Batch invariance: a row alone, in a full tile of 4, in a partial one or in the next
    row block sums the same products in the same order."""
    N, K = 40, 96
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N, K)).astype(np.float32)
    lib = _build(te_f32_matmul(N, K, adds=adds), kind)
    rows_total = ROW_BLOCK + 9
    x = rng.standard_normal((rows_total, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((rows_total, N)).astype(np.float32)

    def run(rows):
        extra = {"bias": bias, "residual": res[rows]}
        return _run(lib, x[rows], w, [extra[a] for a in adds], N)

    alone = np.concatenate([run([i]) for i in range(rows_total)])
    for rows in (list(range(rows_total)), [4, 0, 8, 2, 6], [7, 3], list(range(5, 70))):
        assert np.array_equal(run(rows), alone[rows]), rows


def test_the_kernel_sets_build_on_two_threads_to_the_same_bytes(monkeypatch):
    """targets.build_all builds the CPU and WebAssembly libraries concurrently; each is byte
    for byte the library built alone, and the sets come in the manifest's order."""
    monkeypatch.setenv("WICK_KERNEL_CACHE", "off")  # (built here, not kept from another test)
    from wick.compiler.targets import build_all
    from wick.compiler.targets.cpu import CpuSet, build_cpu_library
    from wick.compiler.targets.cuda import CudaSet
    from wick.compiler.targets.wasm import build_wasm_libraries
    from wick.compiler.targets.webgpu import WebGPUSet

    functions = {"matmul_a": te_f32_matmul(64, 64), "matmul_b": te_f32_matmul(32, 128,
                                                                             adds=("bias",))}
    stages = []
    both = build_all({"webgpu": WebGPUSet([], {}), "cpu": CpuSet(functions), "cuda": CudaSet()},
                     lambda stage, done, total: stages.append((done, total)))
    assert stages == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert list(both) == ["webgpu", "cpu", "wasm", "wasm_threads", "wasm_relaxed",
                          "wasm_threads_relaxed", "cuda"]
    assert both["cpu"].files == {"kernels/cpu/kernels.so": build_cpu_library(functions)[0]}
    assert both["cpu"].entry["form"] == "library" and both["cuda"].entry["form"] == "source"
    alone = build_wasm_libraries(functions)
    assert {k: both[k].files[both[k].entry["file"]] for k in alone} == {
        k: v[0] for k, v in alone.items()}
