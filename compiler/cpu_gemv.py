"""A hand-written CPU kernel for the q4 (``*_1`` packing) matmul: ``out = x @ dequantize(W)^T``
(+ a residual), replacing the scheduled TE version where the pattern matches.

Why by hand: the scheduled version (cpu_schedules.py rule 2) unpacks 16 nibbles from two
words with a permute and a per-lane shift, and multiplies the dequantized weight in, about 7
vector instructions per 16 weights. Here a group of 32 weights is one 16-byte load:

* byte ``t`` of the group holds weights ``2t`` (low nibble) and ``2t + 1`` (high nibble), so
  ``bytes & 15`` and ``bytes >> 4`` are the group's even and odd weights, each 16 lanes;
* the input row is split once per call into its even and odd elements, to match;
* a group's sum factors as ``scale * sum(q * x) + minimum * sum(x)``: the inner loop is two
  multiply-adds of integer-valued weights, and ``sum(x)`` per group is computed once per call.

Turning nibbles into floats: x86 converts 16 bytes in two instructions, but LLVM's
WebAssembly backend lowers ``uitofp <16 x i8>`` (or 8) lane by lane (0.9 GB/s of weights
measured); four lanes at a time it widens and converts in vector instructions (2.2 GB/s). So
for WebAssembly the 16 lanes go as four unrolled chunks of 4 (``wasm=True``).

The sums run in another order than the GPU's (16 lanes per group, then groups), as any
reordering of float sums does; the results agree to float32 rounding (tests compare the
logits with the WGSL kernels and transformers).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

GROUP = 32  # weights per scale/minimum (compiler/quantization.py GROUP_SIZE)
HALF = GROUP // 2
ROWS = 4  # input rows per tile: each group's weights are dequantized once per tile


def match_q4_matmul(func: tirx.PrimFunc) -> dict | None:
    """``{"N", "K", "residual"}`` when ``func`` is a float32 q4 dequantize-matmul (optionally
    plus a residual add) as compiler/models/layers.py builds it, else None."""
    names = _block_names(func)
    if names not in (["dequantize", "matmul"], ["dequantize", "matmul", "T_add"]):
        return None
    params = [p.ty for p in func.params]
    residual = names[-1] == "T_add"
    if len(params) != (6 if residual else 5):
        return None
    x, w, s, m, *rest = params
    out = rest[-1]
    try:
        N, words = (int(d) for d in w.shape)
        K = int(x.shape[1])
    except (TypeError, ValueError):
        return None
    ok = (str(w.dtype) == "uint32" and words * 8 == K and K % GROUP == 0
          and all(str(t.dtype) == "float32" for t in (x, s, m, out))
          and [int(d) for d in s.shape] == [N, K // GROUP] == [int(d) for d in m.shape]
          and len(x.shape) == 2 and len(out.shape) == 2 and int(out.shape[1]) == N)
    if residual:
        r = rest[0]
        ok = ok and str(r.dtype) == "float32" and len(r.shape) == 2 and int(r.shape[1]) == N
    return {"N": N, "K": K, "residual": residual} if ok else None


def _block_names(func: tirx.PrimFunc) -> list[str]:
    import tvm
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(tvm.IRModule({"main": func}))
        return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except Exception:  # (no root block: not a TE function)
        return []


def q4_matmul_prim_func(N: int, K: int, residual: bool, wasm: bool = False) -> tirx.PrimFunc:
    """The kernel, with the matched function's parameters: x (b, K), w (N, K/8) uint32,
    scale (N, K/32), minimum (N, K/32), [residual (b, N)], out (b, N). ``wasm``: for
    WebAssembly (nibbles converted 4 lanes at a time)."""
    G = K // GROUP
    lanes = 4 if wasm else HALF

    # (the macro sees the names the functions that use it see: K, N, G and module globals)
    @T.macro(hygienic=False)
    def body(b, x, w, s, m, out, lanes, rows):
        wb = T.decl_buffer((N * K // 2,), "uint8", data=w.data)  # the same bytes, one by one
        # the input rows split into each group's even and odd elements
        xs = T.alloc_buffer((b, G, 2, HALF), "float32")
        for i in range(b):
            for g in range(G):
                for t in range(HALF):
                    xs[i, g, 0, t] = x[i, g * GROUP + 2 * t]
                    xs[i, g, 1, t] = x[i, g * GROUP + 2 * t + 1]
        for j in T.parallel(N):
            for i0 in range((b + rows - 1) // rows):
                # (inside the parallel loop: private) a tile of rows shares each group's
                # weights, dequantized once
                acc = T.alloc_buffer((rows, HALF), "float32")
                lo = T.alloc_buffer((HALF,), "float32")
                hi = T.alloc_buffer((HALF,), "float32")
                for r in T.unroll(rows):
                    for t in T.vectorized(HALF):
                        acc[r, t] = T.float32(0)
                for g in range(G):
                    for c in T.unroll(HALF // lanes):
                        # (no let-bound index here: TVM's vectorizer keeps a let scalar)
                        for u in T.vectorized(lanes):
                            lo[c * lanes + u] = T.Cast(
                                "float32", wb[j * (K // 2) + g * HALF + c * lanes + u]
                                & T.uint8(15)) * s[j, g] + m[j, g]
                            hi[c * lanes + u] = T.Cast(
                                "float32", wb[j * (K // 2) + g * HALF + c * lanes + u]
                                >> T.uint8(4)) * s[j, g] + m[j, g]
                    for r in T.unroll(rows):
                        if i0 * rows + r < b:
                            for t in T.vectorized(HALF):
                                acc[r, t] = (acc[r, t] + lo[t] * xs[i0 * rows + r, g, 0, t]
                                             + hi[t] * xs[i0 * rows + r, g, 1, t])
                # each row's 16 lanes pairwise (vector adds): the same sums in the same order
                # whatever the tile, so a row's result never depends on the rows beside it
                # (batch invariance)
                for r in T.unroll(rows):
                    if i0 * rows + r < b:
                        for h in T.vectorized(8):
                            acc[r, h] = acc[r, h] + acc[r, h + 8]
                        for h in T.vectorized(4):
                            acc[r, h] = acc[r, h] + acc[r, h + 4]
                        for h in T.vectorized(2):
                            acc[r, h] = acc[r, h] + acc[r, h + 2]
                        out[i0 * rows + r, j] = acc[r, 0] + acc[r, 1]

    @T.prim_func(s_tir=True)
    def q4_matmul(var_x: T.handle, var_w: T.handle, var_s: T.handle, var_m: T.handle,
                  var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int64()
        x = T.match_buffer(var_x, (b, K), "float32")
        w = T.match_buffer(var_w, (N, K // 8), "uint32")
        s = T.match_buffer(var_s, (N, G), "float32")
        m = T.match_buffer(var_m, (N, G), "float32")
        out = T.match_buffer(var_out, (b, N), "float32")
        if b == 1:  # (the same sums per row: a tile of one, without the tile's tests)
            body(b, x, w, s, m, out, lanes, 1)
        else:
            body(b, x, w, s, m, out, lanes, ROWS)

    @T.prim_func(s_tir=True)
    def q4_matmul_add(var_x: T.handle, var_w: T.handle, var_s: T.handle, var_m: T.handle,
                      var_r: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int64()
        x = T.match_buffer(var_x, (b, K), "float32")
        w = T.match_buffer(var_w, (N, K // 8), "uint32")
        s = T.match_buffer(var_s, (N, G), "float32")
        m = T.match_buffer(var_m, (N, G), "float32")
        r = T.match_buffer(var_r, (b, N), "float32")
        out = T.match_buffer(var_out, (b, N), "float32")
        if b == 1:  # (the same sums per row: a tile of one, without the tile's tests)
            body(b, x, w, s, m, out, lanes, 1)
        else:
            body(b, x, w, s, m, out, lanes, ROWS)
        for i, j in T.grid(b, N):  # the residual (x + y == y + x exactly in float32)
            out[i, j] = r[i, j] + out[i, j]

    return q4_matmul_add if residual else q4_matmul
