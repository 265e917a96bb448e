"""Causal paged attention for decode steps on CUDA: one block per (query row, head), K and V
staged through shared memory a tile at a time.

TVM's paged prefill kernel (paged_attention.py) runs a fixed 16 blocks per KV head whatever
the step, so a decode step's one query row per sequence keeps a few of a large GPU's
multiprocessors busy (69 us per layer on an H100, 32 % of an 8B model's batch-1 step).
window_attention.py's row-per-workgroup kernel spreads the rows but reads each key's head
vector with one thread, 128 dependent loads in a row (58 us). Here each block's threads first
copy a tile of keys into shared memory together (consecutive threads, consecutive addresses, no
load waiting on another), score them from there (one key per thread), then copy the tile's
values the same way and accumulate them (one output dimension per thread): online softmax in
f32, every thread keeping the running max and sum itself.

It takes the parameters of TVM's kernel, so the decode plans' CUDA set can call it in its
place (``PagedAttention.gpu_twins(decode=True)``)::

    paged_decode(q: (n, HQ, D), qo_indptr: (b+1,), pages: (P, 2, HKV, 16, D),
                 page_indptr: (b+1,), page_values: (p,), last_page_len: (b,),
                 k_rope_pos_offset: (b,), q_positions: (n,)) -> out: (n, HQ, D), lse: (n, HQ)

A query at position ``pos`` sees keys ``0 .. pos`` (causal, no window); key ``c`` is slot
``c % 16`` of listed page ``(c - first) // 16``, ``first`` = ``k_rope_pos_offset``; ``lse`` is
log2 of the softmax denominator, as TVM's kernel writes it.
"""

from __future__ import annotations

import math

from tvm.script import tirx as T
from tvm.tirx import PrimFunc

from .paged_attention import PAGE_SIZE

NEG_BIG = -3.0e38
SHARED_BUDGET = 40 * 1024  # bytes of the K/V tile (CUDA's static shared memory is 48 KB)


def paged_decode_prim_func(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                           scale: float) -> PrimFunc:
    HQ, HKV, D = int(num_q_heads), int(num_kv_heads), int(head_dim)
    GROUP = HQ // HKV
    PS = PAGE_SIZE
    size = 2 if dtype == "float16" else 4
    PAD = 4 // size  # one 32-bit word per row: scoring threads read rows in different banks
    NT = 64 if 64 * (D + PAD) * size <= SHARED_BUDGET else 32  # threads = keys per tile
    DPT = (D + NT - 1) // NT  # output dimensions per thread
    LOADS = (NT * D + NT - 1) // NT  # elements each thread copies per tile
    SCALE = float(scale)
    INV_LN2 = 1.0 / math.log(2.0)

    @T.prim_func(s_tir=True)
    def paged_decode(var_q: T.handle, var_qo_indptr: T.handle, var_pages: T.handle,
                     var_page_indptr: T.handle, var_page_values: T.handle,
                     var_last_page_len: T.handle, var_first_key: T.handle,
                     var_q_positions: T.handle, var_out: T.handle, var_lse: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n = T.int32()
        b = T.int32()
        b1 = T.int32()
        p = T.int32()
        num_pages = T.int32()
        q = T.match_buffer(var_q, (n, HQ, D), dtype)
        qo_indptr = T.match_buffer(var_qo_indptr, (b1,), "int32")
        pages = T.match_buffer(var_pages, (num_pages, 2, HKV, PS, D), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (b1,), "int32")
        page_values = T.match_buffer(var_page_values, (p,), "int32")
        _last_page_len = T.match_buffer(var_last_page_len, (b,), "int32")
        first_key = T.match_buffer(var_first_key, (b,), "int32")
        q_positions = T.match_buffer(var_q_positions, (n,), "int32")
        out = T.match_buffer(var_out, (n, HQ, D), dtype)
        lse = T.match_buffer(var_lse, (n, HQ), "float32")
        q_sh = T.sblock_alloc_buffer((D,), "float32", scope="shared")
        kv_sh = T.sblock_alloc_buffer((NT, D + PAD), dtype, scope="shared")  # keys, then values
        pg_sh = T.sblock_alloc_buffer((NT,), "int32", scope="shared")  # each key's page
        w_sh = T.sblock_alloc_buffer((NT,), "float32", scope="shared")  # scores, then weights
        seq = T.sblock_alloc_buffer((1,), "int32", scope="local")
        # running max, running sum, this tile's max, rescale of what came before, a score
        st = T.sblock_alloc_buffer((5,), "float32", scope="local")
        acc = T.sblock_alloc_buffer((DPT,), "float32", scope="local")
        for row in T.thread_binding(n, thread="blockIdx.x"):
            for head in T.thread_binding(HQ, thread="blockIdx.y"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    seq[0] = 0
                    for s in T.serial(b1 - 1):
                        if qo_indptr[s] <= row:
                            seq[0] = s
                    pos: T.let[T.int32] = q_positions[row]
                    first: T.let[T.int32] = page_indptr[seq[0]] - first_key[seq[0]] // PS
                    kvh: T.let[T.int32] = head // GROUP
                    for dd in T.serial(DPT):
                        if dd * NT + tx < D:
                            q_sh[dd * NT + tx] = T.Cast("float32", q[row, head, dd * NT + tx])
                        acc[dd] = T.float32(0)
                    st[0] = T.float32(NEG_BIG)
                    st[1] = T.float32(0)
                    for tile in T.serial(pos // NT + 1):
                        c: T.let[T.int32] = tile * NT + tx
                        pg_sh[tx] = T.if_then_else(c <= pos, page_values[first + c // PS], 0)
                        T.tvm_storage_sync("shared")
                        for i in T.unroll(LOADS):  # the tile's keys, coalesced
                            key: T.let[T.int32] = (i * NT + tx) // D
                            dim: T.let[T.int32] = (i * NT + tx) % D
                            if tile * NT + key <= pos:
                                kv_sh[key, dim] = pages[pg_sh[key], 0, kvh,
                                                        (tile * NT + key) % PS, dim]
                        T.tvm_storage_sync("shared")
                        st[4] = T.float32(NEG_BIG)
                        if c <= pos:
                            st[4] = T.float32(0)
                            for d in T.serial(D):
                                st[4] = st[4] + q_sh[d] * T.Cast("float32", kv_sh[tx, d])
                            st[4] = st[4] * T.float32(SCALE)
                        w_sh[tx] = st[4]
                        T.tvm_storage_sync("shared")
                        st[2] = st[0]
                        for j in T.serial(NT):
                            st[2] = T.max(st[2], w_sh[j])
                        T.tvm_storage_sync("shared")
                        w_sh[tx] = T.if_then_else(c <= pos, T.exp(st[4] - st[2]), T.float32(0))
                        for i2 in T.unroll(LOADS):  # the tile's values
                            vkey: T.let[T.int32] = (i2 * NT + tx) // D
                            vdim: T.let[T.int32] = (i2 * NT + tx) % D
                            if tile * NT + vkey <= pos:
                                kv_sh[vkey, vdim] = pages[pg_sh[vkey], 1, kvh,
                                                          (tile * NT + vkey) % PS, vdim]
                        T.tvm_storage_sync("shared")
                        st[3] = T.exp(st[0] - st[2])
                        st[1] = st[1] * st[3]
                        for j in T.serial(NT):
                            st[1] = st[1] + w_sh[j]
                        for dd in T.serial(DPT):
                            if dd * NT + tx < D:
                                acc[dd] = acc[dd] * st[3]
                                for j in T.serial(NT):
                                    if tile * NT + j <= pos:
                                        acc[dd] = acc[dd] + w_sh[j] * T.Cast(
                                            "float32", kv_sh[j, dd * NT + tx])
                        st[0] = st[2]
                        T.tvm_storage_sync("shared")
                    for dd in T.serial(DPT):
                        if dd * NT + tx < D:
                            out[row, head, dd * NT + tx] = T.Cast(dtype, acc[dd] / st[1])
                    if tx == 0:
                        lse[row, head] = (st[0] + T.log(st[1])) * T.float32(INV_LN2)

    return paged_decode
