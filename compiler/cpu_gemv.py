"""A hand-written CPU kernel for the q4 and q8 (``*_1`` packing) float32 matmuls: ``out = x @
dequantize(W)^T`` (+ a bias and/or a residual), replacing the scheduled TE version where the
pattern matches.

Why by hand: the scheduled version (cpu_schedules.py rule 2) unpacks 16 nibbles from two
words with a permute and a per-lane shift, and multiplies the dequantized weight in, about 7
vector instructions per 16 weights, for every row of a step. Here a group of 32 weights is one
load (16 bytes in q4, 32 in q8), dequantized once for a tile of rows:

* q4: byte ``t`` of the group holds weights ``2t`` (low nibble) and ``2t + 1`` (high nibble),
  so ``bytes & 15`` and ``bytes >> 4`` are the group's even and odd weights, 16 lanes each;
  q8: the group's two halves of 16 bytes;
* the input rows are split once per call to match (even and odd elements; q8: halves);
* a tile of rows (``ISA_TILES``, per vector ISA) multiplies the dequantized group into each
  row's partial sums: a step of 8 rows reads and dequantizes each weight once, not 8 times;
* a step of several of the widest tiles (``CHUNK_TILES``: a prompt, a long verify step, wasm's
  batch-8 decode) dequantizes each
  task's chunk of outputs once into floats that all its tiles read (``CHUNK_BYTES``), instead
  of once per tile: the same expressions, so the same bits.

Turning bytes into floats: x86 converts 16 bytes in two instructions, but LLVM's WebAssembly
backend lowers ``uitofp <16 x i8>`` (or 8) lane by lane (0.9 GB/s of weights measured); four
lanes at a time it widens and converts in vector instructions (2.2 GB/s). So for WebAssembly
the 16 lanes go as four unrolled chunks of 4 (``isa="wasm"``).

The sums run in another order than the GPU's (16 lanes per group, then groups), as any
reordering of float sums does; the results agree to float32 rounding (tests compare the
logits with the WGSL kernels and transformers).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from tvm import tirx
from tvm.script import tirx as T

GROUP = 32  # weights per scale/minimum (compiler/quantization.py GROUP_SIZE)
HALF = GROUP // 2
# Rows per tile, widest first, per vector ISA (cpu_schedules.vector_isa): a tile dequantizes
# each group's weights once for all its rows, a step's rows go in as many of the widest tiles
# as fit, the rest in narrower ones (no row tests inside a tile). With AVX-512, 8 rows x 2
# partial sums of 16 lanes are 16 of its 32 registers. AVX2's 16 registers of 8 lanes take
# 4 rows of one 16-lane sum (8 registers; AVX-512's tile spilled: a 3072x576 matmul on one Zen 3
# core, 8 rows 0.89-0.91 ms -> 0.59-0.66, 4 rows 0.39-0.44 -> 0.29-0.30, 1 row 0.19-0.20 ->
# 0.18-0.19, bench/results/README.md). ARM's NEON (32 registers of 4 lanes) takes AVX2's tiles
# too (cpu_schedules.vector_isa; not measured). WebAssembly's 128-bit registers hold a quarter
# of a row's lanes (V8 maps them on 16 of the CPU's), so there tiles stop at 4 rows with one
# partial sum.
ISA_TILES = {"avx512": (8, 4, 2, 1), "avx2": (4, 2, 1), "wasm": (4, 2, 1)}
# the adds after the matmul a kernel exists for (a biased projection, a projection into the
# residual stream, or both)
KERNEL_ADDS = ((), ("bias",), ("residual",), ("bias", "residual"))
COLS = 16  # outputs per task (a chunk's q4 weights, K = 576: 4.5 KB + scales)
# A step of many rows dequantizes each chunk's weights once, into COLS x K floats that its
# tiles then read, where those fit this many bytes (in L2 beside the tiles' inputs). On a
# Zen 3 VM (AVX2, bench/cpu_gemv.py, 16-128 rows, four runs) against dequantizing per tile:
# K = 576 (36 KiB) 0.98-1.48x, K = 1536 (96 KiB) 0.90-1.22x (about even), K = 4864 (304 KiB)
# 0.75-0.97x (bench/results/cpu-gemv-chunks-zen3.txt).
CHUNK_BYTES = 96 * 1024
# ... from this many of the widest tiles a step. WebAssembly's dequantization costs more (4
# lanes converted at a time, no fused multiply-add): batch-8 decode's matmuls (two tiles) took
# 0.87-0.89x the time chunked, in Chromium on a Zen 3 VM (bench/cpu.py --browser's kernel
# tables, one run each way; kernels that did not change drifted up to 9% between them). On
# AVX2, two tiles measured no faster in runs by hand (not committed); three and more did. (Both
# measured on the plain SIMD kernels, before the relaxed-SIMD ones, which fuse each multiply-add.)
CHUNK_TILES = {"avx512": 3, "avx2": 3, "wasm": 2}


def match_q4_matmul(func: tirx.PrimFunc) -> dict | None:
    """``{"N", "K", "adds", "bits"}`` when ``func`` is a float32 q4/q8 dequantize-matmul as
    compiler/models/layers.py builds it, optionally followed by adds of a bias (N,) and/or a
    residual (b, N), else None. ``adds``: their kinds in the order the function adds them,
    each reading the next extra parameter."""
    names = _block_names(func)
    adds = names[2:]
    if names[:2] != ["dequantize", "matmul"] or adds not in ([], ["T_add"], ["T_add", "T_add1"]):
        return None
    params = [p.ty for p in func.params]
    if len(params) != 5 + len(adds):
        return None
    x, w, s, m, *rest = params
    out = rest[-1]
    try:
        N, words = (int(d) for d in w.shape)
        K = int(x.shape[1])
    except (TypeError, ValueError):
        return None
    bits = 4 if words * 8 == K else 8 if words * 4 == K else 0
    ok = (str(w.dtype) == "uint32" and bits and K % GROUP == 0
          and all(str(t.dtype) == "float32" for t in (x, s, m, out))
          and [int(d) for d in s.shape] == [N, K // GROUP] == [int(d) for d in m.shape]
          and len(x.shape) == 2 and len(out.shape) == 2 and int(out.shape[1]) == N)
    kinds = []
    for r in rest[:-1]:  # (parameters in the order the adds read them: adds_in_order)
        if str(r.dtype) != "float32":
            return None
        if len(r.shape) == 1 and int(r.shape[0]) == N:
            kinds.append("bias")
        elif len(r.shape) == 2 and int(r.shape[1]) == N:
            kinds.append("residual")
        else:
            return None
    if not ok or tuple(kinds) not in KERNEL_ADDS or not adds_in_order(func, 4, len(adds)):
        return None
    return {"N": N, "K": K, "adds": tuple(kinds), "bits": bits}


def adds_in_order(func: tirx.PrimFunc, first: int, count: int) -> bool:
    """Whether the function's last ``count`` blocks (its adds) read parameters ``first``,
    ``first + 1``, ... in that order (the kernels apply them so)."""
    import tvm
    from tvm import s_tir

    if count == 0:
        return True
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))[-count:]
    for block, param in zip(blocks, func.params[first:first + count]):
        if not any(r.source.same_as(param) for r in sch.get(block).reads):
            return False
    return True


def _block_names(func: tirx.PrimFunc) -> list[str]:
    import tvm
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(tvm.IRModule({"main": func}))
        return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except Exception:  # (no root block: not a TE function)
        return []


def _kernel_macros() -> SimpleNamespace:
    """The kernels' shared pieces (macros; the functions using them pass each other through
    one argument, ``k``). A macro sees the names the function that uses it sees: K, N, G,
    ``bits``, module globals and the arguments; tile sizes and flags are passed in."""

    @T.macro(hygienic=False)
    def dequantize_group(dst, base, wb, s, m, j, g, lanes, q8):
        # output j's group g as floats: dst[base : base + HALF] its even weights (q8: its
        # first half), dst[base + HALF : base + GROUP] its odd ones (q8: its second half)
        for c in T.unroll(HALF // lanes):
            # (no let-bound index here: TVM's vectorizer keeps a let scalar)
            for u in T.vectorized(lanes):
                # (byte offsets: an output's weights take K * bits / 8 bytes, a group's
                # GROUP * bits / 8)
                if q8:  # (a Python constant: one branch is built)
                    dst[base + c * lanes + u] = T.Cast(
                        "float32", wb[j * (K * bits // 8) + g * (GROUP * bits // 8)
                                      + c * lanes + u]) * s[j, g] + m[j, g]
                    dst[base + HALF + c * lanes + u] = T.Cast(
                        "float32", wb[j * (K * bits // 8) + g * (GROUP * bits // 8)
                                      + HALF + c * lanes + u]) * s[j, g] + m[j, g]
                else:
                    dst[base + c * lanes + u] = T.Cast(
                        "float32", wb[j * (K * bits // 8) + g * (GROUP * bits // 8)
                                      + c * lanes + u] & T.uint8(15)) * s[j, g] + m[j, g]
                    dst[base + HALF + c * lanes + u] = T.Cast(
                        "float32", wb[j * (K * bits // 8) + g * (GROUP * bits // 8)
                                      + c * lanes + u] >> T.uint8(4)) * s[j, g] + m[j, g]

    @T.macro(hygienic=False)
    def accumulate(row0, rows, acc, acc2, xs, src, base, g, split, lanes):
        # the tile's rows times one group's dequantized weights (src[base : base + GROUP]):
        # the same expressions whichever buffer holds the weights, so the same bits. (In
        # vectors of ``lanes``, the machine's width: LLVM fuses a multiply and its add into
        # wasm's relaxed_madd only in vectors of the width it has, not in wider ones it splits)
        for r in T.unroll(rows):
            for c in T.unroll(HALF // lanes):
                for u in T.vectorized(lanes):
                    if split:
                        acc[r, c * lanes + u] = (acc[r, c * lanes + u] + src[base + c * lanes + u]
                                                 * xs[row0 + r, g, 0, c * lanes + u])
                        acc2[r, c * lanes + u] = (
                            acc2[r, c * lanes + u]
                            + src[base + HALF + c * lanes + u] * xs[row0 + r, g, 1, c * lanes + u])
                    else:
                        acc[r, c * lanes + u] = (
                            acc[r, c * lanes + u]
                            + src[base + c * lanes + u] * xs[row0 + r, g, 0, c * lanes + u]
                            + src[base + HALF + c * lanes + u] * xs[row0 + r, g, 1, c * lanes + u])

    @T.macro(hygienic=False)
    def tile(row0, rows, xs, wb, s, m, out, j, lanes, split, q8, wd, jj, chunk, k, x0, wj):
        # (inside the parallel loop: private) ``rows`` rows share each group's weights:
        # dequantized here once per group, or (``chunk``) read from the chunk's weights that
        # the task dequantized once for all its tiles (``wd``, output ``jj`` of the chunk).
        # Output rows ``row0..`` of column ``j``, from input rows ``x0..`` (of ``xs``) and
        # weight row ``wj`` (the dense kernel: x0 = row0, wj = j; the experts': the token's
        # input and its expert's row)
        acc = T.alloc_buffer((rows, HALF), "float32")
        acc2 = T.alloc_buffer((rows, HALF), "float32")
        if not chunk:  # (a Python constant: a chunk's tiles read ``wd``)
            wg = T.alloc_buffer((GROUP,), "float32")
        for r in T.unroll(rows):
            for t in T.vectorized(HALF):
                acc[r, t] = T.float32(0)
                acc2[r, t] = T.float32(0)
        for g in range(G):
            if chunk:  # (a Python constant)
                k.accumulate(x0, rows, acc, acc2, xs, wd, (jj * G + g) * GROUP, g, split,
                             lanes)
            else:
                k.dequantize_group(wg, 0, wb, s, m, wj, g, lanes, q8)
                k.accumulate(x0, rows, acc, acc2, xs, wg, 0, g, split, lanes)
        # each row's lanes pairwise (vector adds): the same sums in the same order whatever
        # the tile, so a row's result never depends on the rows beside it (batch invariance)
        for r in T.unroll(rows):
            if split:
                for t in T.vectorized(HALF):
                    acc[r, t] = acc[r, t] + acc2[r, t]
            for h in T.vectorized(8):
                acc[r, h] = acc[r, h] + acc[r, h + 8]
            for h in T.vectorized(4):
                acc[r, h] = acc[r, h] + acc[r, h + 4]
            for h in T.vectorized(2):
                acc[r, h] = acc[r, h] + acc[r, h + 2]
            out[row0 + r, j] = acc[r, 0] + acc[r, 1]

    @T.macro(hygienic=False)
    def row_tiles(b, jc, xs, wb, s, m, out, tiles, lanes, split, q8, wd, chunk, k):
        # as many of the widest tiles as fit, then at most one of each narrower size
        for i0 in range(b // tiles[0]):
            for jj in range(COLS):
                if N % COLS == 0 or jc * COLS + jj < N:
                    k.tile(i0 * tiles[0], tiles[0], xs, wb, s, m, out, jc * COLS + jj,
                           lanes, split, q8, wd, jj, chunk, k, i0 * tiles[0], jc * COLS + jj)
        for jj in range(COLS):
            if N % COLS == 0 or jc * COLS + jj < N:
                # (tiles: four sizes; a repeated 1 at the end never runs: b % 1 is 0)
                if b % tiles[0] >= tiles[1]:
                    k.tile(b - b % tiles[0], tiles[1], xs, wb, s, m, out, jc * COLS + jj,
                           lanes, split, q8, wd, jj, chunk, k, b - b % tiles[0], jc * COLS + jj)
                if b % tiles[1] >= tiles[2]:
                    k.tile(b - b % tiles[1], tiles[2], xs, wb, s, m, out, jc * COLS + jj,
                           lanes, split, q8, wd, jj, chunk, k, b - b % tiles[1], jc * COLS + jj)
                if b % tiles[2] >= tiles[3]:
                    k.tile(b - b % tiles[2], tiles[3], xs, wb, s, m, out, jc * COLS + jj,
                           lanes, split, q8, wd, jj, chunk, k, b - b % tiles[2], jc * COLS + jj)

    @T.macro(hygienic=False)
    def split_rows(rows, xf, xs, q8):
        # ``rows`` input rows (``xf``: their floats one after another) split into each
        # group's even and odd elements (q8: its halves), as the tiles read them
        for i in range(rows):
            for g in range(G):
                for t in range(HALF):
                    if q8:
                        xs[i, g, 0, t] = xf[i * K + g * GROUP + t]
                        xs[i, g, 1, t] = xf[i * K + g * GROUP + HALF + t]
                    else:
                        xs[i, g, 0, t] = xf[i * K + g * GROUP + 2 * t]
                        xs[i, g, 1, t] = xf[i * K + g * GROUP + 2 * t + 1]

    return SimpleNamespace(dequantize_group=dequantize_group, accumulate=accumulate, tile=tile,
                           row_tiles=row_tiles, split_rows=split_rows)


@functools.lru_cache(maxsize=None)  # (a model's plans repeat shapes; parsing takes ~0.3 s)
def q4_matmul_prim_func(N: int, K: int, adds: tuple[str, ...] = (), isa: str = "avx512",
                        bits: int = 4, dequantized_chunks: bool | None = None) -> tirx.PrimFunc:
    """The kernel, with the matched function's parameters: x (b, K), w (N, K * bits / 32)
    uint32, scale (N, K/32), minimum (N, K/32), one parameter per add (``adds``: "bias" (N,)
    or "residual" (b, N), added in that order), out (b, N). ``isa``: the vector registers the
    tiles are sized for (cpu_schedules.vector_isa: "avx512", "avx2", or "wasm": weights
    converted 4 lanes at a time, narrower tiles, one partial sum). ``bits`` 8: the
    q8 packing, a group's 32 bytes its 32 weights in order (its two halves take the places of
    the q4 group's even and odd weights). ``dequantized_chunks``: whether a step of
    ``CHUNK_TILES[isa]`` of the widest tiles or more dequantizes each task's chunk of weights
    once for all its tiles (default: where the chunk's floats fit ``CHUNK_BYTES``; False:
    never, True: always)."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, not {bits}")
    G = K // GROUP
    q8 = bits == 8
    wasm = isa == "wasm"
    lanes = 4 if wasm else HALF
    tiles = ISA_TILES[isa]
    tiles = tiles + (1,) * (4 - len(tiles))
    # with AVX-512 a row keeps two partial sums (even weights, odd weights): two chains of
    # multiply-adds instead of one, so a lone decode row is not bound by their latency (one
    # tile's rows all do, or a row's sum would change order with its tile)
    split = isa == "avx512"
    if dequantized_chunks is None:
        dequantized_chunks = COLS * K * 4 <= CHUNK_BYTES

    @T.macro(hygienic=False)
    def body(b, x, w, s, m, out, tiles, lanes, split, q8, chunks, chunk_tiles, k):
        wb = T.decl_buffer((N * K * bits // 8,), "uint8", data=w.data)  # the bytes one by one
        xs = T.alloc_buffer((b, G, 2, HALF), "float32")
        k.split_rows(b, T.decl_buffer((b * K,), "float32", data=x.data), xs, q8)
        # Outputs in chunks of COLS, a task each; in a chunk, each tile of rows goes over the
        # chunk's outputs before the next tile: the tile's inputs (8 rows x K floats) stay in
        # L1 while the chunk's weights (COLS x K/2 bytes) come from L2. (Output by output,
        # a prompt's rows, all K floats each, streamed through the cache again for every
        # output: prefill ran at a third of the matmul's speed, bound by L2 reads.) Each
        # (row, output) sum is the same whatever the order: the bits do not change.
        if chunks and b >= chunk_tiles * tiles[0]:  # (``chunks``: a Python constant)
            for jc in T.parallel((N + COLS - 1) // COLS):
                # enough tiles: the chunk's weights dequantized once (COLS x K floats, in L2)
                # rather than once per tile. (A loop of its own: TVM allocates a parallel
                # body's scratch at the top of the body, so a test inside it would have had
                # every step, a one-row decode too, allocate the chunk's buffer for nothing.)
                wd = T.alloc_buffer((COLS * K,), "float32")
                for jj in range(COLS):
                    if N % COLS == 0 or jc * COLS + jj < N:
                        for g in range(G):
                            k.dequantize_group(wd, (jj * G + g) * GROUP, wb, s, m,
                                               jc * COLS + jj, g, lanes, q8)
                k.row_tiles(b, jc, xs, wb, s, m, out, tiles, lanes, split, q8, wd, True, k)
        else:
            for jc in T.parallel((N + COLS - 1) // COLS):
                k.row_tiles(b, jc, xs, wb, s, m, out, tiles, lanes, split, q8, xs, False, k)

    TILES, LANES, SPLIT, Q8, CHUNKS = tiles, lanes, split, q8, dequantized_chunks
    CHUNK_TILES_ = CHUNK_TILES[isa]
    # (macros that call macros get them through one argument: a macro sees only the names
    # the function that uses it sees)
    MACROS = _kernel_macros()  # (seen below)

    # The adds after the matmul: each one float32 addition (x + y == y + x exactly), in the
    # TE function's order, so the bits are its bits. One source for the four signatures: the
    # add parameters the body does not read are dropped after parsing (only the function
    # returned is parsed).
    if adds not in KERNEL_ADDS:
        raise ValueError(f"no kernel for the adds {adds}")
    BIAS, RESIDUAL = "bias" in adds, "residual" in adds

    @T.prim_func(s_tir=True)
    def q4_matmul(var_x: T.handle, var_w: T.handle, var_s: T.handle, var_m: T.handle,
                  var_bias: T.handle, var_r: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int64()
        x = T.match_buffer(var_x, (b, K), "float32")
        w = T.match_buffer(var_w, (N, K * bits // 32), "uint32")
        s = T.match_buffer(var_s, (N, G), "float32")
        m = T.match_buffer(var_m, (N, G), "float32")
        bias = T.match_buffer(var_bias, (N,), "float32")
        r = T.match_buffer(var_r, (b, N), "float32")
        out = T.match_buffer(var_out, (b, N), "float32")
        body(b, x, w, s, m, out, TILES, LANES, SPLIT, Q8, CHUNKS, CHUNK_TILES_, MACROS)
        if BIAS and RESIDUAL:  # (Python constants: one branch is built)
            for i, j in T.grid(b, N):
                out[i, j] = (out[i, j] + bias[j]) + r[i, j]
        elif BIAS:
            for i, j in T.grid(b, N):
                out[i, j] = out[i, j] + bias[j]
        elif RESIDUAL:
            for i, j in T.grid(b, N):
                out[i, j] = r[i, j] + out[i, j]

    return without_unused_adds(q4_matmul, 4, BIAS, RESIDUAL)


def match_expert_matmul(func: tirx.PrimFunc) -> dict | None:
    """``{"E", "N", "K", "S", "per_slot", "bits"}`` when ``func`` is a float32 q4/q8 expert
    matmul as compiler/models/layers.py's ``ExpertLinears`` builds it (x (n, K) or (n, S, K),
    experts (n, S) int32, stacked packed weights (E, N, ..), out (n, S, N)), else None."""
    if _block_names(func) != ["dequantize", "matmul"] or len(func.params) != 6:
        return None
    x, experts, w, s, m, out = (p.ty for p in func.params)
    try:
        E, N, words = (int(d) for d in w.shape)
        S, K = int(experts.shape[1]), int(x.shape[-1])
    except (TypeError, ValueError):
        return None
    bits = 4 if words * 8 == K else 8 if words * 4 == K else 0
    per_slot = len(x.shape) == 3
    ok = (bits and K % GROUP == 0 and str(w.dtype) == "uint32"
          and str(experts.dtype) == "int32" and len(experts.shape) == 2
          and all(str(t.dtype) == "float32" for t in (x, s, m, out))
          and [int(d) for d in s.shape] == [E, N, K // GROUP] == [int(d) for d in m.shape]
          and (not per_slot or int(x.shape[1]) == S) and len(out.shape) == 3
          and [int(d) for d in out.shape[1:]] == [S, N])
    return {"E": E, "N": N, "K": K, "S": S, "per_slot": per_slot, "bits": bits} if ok else None


@functools.lru_cache(maxsize=None)
def expert_matmul_prim_func(E: int, N: int, K: int, S: int, per_slot: bool,
                            isa: str = "avx512", bits: int = 4) -> tirx.PrimFunc:
    """The expert matmul of ``match_expert_matmul``'s parameters as a kernel of the dense one's
    pieces: for each token and slot, the GEMV of its expert's packed rows (weight row
    ``expert * N + j`` of the stack), a group of 32 weights dequantized at a time into
    floats, as the dense kernel's one-row tiles do. Outputs in chunks of COLS run in parallel;
    each (token, slot, output) sum runs in one order whatever else the step holds."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, not {bits}")
    G = K // GROUP
    LANES = 4 if isa == "wasm" else HALF
    SPLIT, Q8 = isa == "avx512", bits == 8
    X_ROWS = S if per_slot else 1  # input rows a token has (its slots' own, or one for all)
    SLOT_ROW = 1 if per_slot else 0
    MACROS = _kernel_macros()
    n = tirx.Var("n", "int64")
    X_SHAPE = (n, S, K) if per_slot else (n, K)

    @T.prim_func(s_tir=True)
    def expert_matmul(var_x: T.handle, var_e: T.handle, var_w: T.handle, var_s: T.handle,
                      var_m: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        experts = T.match_buffer(var_e, (n, S), "int32")
        x = T.match_buffer(var_x, X_SHAPE, "float32")
        w = T.match_buffer(var_w, (E, N, K * bits // 32), "uint32")
        s = T.match_buffer(var_s, (E, N, G), "float32")
        m = T.match_buffer(var_m, (E, N, G), "float32")
        out = T.match_buffer(var_out, (n, S, N), "float32")
        # the stacks as one matrix of E * N rows, the output as (n * S) rows
        wb = T.decl_buffer((E * N * K * bits // 8,), "uint8", data=w.data)
        s2 = T.decl_buffer((E * N, G), "float32", data=s.data)
        m2 = T.decl_buffer((E * N, G), "float32", data=m.data)
        out2 = T.decl_buffer((n * S, N), "float32", data=out.data)
        xs = T.alloc_buffer((n * X_ROWS, G, 2, HALF), "float32")
        MACROS.split_rows(n * X_ROWS, T.decl_buffer((n * X_ROWS * K,), "float32", data=x.data),
                          xs, Q8)
        for jc in T.parallel((N + COLS - 1) // COLS):
            for i in range(n):
                for sl in range(S):
                    for jj in range(COLS):
                        if N % COLS == 0 or jc * COLS + jj < N:
                            # (the expert clamped into the stack, as the TE function reads it)
                            MACROS.tile(i * S + sl, 1, xs, wb, s2, m2, out2, jc * COLS + jj,
                                        LANES, SPLIT, Q8, xs, jj, False, MACROS,
                                        i * X_ROWS + sl * SLOT_ROW,
                                        T.Cast("int64", T.min(experts[i, sl], E - 1)) * N
                                        + jc * COLS + jj)

    return expert_matmul


def without_unused_adds(func: tirx.PrimFunc, first: int, bias: bool,
                        residual: bool) -> tirx.PrimFunc:
    """``func`` (parameters: ``first`` inputs, a bias, a residual, the output) without the
    add parameters its body does not read: one kernel source for the four signatures."""
    params = list(func.params)
    *inputs, p_bias, p_res, p_out = params[:first + 3]
    kept = inputs + ([p_bias] if bias else []) + ([p_res] if residual else []) + [p_out]
    return tirx.PrimFunc(kept, func.body, func.ret_type, func.attrs)
