"""compiler/cpu_gemv.py: the hand-written float32 q4 matmul for CPUs, against numpy on the
weights ``quantization.dequantize`` gives back, and which functions it takes over."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402

from wick.compiler.cpu_gemv import match_q4_matmul  # noqa: E402
from wick.compiler.targets.cpu import cpu_target  # noqa: E402
from wick.compiler.cpu_schedules import schedule  # noqa: E402
from wick.compiler.quantization import dequantize, get_quantization, quantize  # noqa: E402


def te_matmul(N: int, K: int, *, adds: tuple[str, ...] = (), dtype: str = "float32",
              bits: int = 4):
    """The function compiler/models/layers.py builds (dequantize -> matmul [-> + bias]
    [-> + residual])."""
    per_word = 32 // bits
    x = te.placeholder((te.var("b", "int64"), K), dtype, name="x")
    b = x.shape[0]
    w = te.placeholder((N, K // per_word), "uint32", name="w")
    s = te.placeholder((N, K // 32), dtype, name="s")
    m = te.placeholder((N, K // 32), dtype, name="m")
    mask = (1 << bits) - 1
    dq = te.compute((N, K), lambda o, i: (
        w[o, i // per_word] >> (i % per_word * bits).astype("uint32") & mask
    ).astype(dtype) * s[o, i // 32] + m[o, i // 32], name="dequantize")
    k = te.reduce_axis((0, K), name="k")
    out = te.compute((b, N), lambda i, j: te.sum(x[i, k] * dq[j, k], axis=k), name="matmul")
    extra = []
    for n, kind in enumerate(adds):
        out, p = _add(out, kind, n, b, N, dtype)
        extra.append(p)
    return te.create_prim_func([x, w, s, m, *extra, out])


def _add(prev, kind: str, n: int, b, N: int, dtype: str):
    """``prev`` plus a bias (N,) or a residual (b, N), as Relax's add names it."""
    name = "T_add" if n == 0 else "T_add1"
    if kind == "bias":
        p = te.placeholder((N,), dtype, name=f"bias{n}")
        return te.compute((b, N), lambda i, j: prev[i, j] + p[j], name=name), p
    p = te.placeholder((b, N), dtype, name=f"r{n}")
    return te.compute((b, N), lambda i, j: p[i, j] + prev[i, j], name=name), p


ADDS = [(), ("residual",), ("bias",), ("bias", "residual")]


def test_it_takes_over_the_float32_q4_matmul_only():
    assert match_q4_matmul(te_matmul(64, 96)) == {"N": 64, "K": 96, "adds": (), "bits": 4}
    for adds in ADDS:
        assert match_q4_matmul(te_matmul(64, 96, adds=adds))["adds"] == adds
    assert match_q4_matmul(te_matmul(64, 96, dtype="float16")) is None
    assert match_q4_matmul(te_matmul(64, 96, bits=8))["bits"] == 8
    assert match_q4_matmul(te_matmul(64, 96, adds=("residual", "residual"))) is None


def _arrays(rng, b, N):
    return {"bias": rng.standard_normal(N).astype(np.float32),
            "residual": rng.standard_normal((b, N)).astype(np.float32)}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("adds", ADDS)
@pytest.mark.parametrize("N,K", [(48, 64), (200, 320)])
def test_matches_numpy_on_dequantized_weights(N, K, adds, bits):
    quant = get_quantization(f"q{bits}f32_1")
    rng = np.random.default_rng(N + K)
    packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32), quant)
    func = schedule(te_matmul(N, K, adds=adds, bits=bits), cpu_target())
    assert "q4_matmul" in func.script()  # (not the scheduled TE version)
    lib = tvm.tirx.build(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}),
                         target=cpu_target())
    weight = dequantize(packed, scale, minimum).astype(np.float64)
    for b in (1, 5):  # one decode row, and a batch (rows share the weights)
        x = rng.standard_normal((b, K)).astype(np.float32)
        extra = _arrays(rng, b, N)
        want = x.astype(np.float64) @ weight.T + sum(extra[a] for a in adds)
        args = [x, packed, scale, minimum, *(extra[a] for a in adds), np.zeros((b, N), np.float32)]
        tensors = [tvm.runtime.tensor(a) for a in args]
        lib["f"](*tensors)
        got = tensors[-1].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("adds", [(), ("bias", "residual")])
def test_a_row_gets_the_same_bits_whatever_rows_run_beside_it(adds, bits):
    """Batch invariance (and speculation's exactness): rows are tiled so that a group's
    weights are dequantized once per tile, and a row's sums run in the same order alone, in
    a full tile or in a partial one."""
    N, K = 40, 96
    quant = get_quantization(f"q{bits}f32_1")
    rng = np.random.default_rng(3)
    packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32), quant)
    func = schedule(te_matmul(N, K, adds=adds, bits=bits), cpu_target())
    lib = tvm.tirx.build(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}),
                         target=cpu_target())
    x = rng.standard_normal((9, K)).astype(np.float32)
    extra = _arrays(rng, 9, N)

    def run(rows):
        args = [x[rows], packed, scale, minimum] + [
            extra[a] if a == "bias" else extra[a][rows] for a in adds]
        tensors = [tvm.runtime.tensor(a) for a in args + [np.zeros((len(rows), N), np.float32)]]
        lib["f"](*tensors)
        return tensors[-1].numpy()

    alone = np.concatenate([run([i]) for i in range(9)])
    for rows in (list(range(9)), [4, 0, 8, 2, 6], [7, 3]):
        assert np.array_equal(run(rows), alone[rows]), rows


@pytest.mark.parametrize("isa", ["avx512", "avx2", "wasm"])
def test_each_isas_tiles_match_numpy_and_keep_a_rows_bits(isa):
    """Every vector ISA's tiles (cpu_gemv.ISA_TILES; wider vectors than the host's run in
    parts) on this CPU: 11 rows go in full and partial tiles of each size, equal numpy on the
    dequantized weights, and each row's bits are its bits alone."""
    from wick.compiler.cpu_gemv import ISA_TILES, q4_matmul_prim_func

    N, K, adds = 40, 96, ("bias", "residual")
    quant = get_quantization("q4f32_1")
    rng = np.random.default_rng(5)
    packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32), quant)
    func = q4_matmul_prim_func(**match_q4_matmul(te_matmul(N, K, adds=adds)), isa=isa)
    lib = tvm.tirx.build(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}),
                         target=cpu_target())
    rows = sum(ISA_TILES[isa]) + ISA_TILES[isa][0]  # (two of the widest, one of each other)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    extra = _arrays(rng, rows, N)

    def run(r):
        args = [x[r], packed, scale, minimum, extra["bias"], extra["residual"][r],
                np.zeros((len(r), N), np.float32)]
        tensors = [tvm.runtime.tensor(a) for a in args]
        lib["f"](*tensors)
        return tensors[-1].numpy()

    got = run(list(range(rows)))
    weight = dequantize(packed, scale, minimum).astype(np.float64)
    want = x.astype(np.float64) @ weight.T + extra["bias"] + extra["residual"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())
    alone = np.concatenate([run([i]) for i in range(rows)])
    assert np.array_equal(got, alone)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("isa", ["avx512", "avx2", "wasm"])
def test_a_step_of_many_rows_dequantizes_each_chunk_once_with_the_same_bits(isa, bits):
    """A step of CHUNK_TILES of the widest tiles or more reads each chunk's weights from
    floats dequantized once per task (prefill, long verify steps); every (row, output) sum is the
    same expression as the tile-by-tile kernel's, so the bits equal it, row by row, past the
    last full chunk of outputs too (N = 40)."""
    from wick.compiler.cpu_gemv import (CHUNK_BYTES, CHUNK_TILES, COLS, GROUP, ISA_TILES,
                                        q4_matmul_prim_func)

    N, K, adds = 40, 96, ("bias", "residual")
    quant = get_quantization(f"q{bits}f32_1")
    rng = np.random.default_rng(7)
    packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32), quant)
    libs = {}
    for chunks in (True, False):
        func = q4_matmul_prim_func(N, K, adds, isa=isa, bits=bits, dequantized_chunks=chunks)
        libs[chunks] = tvm.tirx.build(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}),
                                      target=cpu_target())
    rows = CHUNK_TILES[isa] * ISA_TILES[isa][0] + 3  # (full tiles and a remainder)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    extra = _arrays(rng, rows, N)
    got = {}
    for chunks, lib in libs.items():
        args = [x, packed, scale, minimum, extra["bias"], extra["residual"],
                np.zeros((rows, N), np.float32)]
        tensors = [tvm.runtime.tensor(a) for a in args]
        lib["f"](*tensors)
        got[chunks] = tensors[-1].numpy()
    assert np.array_equal(got[True], got[False])
    weight = dequantize(packed, scale, minimum).astype(np.float64)
    want = x.astype(np.float64) @ weight.T + extra["bias"] + extra["residual"]
    np.testing.assert_allclose(got[True], want, rtol=1e-5, atol=1e-4 * np.abs(want).max())
    # the chunk's buffer in a parallel loop of its own, which a step of fewer rows never
    # enters (TVM allocates a parallel body's scratch at its top, whatever tests follow)
    lines = q4_matmul_prim_func(N, K, isa=isa, bits=bits).script().splitlines()
    loops = [i for i, line in enumerate(lines) if "T.parallel" in line]
    buffers = [i for i, line in enumerate(lines) if "wd = T.alloc_buffer" in line]
    assert len(loops) == 2 and len(buffers) == 1 and loops[0] < buffers[0] < loops[1]
    rows_needed = CHUNK_TILES[isa] * ISA_TILES[isa][0]
    assert f"b >= T.int64({rows_needed})" in lines[loops[0] - 1]
    # by default only where a chunk's floats fit CHUNK_BYTES (a wide K streamed them from
    # further out than the packed weights: slower)
    wide = CHUNK_BYTES // (4 * COLS) + GROUP
    assert "wd = " not in q4_matmul_prim_func(N, wide, isa=isa, bits=bits).script()


def te_expert_matmul(E: int, N: int, K: int, S: int, per_slot: bool, bits: int = 4):
    """compiler/models/layers.py's ExpertLinears function itself: x (n, K) or (n, S, K),
    experts (n, S), the stacked packed weights (E, N, ..), out (n, S, N)."""
    from wick.compiler.models.layers import ExpertLinears

    quant = get_quantization("q4f32_1" if bits == 4 else "q8f32_1")
    n = te.var("n", "int64")
    x = te.placeholder((n, S, K) if per_slot else (n, K), "float32", name="x")
    experts = te.placeholder((n, S), "int32", name="experts")
    w = te.placeholder((E, N, K * bits // 32), "uint32", name="w")
    s = te.placeholder((E, N, K // 32), "float32", name="s")
    m = te.placeholder((E, N, K // 32), "float32", name="m")
    out = ExpertLinears(E, K, N, quant)._compute(x, experts, w, s, m)
    return te.create_prim_func([x, experts, w, s, m, out])


def expert_case(E: int, N: int, K: int, S: int, n: int, per_slot: bool, bits: int, seed: int = 3):
    """Arguments of an expert matmul (one expert index out of range: the kernel clamps it, as
    the TE function does) and numpy's answer on the dequantized weights."""
    rng = np.random.default_rng(seed)
    packed, scale, minimum = quantize(rng.standard_normal((E * N, K)).astype(np.float32),
                                      get_quantization("q4f32_1" if bits == 4 else "q8f32_1"))
    weight = dequantize(packed, scale, minimum).reshape(E, N, K).astype(np.float64)
    x = rng.standard_normal((n, S, K) if per_slot else (n, K)).astype(np.float32)
    experts = rng.integers(0, E, size=(n, S)).astype(np.int32)
    experts[0, 0] = E + 3
    rows = x if per_slot else np.repeat(x[:, None], S, axis=1)
    want = np.einsum("rsk,rsjk->rsj", rows.astype(np.float64), weight[np.minimum(experts, E - 1)])
    args = [x, experts, packed.reshape(E, N, -1), scale.reshape(E, N, -1),
            minimum.reshape(E, N, -1), np.zeros((n, S, N), np.float32)]
    return args, want


def run_native(func, args):
    lib = tvm.tirx.build(tvm.IRModule({"main": schedule(func, cpu_target())
                                       .with_attr("global_symbol", "main")}), target=cpu_target())
    arrays = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    lib["main"](*arrays)
    return arrays[-1].numpy()


@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
def test_expert_matmul_matches_numpy_and_keeps_a_rows_bits(per_slot, bits):
    """A mixture-of-experts step's gathered matmul (each token's slots read their experts'
    rows) is cpu_gemv's kernel, equal to numpy on the dequantized weights, and a token's
    outputs are the same bits alone and beside others. N = 40: a chunk of outputs is partial."""
    from wick.compiler.cpu_gemv import match_expert_matmul

    func = te_expert_matmul(5, 40, 96, 3, per_slot, bits)
    assert match_expert_matmul(func) == {"E": 5, "N": 40, "K": 96, "S": 3,
                                         "per_slot": per_slot, "bits": bits}
    assert "expert_matmul" in schedule(func, cpu_target()).script()
    args, want = expert_case(5, 40, 96, 3, 6, per_slot, bits)
    got = run_native(func, args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    alone = run_native(func, [a[:1] if a.ndim >= 2 and a.shape[0] == 6 else a for a in args])
    assert np.array_equal(alone[0], got[0])
