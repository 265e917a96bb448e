"""Paged attention for CPUs (LLVM target): drop-in replacements for the two GPU kernels.

wick's paged attention runs one of two GPU-only TIR kernels per layer (paged_attention.py):
TVM's ``batch_prefill_paged_kv`` (causal attention, specialized with causal=1, rotary_mode=0
and the softmax scale) or window_attention.py's kernel (sliding window and/or Gemma-2 logit
soft-capping). Both bind GPU threads, and TVM's prefill kernel refuses a CPU target.
``cpu_attention_prim_func`` builds a plain TIR PrimFunc with the parameters of either one
(same count, order, names, buffer shapes with the same symbolic shape variables, dtypes and
element offsets), so a CPU build can swap it in by name inside an already-built Relax module:

    mod[name] = cpu_attention_prim_func(..., signature="paged").with_attr("global_symbol", name)

(``PagedAttention.cpu_twins()`` does that for a model's attention kernels.)

Signatures (P = PAGE_SIZE = 16, pages (P_total, 2 = k|v, HKV, P, D); K of key slot ``t`` on
page ``g`` and kv head ``h`` is ``pages[g, 0, h, t, :]``, V is ``pages[g, 1, h, t, :]``):

``"paged"`` (TVM's specialized ``batch_prefill_paged_kv``)::

    (q: (total_len, HQ, D) dtype, q_indptr: (batch_size + 1,) i32, pages: (max_num_pages, 2,
     HKV, P, D) dtype, page_indptr: (batch_size + 1,) i32, page_values: (nnz_pages,) i32,
     length_info: (batch_size,) i32 (= last_page_len), k_rope_pos_offset: (batch_size,) i32,
     q_rope_position: (total_len,) i32, output: (total_len, HQ, D) dtype,
     lse: (total_len, HQ) f32)

  Which keys a query sees (as TVM's kernel computes it; positions play no part in it since
  RoPE is applied before, so ``k_rope_pos_offset`` and ``q_rope_position`` are unused):
  sequence ``s`` owns query rows ``q_indptr[s] <= row < q_indptr[s+1]`` and the keys
  ``0 <= col < kv_len``, ``kv_len = (page_indptr[s+1] - page_indptr[s] - 1) * P +
  last_page_len[s]`` (0 without pages), key ``col`` being slot ``col % P`` of page
  ``page_values[page_indptr[s] + col // P]``. Query ``r = row - q_indptr[s]`` (the r-th new
  token) sees ``col <= kv_len - qo_len + r``, qo_len = the sequence's number of rows: the
  new tokens are the last qo_len keys. ``lse[row, h]`` is what TVM writes: the log-sum-exp of
  the scaled scores in base 2, ``log2(sum_j exp(scale * q.k_j))``; a query that sees no key
  gets output 0 and lse -5e4 (TVM's initial state).

``"window"`` (window_attention.py's ``window_attention_prim_func``)::

    (q: (n, HQ, D), pages: (num_pages, 2, HKV, P, D), qo_indptr: (b1,), page_indptr: (b1,),
     page_values: (p,), last_page_len: (b,), first_key: (b,), q_positions: (n,)
     [, sinks: (HQ,) dtype], out: (n, HQ, D))

  Keys are indexed by absolute position: the query at ``pos = q_positions[row]`` sees keys
  ``c`` with ``max(pos - window + 1, 0) <= c <= pos`` (``0 <= c <= pos`` without a window),
  key ``c`` being slot ``c % P`` of page ``page_values[page_indptr[s] - first_key[s] // P +
  c // P]`` (``first_key`` = ``k_rope_pos_offset``: the position of the first listed key,
  past the pages the cache freed behind the window). Scores ``scale * q.k`` become
  ``softcap * tanh(score / softcap)`` when a softcap is given, before the softmax. With
  ``sinks`` (GPT-OSS), head ``h``'s sink logit ``sinks[h]`` joins the softmax's sum and no
  value: the output is ``sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sinks[h]))``.
  ``last_page_len`` is unused, as on the GPU.

Both: sequence ``s`` of a row is the last ``s < b1 - 1`` with ``qo_indptr[s] <= row``; q head
``h`` reads kv head ``h // (HQ // HKV)``. Scores, softmax state and the output accumulator are
float32 whatever ``dtype``; the softmax is online (running max and sum, rescaled once per
page of keys), so scratch is O(D) per (row, head), not O(context). One guard the GPU kernels
lack (robust buffer access protects them): the key range is clipped to the sequence's listed
pages, so inconsistent index arrays cannot make it read outside ``pages``; for consistent
ones (every visible key listed) the clip changes nothing.

Schedule: one ``T.parallel`` loop over the fused (query row, q head) index (a one-token
decode with HQ heads still keeps HQ threads busy); everything inside is serial per
iteration, with the head_dim loops vectorized (``VL`` lanes; partial dot products per lane).
The per-iteration scratch (q row, accumulator, lane partials, one page's scores, softmax
state) is allocated inside the parallel body, in the default scope: TVM's CPU lowering keeps
each such buffer under 1 KiB as a stack array of the parallel lambda (a worker's own), and
turns bigger ones (q row and accumulator when head_dim >= 256) into per-iteration
``TVMBackendAllocWorkspace`` calls, which use a per-thread pool: private either way. (Scope
"local" would send every buffer through the workspace calls.)
"""

from __future__ import annotations

import math

from tvm.script import tirx as T
from tvm.tirx import PrimFunc

from ..kernel_memo import built_once
from .kv_layout import PAGE_SIZE
from .window_attention import SINKS_PARAM, kernel_name, without_param

PAGED_NAME = "batch_prefill_paged_kv"
NEG_BIG = -3.0e38  # running max before the first key
LSE_EMPTY = -5.0e4  # TVM's initial running max (lse of a query that sees no key)
LOG2E = math.log2(math.e)


def _lanes(d: int) -> int:
    """Vector width of the head_dim loops: 16 f32 lanes (one AVX-512 register) or less."""
    for v in (16, 8, 4, 2):
        if d % v == 0:
            return v
    return 1


@built_once
def cpu_attention_prim_func(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                            scale: float, window: int | None = None,
                            softcap: float | None = None,
                            signature: str | None = None, causal: bool = True,
                            sinks: bool = False) -> PrimFunc:
    """A CPU PrimFunc with the parameters of the GPU attention kernel named by ``signature``.

    ``signature``: ``"paged"`` (TVM's ``batch_prefill_paged_kv``, causal, no window or
    softcap) or ``"window"`` (``window_attention_prim_func``); None picks what
    paged_attention.py picks: ``"window"`` when a window or softcap is given. ``scale``
    multiplies q.k; ``window``: a key is visible at most ``window - 1`` positions back;
    ``softcap``: scores -> ``softcap * tanh(scores / softcap)``. The function's
    ``causal=False`` (``"paged"`` only: TVM's kernel specialized with causal=0, an encoder's):
    every query of a sequence sees all of its keys. ``sinks`` (``"window"`` only): each
    head's sink logit joins its softmax (a parameter before the output). The function's
    ``global_symbol`` is the GPU kernel's name without a tag (``batch_prefill_paged_kv`` or
    ``window_kernel.kernel_name(window, softcap)``).
    """
    HQ, HKV, D = int(num_q_heads), int(num_kv_heads), int(head_dim)
    if HQ % HKV:
        raise ValueError(f"num_q_heads {HQ} is not a multiple of num_kv_heads {HKV}")
    if signature is None:
        signature = "window" if (window or softcap or sinks) else "paged"
    if signature == "paged" and (window or softcap or sinks):
        raise ValueError("the paged signature (TVM's kernel) has no window, softcap or sinks")
    if signature not in ("paged", "window"):
        raise ValueError(f"signature must be 'paged' or 'window', not {signature!r}")
    GROUP = HQ // HKV
    PS = PAGE_SIZE
    VL = _lanes(D)
    DV = D // VL
    W = int(window) if window else 0  # 0: no window
    CAP = float(softcap) if softcap else 0.0
    CAP_DIV = CAP or 1.0  # (TVMScript evaluates no Python conditional expressions inline)
    SCALE = float(scale)
    SINKS = bool(sinks)
    if not causal and signature != "paged":
        raise ValueError("only the paged signature has a non-causal form")
    CAUSAL = 1 if causal else 0  # (read inside the kernel: a constant there)

    @T.macro
    def fold(part, w):
        """part[0:w] += part[w:2w] (Python-constant w: one vector add)."""
        for dl in T.vectorized(w):
            part[dl] = part[dl] + part[dl + w]

    @T.macro
    def attend(q, pages, page_values, row, head, lo, hi, base, out, st, sink):
        """Attention of q[row, head] over keys lo..hi (key c: slot c % PS of page
        page_values[base + c // PS]) into out[row, head, :]; st[0], st[1] = running max, sum;
        ``sink``: the heads' sink logits (with ``SINKS``)."""
        kvh: T.let[T.int32] = head // GROUP
        qf = T.alloc_buffer((D,), "float32")
        acc = T.alloc_buffer((D,), "float32")
        part = T.alloc_buffer((VL,), "float32")
        sc = T.alloc_buffer((PS,), "float32")  # one page's scores
        for dv in T.serial(DV):
            for dl in T.vectorized(VL):
                qf[dv * VL + dl] = T.Cast("float32", q[row, head, dv * VL + dl])
                acc[dv * VL + dl] = T.float32(0)
        st[0] = T.float32(NEG_BIG)
        st[1] = T.float32(0)
        lo_page: T.let[T.int32] = T.floordiv(lo, PS)
        for tile in T.serial(T.max(T.floordiv(hi, PS) - lo_page + 1, 0)):
            pg: T.let[T.int32] = lo_page + tile
            c0: T.let[T.int32] = T.max(lo, pg * PS)
            c1: T.let[T.int32] = T.min(hi, pg * PS + PS - 1)
            page: T.let[T.int32] = page_values[base + pg]
            t0: T.let[T.int32] = c0 - pg * PS  # first slot
            st[2] = st[0]  # this page's max (with the running max)
            for j in T.serial(c1 - c0 + 1):
                for dl in T.vectorized(VL):
                    part[dl] = T.float32(0)
                for dv in T.serial(DV):
                    for dl in T.vectorized(VL):
                        part[dl] = part[dl] + qf[dv * VL + dl] * T.Cast(
                            "float32", pages[page, 0, kvh, t0 + j, dv * VL + dl])
                # lanes summed pairwise (a chain of log2(VL) vector adds, not VL scalar ones)
                if VL >= 16:
                    fold(part, 8)
                if VL >= 8:
                    fold(part, 4)
                if VL >= 4:
                    fold(part, 2)
                if VL >= 2:
                    fold(part, 1)
                st[3] = part[0] * T.float32(SCALE)
                if CAP > 0:  # a Python constant: decided when the kernel is built
                    st[3] = T.float32(CAP) * T.tanh(st[3] / T.float32(CAP_DIV))
                sc[j] = st[3]
                st[2] = T.max(st[2], st[3])
            st[3] = T.exp(st[0] - st[2])  # rescale of what came before
            st[1] = st[1] * st[3]
            for dv in T.serial(DV):
                for dl in T.vectorized(VL):
                    acc[dv * VL + dl] = acc[dv * VL + dl] * st[3]
            for j in T.serial(c1 - c0 + 1):
                st[3] = T.exp(sc[j] - st[2])
                st[1] = st[1] + st[3]
                for dv in T.serial(DV):
                    for dl in T.vectorized(VL):
                        acc[dv * VL + dl] = acc[dv * VL + dl] + st[3] * T.Cast(
                            "float32", pages[page, 1, kvh, t0 + j, dv * VL + dl])
            st[0] = st[2]
        # no visible key: output 0 (what TVM's kernel writes for a sequence without keys)
        st[3] = T.if_then_else(st[1] > T.float32(0), T.float32(1) / st[1], T.float32(0))
        if SINKS:  # (a Python constant) the sink joins the sum, not the values
            st[2] = T.max(st[0], T.Cast("float32", sink[head]))
            st[3] = T.exp(st[0] - st[2]) / (st[1] * T.exp(st[0] - st[2])
                                             + T.exp(T.Cast("float32", sink[head]) - st[2]))
        for dv in T.serial(DV):
            for dl in T.vectorized(VL):
                out[row, head, dv * VL + dl] = T.Cast(dtype, acc[dv * VL + dl] * st[3])

    @T.macro
    def find_seq(indptr, nseq, row, seqv):
        """seqv[0] = the last s < nseq with indptr[s] <= row (0 if none): the row's sequence."""
        seqv[0] = 0
        for s in T.serial(nseq):
            if indptr[s] <= row:
                seqv[0] = s

    if signature == "paged":  # (only the function asked for is parsed: ~0.1 s each)

        @T.prim_func
        def batch_prefill_paged_kv(var_q: T.handle, var_q_indptr: T.handle, var_pages: T.handle,
                                   var_page_indptr: T.handle, var_page_values: T.handle,
                                   var_length_info: T.handle, var_k_rope_pos_offset: T.handle,
                                   var_q_rope_position: T.handle, var_output: T.handle,
                                   var_lse: T.handle):
            T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
            batch_size = T.int32()
            total_len = T.int32()
            nnz_pages = T.int32()
            max_num_pages = T.int32()
            pages_elem_offset = T.int64()
            q_indptr_elem_offset = T.int32()
            page_indptr_elem_offset = T.int32()
            page_values_elem_offset = T.int32()
            k_rope_pos_offset_elem_offset = T.int32()
            q_rope_position_elem_offset = T.int32()
            length_info_elem_offset = T.int32()
            q = T.match_buffer(var_q, (total_len, HQ, D), dtype)
            q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32",
                                      elem_offset=q_indptr_elem_offset)
            pages = T.match_buffer(var_pages, (max_num_pages, 2, HKV, PS, D), dtype,
                                   elem_offset=pages_elem_offset)
            page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32",
                                         elem_offset=page_indptr_elem_offset)
            page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32",
                                         elem_offset=page_values_elem_offset)
            length_info = T.match_buffer(var_length_info, (batch_size,), "int32",
                                         elem_offset=length_info_elem_offset)
            # (unused: TVM's kernel reads positions only to apply RoPE, which rotary_mode 0 skips)
            k_rope_pos_offset = T.match_buffer(  # noqa: F841
                var_k_rope_pos_offset, (batch_size,), "int32",
                elem_offset=k_rope_pos_offset_elem_offset)
            q_rope_position = T.match_buffer(  # noqa: F841
                var_q_rope_position, (total_len,), "int32",
                elem_offset=q_rope_position_elem_offset)
            output = T.match_buffer(var_output, (total_len, HQ, D), dtype)
            lse = T.match_buffer(var_lse, (total_len, HQ), "float32")
            for fused in T.parallel(total_len * HQ):
                row: T.let[T.int32] = fused // HQ
                head: T.let[T.int32] = fused % HQ
                seqv = T.alloc_buffer((1,), "int32")
                st = T.alloc_buffer((4,), "float32")
                find_seq(q_indptr, batch_size, row, seqv)
                s: T.let[T.int32] = seqv[0]
                npages: T.let[T.int32] = page_indptr[s + 1] - page_indptr[s]
                kv_len: T.let[T.int32] = T.if_then_else(
                    npages > 0, (npages - 1) * PS + length_info[s], 0)
                qo_len: T.let[T.int32] = q_indptr[s + 1] - q_indptr[s]
                hi: T.let[T.int32] = T.min(
                    T.if_then_else(CAUSAL == 1, kv_len - qo_len + (row - q_indptr[s]),
                                   kv_len - 1), npages * PS - 1)
                attend(q, pages, page_values, row, head, 0, hi, page_indptr[s], output, st,
                       None)
                lse[row, head] = T.if_then_else(
                    st[1] > T.float32(0), (st[0] + T.log(st[1])) * T.float32(LOG2E),
                    T.float32(LSE_EMPTY))

        return batch_prefill_paged_kv.with_attr("global_symbol", PAGED_NAME)

    @T.prim_func
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
        last_page_len = T.match_buffer(var_last_page_len, (b,), "int32")  # noqa: F841
        first_key = T.match_buffer(var_first_key, (b,), "int32")
        q_positions = T.match_buffer(var_q_positions, (n,), "int32")
        sinks = T.match_buffer(var_sinks, (HQ,), dtype)
        out = T.match_buffer(var_out, (n, HQ, D), dtype)
        for fused in T.parallel(n * HQ):
            row: T.let[T.int32] = fused // HQ
            head: T.let[T.int32] = fused % HQ
            seqv = T.alloc_buffer((1,), "int32")
            st = T.alloc_buffer((4,), "float32")
            find_seq(qo_indptr, b1 - 1, row, seqv)
            s: T.let[T.int32] = seqv[0]
            pos: T.let[T.int32] = q_positions[row]
            # first listed page = absolute page first_key // PS; the list moved back by it
            page0: T.let[T.int32] = T.floordiv(first_key[s], PS)
            base: T.let[T.int32] = page_indptr[s] - page0
            lo: T.let[T.int32] = T.max(T.if_then_else(W > 0, pos - W + 1, 0), page0 * PS)
            hi: T.let[T.int32] = T.min(
                pos, (page0 + page_indptr[s + 1] - page_indptr[s]) * PS - 1)
            attend(q, pages, page_values, row, head, lo, hi, base, out, st, sinks)

    func = window_attention if SINKS else without_param(window_attention, SINKS_PARAM)
    return func.with_attr("global_symbol", kernel_name(window, softcap, SINKS))
