"""A hand-written CPU kernel for the float32 matmul of unquantized weights: ``out = x @ W^T``
(+ a bias and/or a residual), W (N, K) as the models store it, replacing the scheduled TE
version (cpu_schedules.py rule 2) where the pattern matches.

Why by hand: rule 2 computes one output at a time (16 partial sums over ``k``, then the next
output), so each multiply-add needs two loads, one of the input row and one of the weight row:
about 30 GFLOP/s on a 2-core AVX-512 machine, a fifth of what PyTorch's GEMM reaches on the
same batch (bench/embeddings.py measured 79 sentences/s against 393). Here a tile of ``R``
rows by ``C`` output columns keeps ``R x C`` partial sums in registers: per chunk of ``LANES``
``k`` it loads ``R + C`` vectors and does ``R x C`` multiply-adds.

* With AVX-512, 4 rows x 4 columns of 16 lanes (16 of its 32 registers hold the sums); with
  AVX2's 16 registers of 8 lanes, 4 rows x 2 columns of 8 (that AVX-512 tile's sums took all
  16 and spilled: 4 rows cost 3x what they cost in this tile, 8 rows 3.4x, on a Zen 3 VM);
  WebAssembly's 128-bit registers take 4 lanes, and V8 maps them on 16 of the CPU's, so there
  4 rows x 2 columns.
* Rows go in blocks of ``ROW_BLOCK`` (their inputs stay in the core's L2 while every column of
  the block's share is computed), output columns in parallel inside a block.
* A row's sums run in the same order in a full tile, a narrower one or alone: each output's
  lanes over ``k`` in order, then its lanes pairwise. So a row's result never depends on the
  rows beside it (batch invariance; speculation's exactness).
"""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.script import tirx as T

from .cpu_gemv import KERNEL_ADDS as ADDS, without_unused_adds

ROW_BLOCK = 64  # rows whose inputs (64 x K floats: 384 KiB at K = 1536) stay in L2
# the tile per vector instruction set (cpu_schedules.vector_isa: a CPU without AVX-512 takes
# "avx2", whose budget of 16 registers fits ARM's NEON too)
TILE_SHAPES = {"avx512": {"lanes": 16, "rows": 4, "cols": 4},
               "avx2": {"lanes": 8, "rows": 4, "cols": 2},
               "wasm": {"lanes": 4, "rows": 4, "cols": 2}}
WIDEST_LANES = max(t["lanes"] for t in TILE_SHAPES.values())  # (K comes in chunks of these)


def match_f32_matmul(func: tirx.PrimFunc) -> dict | None:
    """``{"N", "K", "adds"}`` when ``func`` is the float32 ``x @ W^T`` Relax fuses from
    compiler/models/layers.py's QLinear (blocks NT_matmul [, T_add [, T_add1]]; parameters x
    (b, K), W (N, K), a bias (N,) and/or a residual (b, N), out (b, N)), else None."""
    from .cpu_gemv import _block_names, adds_in_order

    names = _block_names(func)
    adds = names[1:]
    if names[:1] != ["NT_matmul"] or adds not in ([], ["T_add"], ["T_add", "T_add1"]):
        return None
    params = [p.ty for p in func.params]
    if len(params) != 3 + len(adds):
        return None
    x, w, *rest = params
    out = rest[-1]
    try:
        N, K = (int(d) for d in w.shape)
    except (TypeError, ValueError):
        return None
    if not (len(x.shape) == 2 and len(out.shape) == 2 and isinstance(x.shape[1], tirx.IntImm)
            and int(x.shape[1]) == K and isinstance(out.shape[1], tirx.IntImm)
            and int(out.shape[1]) == N and K % WIDEST_LANES == 0
            and all(str(t.dtype) == "float32" for t in (x, w, out))):
        return None
    kinds = []
    for r in rest[:-1]:
        static = [isinstance(d, tirx.IntImm) for d in r.shape]
        if str(r.dtype) != "float32":
            return None
        if len(r.shape) == 1 and static[0] and int(r.shape[0]) == N:
            kinds.append("bias")
        elif len(r.shape) == 2 and static[1] and int(r.shape[1]) == N and (
                r.shape[0].same_as(x.shape[0])):  # (a residual has x's rows)
            kinds.append("residual")
        else:
            return None
    if tuple(kinds) not in ADDS or not adds_in_order(func, 2, len(adds)):
        return None
    return {"N": N, "K": K, "adds": tuple(kinds)}


@T.macro(hygienic=False)
def store(out, i, j, value, bias, res, BIAS, RESIDUAL):
    """``out[i, j]`` = an output's sum, then the adds in the TE function's order (bias, then
    residual; Python constants: one branch is built)."""
    if BIAS and RESIDUAL:
        out[i, j] = (value + bias[j]) + res[i, j]
    elif BIAS:
        out[i, j] = value + bias[j]
    elif RESIDUAL:
        out[i, j] = value + res[i, j]
    else:
        out[i, j] = value


@functools.lru_cache(maxsize=None)  # (a model's plans repeat shapes)
def f32_matmul_prim_func(N: int, K: int, adds: tuple[str, ...] = (),
                         isa: str = "avx512") -> tirx.PrimFunc:
    """The kernel, with the matched function's parameters: x (b, K), w (N, K), one parameter
    per add (``adds``: "bias" (N,) and/or "residual" (b, N), added in that order), out (b,
    N); its tile for the vector instruction set ``isa`` (a key of TILE_SHAPES)."""
    if adds not in ADDS:
        raise ValueError(f"no kernel for the adds {adds}")
    shape = TILE_SHAPES[isa]
    L, R = shape["lanes"], shape["rows"]
    C = next(c for c in (shape["cols"], 2, 1) if N % c == 0)
    assert R in (1, 2, 4, 8), R  # (the remainder below takes four halving tile sizes)
    TILES = (R, R // 2, R // 4, R // 8)
    TILES = tuple(t or 1 for t in TILES)
    if K % L:
        raise ValueError(f"K={K} is not a multiple of {L}")
    BIAS, RESIDUAL = "bias" in adds, "residual" in adds

    # (a macro sees the names the function that uses it sees: N, K, module globals and the
    # arguments; the tile's shape and flags are passed in)
    @T.macro(hygienic=False)
    def tile(row0, rows, x, w, bias, res, out, j0, L, C, BIAS, RESIDUAL):
        acc = T.alloc_buffer((rows, C, L), "float32")
        xv = T.alloc_buffer((rows, L), "float32")
        wv = T.alloc_buffer((C, L), "float32")
        for r in T.unroll(rows):
            for c in T.unroll(C):
                for t in T.vectorized(L):
                    acc[r, c, t] = T.float32(0)
        for kc in range(K // L):
            for c in T.unroll(C):
                for t in T.vectorized(L):
                    wv[c, t] = w[j0 + c, kc * L + t]
            for r in T.unroll(rows):
                for t in T.vectorized(L):
                    xv[r, t] = x[row0 + r, kc * L + t]
            for r in T.unroll(rows):
                for c in T.unroll(C):
                    for t in T.vectorized(L):
                        acc[r, c, t] = acc[r, c, t] + xv[r, t] * wv[c, t]
        # each output's lanes pairwise (vector adds), then the adds in the TE function's order
        for r in T.unroll(rows):
            for c in T.unroll(C):
                if L == 16:  # (Python constants: only the branches that apply are built)
                    for h in T.vectorized(8):
                        acc[r, c, h] = acc[r, c, h] + acc[r, c, h + 8]
                if L >= 8:
                    for h in T.vectorized(4):
                        acc[r, c, h] = acc[r, c, h] + acc[r, c, h + 4]
                for h in T.vectorized(2):
                    acc[r, c, h] = acc[r, c, h] + acc[r, c, h + 2]
                store(out, row0 + r, j0 + c, acc[r, c, 0] + acc[r, c, 1], bias, res, BIAS,
                      RESIDUAL)

    @T.prim_func(s_tir=True)
    def f32_matmul(var_x: T.handle, var_w: T.handle, var_bias: T.handle, var_r: T.handle,
                   var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int64()
        x = T.match_buffer(var_x, (b, K), "float32")
        w = T.match_buffer(var_w, (N, K), "float32")
        bias = T.match_buffer(var_bias, (N,), "float32")
        res = T.match_buffer(var_r, (b, N), "float32")
        out = T.match_buffer(var_out, (b, N), "float32")
        for blk in range((b + ROW_BLOCK - 1) // ROW_BLOCK):
            for jt in T.parallel(N // C):
                # the block's rows: as many of the widest tiles as fit, then at most one of
                # each narrower size (TILES: halving, padded with 1s that never run)
                for i0 in range(T.min(b - blk * ROW_BLOCK, ROW_BLOCK) // TILES[0]):
                    tile(blk * ROW_BLOCK + i0 * TILES[0], TILES[0], x, w, bias, res, out,
                         jt * C, L, C, BIAS, RESIDUAL)
                if T.min(b - blk * ROW_BLOCK, ROW_BLOCK) % TILES[0] >= TILES[1]:
                    tile(blk * ROW_BLOCK + T.min(b - blk * ROW_BLOCK, ROW_BLOCK)
                         - T.min(b - blk * ROW_BLOCK, ROW_BLOCK) % TILES[0], TILES[1],
                         x, w, bias, res, out, jt * C, L, C, BIAS, RESIDUAL)
                if T.min(b - blk * ROW_BLOCK, ROW_BLOCK) % TILES[1] >= TILES[2]:
                    tile(blk * ROW_BLOCK + T.min(b - blk * ROW_BLOCK, ROW_BLOCK)
                         - T.min(b - blk * ROW_BLOCK, ROW_BLOCK) % TILES[1], TILES[2],
                         x, w, bias, res, out, jt * C, L, C, BIAS, RESIDUAL)
                if T.min(b - blk * ROW_BLOCK, ROW_BLOCK) % TILES[2] >= TILES[3]:
                    tile(blk * ROW_BLOCK + T.min(b - blk * ROW_BLOCK, ROW_BLOCK)
                         - T.min(b - blk * ROW_BLOCK, ROW_BLOCK) % TILES[2], TILES[3],
                         x, w, bias, res, out, jt * C, L, C, BIAS, RESIDUAL)

    return without_unused_adds(f32_matmul, 2, BIAS, RESIDUAL)


# rows in lanes: 16 rows per vector natively; with AVX-512 16 columns at a time (their sums:
# 16 of its 32 registers), with AVX2 4 columns (a 16-lane sum takes two of its 16 registers: 16
# columns spilled, 256 rows ran 2.8x slower on a Zen 3 VM); in wasm 4 rows per vector, 8 columns
ROWS_IN_LANES = {"avx512": {"lanes": 16, "cols": 16}, "avx2": {"lanes": 16, "cols": 4},
                 "wasm": {"lanes": 4, "cols": 8}}


@functools.lru_cache(maxsize=None)
def f32_matmul_rows_in_lanes(N: int, K: int, adds: tuple[str, ...] = (),
                             isa: str = "avx512") -> tirx.PrimFunc:
    """The same function for batches of many rows (an encoder's forward, no decode steps): a
    vector holds one column's sums for ``lanes`` rows, so nothing is summed across lanes at
    the end. The input rows are transposed once per call into tiles of ``lanes`` rows (k-major,
    zeros past the last row); then per ``k`` one vector load and one multiply-add per column,
    each with its weight broadcast from memory. A row's sum runs over ``k`` in order wherever
    it sits (batch invariance). At one row it wastes the other lanes: 2x slower than
    ``f32_matmul_prim_func`` on a decode step, 2x faster on 256 rows (an AVX-512 VM)."""
    if adds not in ADDS:
        raise ValueError(f"no kernel for the adds {adds}")
    shape = ROWS_IN_LANES[isa]
    L = shape["lanes"]
    C = next(c for c in (shape["cols"], 8, 4, 2, 1) if c <= shape["cols"] and N % c == 0)
    RT = ROW_BLOCK // L  # row tiles per row block
    BIAS, RESIDUAL = "bias" in adds, "residual" in adds

    @T.macro(hygienic=False)
    def tile(t, xt, w, bias, res, out, j0, b, L, C, BIAS, RESIDUAL):
        acc = T.alloc_buffer((C, L), "float32")
        for c in T.unroll(C):
            for lane in T.vectorized(L):
                acc[c, lane] = T.float32(0)
        for k in range(K):
            for c in T.unroll(C):
                for lane in T.vectorized(L):
                    acc[c, lane] = acc[c, lane] + xt[t, k, lane] * w[j0 + c, k]
        for lane in range(L):
            if t * L + lane < b:
                for c in range(C):
                    store(out, t * L + lane, j0 + c, acc[c, lane], bias, res, BIAS, RESIDUAL)

    @T.prim_func(s_tir=True)
    def f32_matmul_rows(var_x: T.handle, var_w: T.handle, var_bias: T.handle,
                        var_r: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int64()
        x = T.match_buffer(var_x, (b, K), "float32")
        w = T.match_buffer(var_w, (N, K), "float32")
        bias = T.match_buffer(var_bias, (N,), "float32")
        res = T.match_buffer(var_r, (b, N), "float32")
        out = T.match_buffer(var_out, (b, N), "float32")
        xt = T.alloc_buffer(((b + L - 1) // L, K, L), "float32")
        for t in T.parallel((b + L - 1) // L):
            for k in range(K):
                for lane in T.vectorized(L):
                    xt[t, k, lane] = T.if_then_else(t * L + lane < b,
                                                    x[T.min(t * L + lane, b - 1), k],
                                                    T.float32(0))
        for blk in range((b + ROW_BLOCK - 1) // ROW_BLOCK):
            for jt in T.parallel(N // C):
                for tt in range(T.min((b - blk * ROW_BLOCK + L - 1) // L, RT)):
                    tile(blk * RT + tt, xt, w, bias, res, out, jt * C, b, L, C, BIAS,
                         RESIDUAL)

    return without_unused_adds(f32_matmul_rows, 2, BIAS, RESIDUAL)
