"""Attention with a sliding window and/or logit soft-capping: a hand-written TIR kernel.

TVM's paged prefill kernel (paged_attention.py) masks causally only: its "sliding window" mode
drops the causal bound instead of adding a lower one, and it has no soft-capping. Gemma 2
caps every layer's scores (``cap * tanh(s / cap)``) and Mistral, Phi-3, Gemma 2 and Gemma 3
have windowed layers, where a query at position ``i`` sees keys ``j`` with ``i - W < j <= i``
(transformers' sliding-window mask). GPT-OSS gives each head an attention sink: a learned
logit that joins every query's softmax (its weight goes to no value), so the weights of the
keys sum to less than one. Those layers use this kernel instead:

    window_attention(q: (n, HQ, D), pages: (P, 2, HKV, 16, D), qo_indptr: (b+1,),
                     page_indptr: (b+1,), page_values: (p,), last_page_len: (b,),
                     k_rope_pos_offset: (b,), q_positions: (n,)[, sinks: (HQ,)])
        -> out: (n, HQ, D)

It reads the same page tables as TVM's kernel: key ``c`` (absolute position) of a sequence is
slot ``c % 16`` of its listed page ``(c - first) // 16``, where ``first`` =
``k_rope_pos_offset`` is the position of the first listed key (past the pages the KV cache
freed behind the window); this step's keys are appended before attention runs. One workgroup per
(query row, head) walks the visible keys in tiles of ``NT``: each thread scores one key into
shared memory, every thread takes the tile's max itself (online softmax: the running state is
the same in all threads, so nothing else to synchronize), each thread turns its key's score into
its weight, and every thread sums the weights and accumulates its share of the output
dimensions. Scores and sums are f32 whatever the model's dtype.

It is exact, not fast: no tiling across query rows. Decode steps (one row per sequence) are
where it runs most; long windowed prefills are slower than with TVM's kernel. For the same
reason, with TVM's parameter order (``paged_decode_prim_func``), it is the attention of every
causal layer in the CUDA kernel set's decode plans: TVM's kernel runs a fixed 16 blocks per KV
head, which a one-row step leaves mostly idle (on an H100, 57.9 us per layer against 68.8).
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.tirx import PrimFunc

from ..kernel_memo import built_once
from .kv_layout import PAGE_SIZE

NT = 64  # threads per workgroup = keys per tile
NEG_BIG = -3.0e38


@built_once
def window_attention_prim_func(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                               scale: float, window: int | None,
                               softcap: float | None, paged_signature: bool = False,
                               sinks: bool = False) -> PrimFunc:
    """The kernel; ``paged_signature``: with the parameters of TVM's paged prefill kernel
    instead (paged_decode_prim_func); ``sinks``: with each head's sink logit (a parameter
    before the output, in the model's dtype), as GPT-OSS's softmax has it."""
    if sinks and paged_signature:
        raise ValueError("the paged signature (TVM's kernel) has no attention sinks")
    HQ, HKV, D = int(num_q_heads), int(num_kv_heads), int(head_dim)
    GROUP = HQ // HKV
    PS = PAGE_SIZE
    DPT = (D + NT - 1) // NT  # output dimensions per thread
    W = int(window) if window else 0  # 0: no window (all earlier keys)
    CAP = float(softcap) if softcap else 0.0
    CAP_DIV = CAP or 1.0  # (a Python value: TVMScript evaluates no Python conditionals inline)
    SCALE = float(scale)
    SINKS = bool(sinks)

    @T.macro
    def attend(n, q, pages, qo_indptr, page_indptr, page_values, first_key, q_positions, out,
               b1, sink):
        q_sh = T.sblock_alloc_buffer((D,), "float32", scope="shared")
        # the tile's scores, then their weights exp(score - max), 0 past the last key
        p_sh = T.sblock_alloc_buffer((NT,), "float32", scope="shared")
        pg_sh = T.sblock_alloc_buffer((NT,), "int32", scope="shared")  # each key's page
        seq = T.sblock_alloc_buffer((1,), "int32", scope="local")
        # every thread keeps the running softmax state itself (the same values in all of them):
        # running max, running sum, this tile's max, rescale of what came before, its own score
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
                    lo: T.let[T.int32] = T.if_then_else(W > 0, T.max(pos - W + 1, 0), 0)
                    count: T.let[T.int32] = pos - lo + 1
                    # the page list's start, moved back by the freed pages: (c - key0) // PS
                    first: T.let[T.int32] = page_indptr[seq[0]] - first_key[seq[0]] // PS
                    kvh: T.let[T.int32] = head // GROUP
                    for dd in T.serial(DPT):
                        if dd * NT + tx < D:
                            q_sh[dd * NT + tx] = T.Cast("float32", q[row, head, dd * NT + tx])
                        acc[dd] = T.float32(0)
                    st[0] = T.float32(NEG_BIG)
                    st[1] = T.float32(0)
                    T.tvm_storage_sync("shared")
                    for tile in T.serial((count + NT - 1) // NT):
                        c: T.let[T.int32] = lo + tile * NT + tx
                        st[4] = T.float32(NEG_BIG)
                        pg_sh[tx] = 0
                        if c <= pos:
                            page: T.let[T.int32] = page_values[first + c // PS]
                            pg_sh[tx] = page
                            st[4] = T.float32(0)
                            # (unrolled: the key's loads are issued together, not one per
                            # round trip to memory; the sum keeps its order)
                            for d in T.unroll(D):
                                st[4] = st[4] + q_sh[d] * T.Cast(
                                    "float32", pages[page, 0, kvh, c % PS, d])
                            st[4] = st[4] * T.float32(SCALE)
                            if CAP > 0:  # a Python constant: decided when the kernel is built
                                st[4] = T.float32(CAP) * T.tanh(
                                    st[4] / T.float32(CAP_DIV))
                        p_sh[tx] = st[4]
                        T.tvm_storage_sync("shared")
                        st[2] = st[0]
                        for j in T.unroll(NT):
                            st[2] = T.max(st[2], p_sh[j])
                        T.tvm_storage_sync("shared")
                        # each key's weight computed once, by its own thread
                        p_sh[tx] = T.if_then_else(c <= pos, T.exp(st[4] - st[2]), T.float32(0))
                        T.tvm_storage_sync("shared")
                        st[3] = T.exp(st[0] - st[2])
                        st[1] = st[1] * st[3]
                        for j in T.serial(NT):
                            st[1] = st[1] + p_sh[j]
                        for dd in T.serial(DPT):
                            if dd * NT + tx < D:
                                acc[dd] = acc[dd] * st[3]
                                for j in T.serial(NT):
                                    cj: T.let[T.int32] = lo + tile * NT + j
                                    if cj <= pos:
                                        acc[dd] = acc[dd] + p_sh[j] * T.Cast(
                                            "float32", pages[pg_sh[j], 1, kvh, cj % PS,
                                                             dd * NT + tx])
                        st[0] = st[2]
                        T.tvm_storage_sync("shared")
                    st[3] = T.float32(1)
                    if SINKS:  # (a Python constant) the sink joins the sum, not the values
                        st[2] = T.max(st[0], T.Cast("float32", sink[head]))
                        st[3] = T.exp(st[0] - st[2])
                        st[1] = st[1] * st[3] + T.exp(T.Cast("float32", sink[head]) - st[2])
                    for dd in T.serial(DPT):
                        if dd * NT + tx < D:
                            out[row, head, dd * NT + tx] = T.Cast(dtype,
                                                                  acc[dd] * st[3] / st[1])

    if paged_signature:  # (only the function asked for is parsed)

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
            pages = T.match_buffer(var_pages, (num_pages, 2, HKV, PS, D), dtype)
            qo_indptr = T.match_buffer(var_qo_indptr, (b1,), "int32")
            page_indptr = T.match_buffer(var_page_indptr, (b1,), "int32")
            page_values = T.match_buffer(var_page_values, (p,), "int32")
            last_page_len = T.match_buffer(var_last_page_len, (b,), "int32")
            first_key = T.match_buffer(var_first_key, (b,), "int32")
            q_positions = T.match_buffer(var_q_positions, (n,), "int32")
            out = T.match_buffer(var_out, (n, HQ, D), dtype)
            _lse = T.match_buffer(var_lse, (n, HQ), "float32")  # (not written: no caller reads it)
            attend(n, q, pages, qo_indptr, page_indptr, page_values, first_key, q_positions, out, b1,
                   None)

        return paged_decode

    @T.prim_func(s_tir=True)
    def window_attention(var_q: T.handle, var_pages: T.handle, var_qo_indptr: T.handle,
                         var_page_indptr: T.handle, var_page_values: T.handle,
                         var_last_page_len: T.handle, var_first_key: T.handle,
                         var_q_positions: T.handle, var_sinks: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n = T.int32()
        b = T.int32()
        b1 = T.int32()
        p = T.int32()
        num_pages = T.int32()
        q = T.match_buffer(var_q, (n, HQ, D), dtype)
        pages = T.match_buffer(var_pages, (num_pages, 2, HKV, PS, D), dtype)
        qo_indptr = T.match_buffer(var_qo_indptr, (b1,), "int32")
        page_indptr = T.match_buffer(var_page_indptr, (b1,), "int32")
        page_values = T.match_buffer(var_page_values, (p,), "int32")
        last_page_len = T.match_buffer(var_last_page_len, (b,), "int32")
        first_key = T.match_buffer(var_first_key, (b,), "int32")
        q_positions = T.match_buffer(var_q_positions, (n,), "int32")
        sinks = T.match_buffer(var_sinks, (HQ,), dtype)
        out = T.match_buffer(var_out, (n, HQ, D), dtype)
        attend(n, q, pages, qo_indptr, page_indptr, page_values, first_key, q_positions, out, b1,
               sinks)

    func = window_attention if SINKS else without_param(window_attention, SINKS_PARAM)
    return func.with_attr("global_symbol", kernel_name(window, softcap, SINKS))


@built_once
def paged_decode_prim_func(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                           scale: float) -> PrimFunc:
    """This kernel (causal, no window or cap) with the parameters of TVM's
    ``batch_prefill_paged_kv`` (paged_attention.py): ``(q, qo_indptr, pages, page_indptr,
    page_values, last_page_len, k_rope_pos_offset, q_positions) -> (out, lse)``, so that it can
    stand in for that kernel in the decode plans of a kernel set (CUDA: TVM's prefill kernel
    runs a fixed 16 blocks per KV head, so a one-row step keeps 8 of an H100's 132
    multiprocessors busy). ``lse`` is not written: no caller reads it."""
    return window_attention_prim_func(num_q_heads, num_kv_heads, head_dim, dtype, scale, None,
                                      None, paged_signature=True)


def kernel_name(window: int | None, softcap: float | None, sinks: bool = False) -> str:
    """Distinct kernels in one module need distinct names."""
    return "window_attention" + (f"_w{int(window)}" if window else "") + (
        f"_cap{float(softcap):g}".replace(".", "p") if softcap else "") + (
        "_sinks" if sinks else "")


# the window signature's sinks parameter: its place (just before the output), which the
# kernels without sinks drop
SINKS_PARAM = 8


def without_param(func: PrimFunc, index: int) -> PrimFunc:
    """``func`` without parameter ``index``, which its body does not read (one source for a
    kernel with and without an optional input)."""
    params = list(func.params)
    return PrimFunc(params[:index] + params[index + 1:], func.body, func.ret_type, func.attrs)
