"""GPU logit processing and logprobs: two hand-written TIR kernels beside ``sample_token``.

``apply_logit_rules`` (the ``process_logits`` plan entry) turns the model's logits into the
ones sampling sees, per batch row:

    apply_logit_rules(logits: (b, V) f32, mask: (b, W) i32, mask_on: (b,) i32,
                   indptr: (b+1,) i32, tokens: (nnz,) i32, rep: (nnz,) f32, add: (nnz,) f32)
        -> out: (b, V) f32                                   (W = ceil(V / 32))

* ``mask_on[r] != 0``: token ``i`` is allowed iff bit ``i % 32`` of ``mask[r, i // 32]`` is set
  (xgrammar's bitmask layout); a disallowed token gets ``MASKED`` (-3e38: WGSL has no infinity
  literal, and exp(MASKED - max) is 0 at any temperature).
* the sparse entries ``indptr[r] <= k < indptr[r+1]`` name the tokens some rule touches (each at
  most once per row), with what the host folded together:
  ``x = logits[r, t]; x = x * rep if x < 0 else x / rep`` (transformers'
  ``RepetitionPenaltyLogitsProcessor``; rep = 1 leaves x alone) then ``x += add`` (OpenAI's
  ``logit_bias`` minus ``frequency_penalty * count + presence_penalty``).

Rows that ask for nothing have ``mask_on = 0`` and no entries: a copy. The dense pass and the
sparse pass touch the same element from the same thread (thread ``t % 256`` owns token ``t`` in
both), so program order alone puts the sparse write last: no barrier between them.

``process_logits_prim_func_cpu`` / ``logprobs_prim_func_cpu`` (at the end of this file) are
the same two functions for LLVM CPU targets, with identical parameters and results.

``token_logprobs`` reads the model's own logits (before processing and temperature, as vLLM
reports them by default) and the sampled tokens:

    token_logprobs(logits: (b, V) f32, token: (b,) i32, num_top: (b,) i32)
        -> logprob: (b, 1 + K) f32, top_ids: (b, K) i32               (K = MAX_TOP_LOGPROBS)

``logprob[r, 0]`` is ``log_softmax(logits[r])[token[r]]``; ``logprob[r, 1 + j]`` and
``top_ids[r, j]`` for ``j < num_top[r]`` are the ``j``-th largest, ties to the smaller index
(each round is an argmax over the entries that sort after the previous winner). A row with
``num_top < 0`` wants nothing and skips every data loop (its outputs are left unwritten).
All arithmetic is f32; the log-sum-exp is taken around the row max.
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.tirx import PrimFunc

from ..engine.batch import MAX_TOP_LOGPROBS
from .kernel_memo import built_once
from .sampling import INT_MAX, NUM_THREADS, argmax_tree, tree_sum

MASKED = -3.0e38
PROCESS_PARAM_ORDER = ("logits", "mask", "mask_on", "indptr", "tokens", "rep", "add", "out")
LOGPROBS_PARAM_ORDER = ("logits", "token", "num_top", "logprob", "top_ids")


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


@built_once
def process_logits_prim_func(vocab_size: int) -> PrimFunc:
    V = int(vocab_size)
    W = bitmask_words(V)
    NT = NUM_THREADS
    CH = (V + NT - 1) // NT

    @T.prim_func(s_tir=True)
    def apply_logit_rules(var_logits: T.handle, var_mask: T.handle, var_mask_on: T.handle,
                       var_indptr: T.handle, var_tokens: T.handle, var_rep: T.handle,
                       var_add: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int32()
        nnz = T.int32()
        logits = T.match_buffer(var_logits, (b, V), "float32")
        mask = T.match_buffer(var_mask, (b, W), "int32")
        mask_on = T.match_buffer(var_mask_on, (b,), "int32")
        indptr = T.match_buffer(var_indptr, (b + 1,), "int32")
        tokens = T.match_buffer(var_tokens, (nnz,), "int32")
        rep = T.match_buffer(var_rep, (nnz,), "float32")
        add = T.match_buffer(var_add, (nnz,), "float32")
        out = T.match_buffer(var_out, (b, V), "float32")
        for bx in T.thread_binding(b, thread="blockIdx.x"):
            for tx in T.thread_binding(NT, thread="threadIdx.x"):
                masking: T.let[T.bool] = mask_on[bx] != 0
                for j in T.serial(CH):
                    if j * NT + tx < V:
                        i: T.let[T.int32] = j * NT + tx
                        allowed: T.let[T.bool] = T.bitwise_and(
                            T.shift_right(mask[bx, T.floordiv(i, 32)], T.floormod(i, 32)), 1) != 0
                        out[bx, i] = T.if_then_else(masking and not allowed, T.float32(MASKED),
                                                    logits[bx, i])
                for e in T.serial(indptr[bx + 1] - indptr[bx]):
                    k: T.let[T.int32] = indptr[bx] + e
                    t: T.let[T.int32] = tokens[k]
                    if T.floormod(t, NT) == tx:  # the thread that wrote out[bx, t] above
                        x: T.let[T.float32] = logits[bx, t]
                        x2: T.let[T.float32] = T.if_then_else(x < T.float32(0), x * rep[k],
                                                              x / rep[k]) + add[k]
                        ok: T.let[T.bool] = T.bitwise_and(
                            T.shift_right(mask[bx, T.floordiv(t, 32)], T.floormod(t, 32)), 1) != 0
                        out[bx, t] = T.if_then_else(masking and not ok, T.float32(MASKED), x2)

    return apply_logit_rules.with_attr("global_symbol", "apply_logit_rules")


@built_once
def logprobs_prim_func(vocab_size: int) -> PrimFunc:
    V = int(vocab_size)
    K = MAX_TOP_LOGPROBS
    NT = NUM_THREADS
    CH = (V + NT - 1) // NT
    NEG_BIG = T.float32(-3.0e38)
    POS_BIG = T.float32(3.0e38)

    @T.prim_func(s_tir=True)
    def token_logprobs(var_logits: T.handle, var_token: T.handle, var_num_top: T.handle,
                       var_logprob: T.handle, var_top_ids: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int32()
        logits = T.match_buffer(var_logits, (b, V), "float32")
        token = T.match_buffer(var_token, (b,), "int32")
        num_top = T.match_buffer(var_num_top, (b,), "int32")
        logprob = T.match_buffer(var_logprob, (b, K + 1), "float32")
        top_ids = T.match_buffer(var_top_ids, (b, K), "int32")
        red_f = T.sblock_alloc_buffer((NT,), "float32", scope="shared")
        red_i = T.sblock_alloc_buffer((NT,), "int32", scope="shared")
        red_f2 = T.sblock_alloc_buffer((NT,), "float32", scope="shared")
        red_i2 = T.sblock_alloc_buffer((NT,), "int32", scope="shared")
        lf = T.sblock_alloc_buffer((3,), "float32", scope="local")  # best, sum, previous winner
        li = T.sblock_alloc_buffer((2,), "int32", scope="local")  # best index, previous index
        for bx in T.thread_binding(b, thread="blockIdx.x"):
            for tx in T.thread_binding(NT, thread="threadIdx.x"):
                # branches on `wanted` only wrap barrier-free data loops (WGSL uniformity)
                wanted: T.let[T.bool] = num_top[bx] >= 0
                # ---- row max ----
                lf[0] = NEG_BIG
                li[0] = INT_MAX
                if wanted:
                    for j in T.serial(CH):
                        if j * NT + tx < V:
                            if logits[bx, j * NT + tx] > lf[0] or li[0] == INT_MAX:
                                lf[0] = logits[bx, j * NT + tx]
                                li[0] = j * NT + tx
                red_f[tx] = lf[0]
                red_i[tx] = li[0]
                argmax_tree(tx, red_f, red_i, red_f2, red_i2)
                row_max: T.let[T.float32] = red_f[0]
                T.tvm_storage_sync("shared")
                # ---- log-sum-exp ----
                lf[1] = T.float32(0)
                if wanted:
                    for j in T.serial(CH):
                        if j * NT + tx < V:
                            lf[1] = lf[1] + T.exp(logits[bx, j * NT + tx] - row_max)
                red_f[tx] = lf[1]
                red_i[tx] = 0
                tree_sum(tx, red_f, red_i)
                lse: T.let[T.float32] = row_max + T.log(T.max(red_f[0], T.float32(1e-30)))
                T.tvm_storage_sync("shared")
                if wanted and tx == 0:
                    logprob[bx, 0] = logits[bx, T.min(T.max(token[bx], 0), V - 1)] - lse
                # ---- top entries, one argmax round each ----
                lf[2] = POS_BIG
                li[1] = -1
                for r in T.serial(K):
                    lf[0] = NEG_BIG
                    li[0] = INT_MAX
                    if wanted and r < num_top[bx]:
                        for j in T.serial(CH):
                            if j * NT + tx < V:
                                x: T.let[T.float32] = logits[bx, j * NT + tx]
                                after: T.let[T.bool] = x < lf[2] or (
                                    x == lf[2] and j * NT + tx > li[1])
                                if after and (x > lf[0] or li[0] == INT_MAX):
                                    lf[0] = x
                                    li[0] = j * NT + tx
                    red_f[tx] = lf[0]
                    red_i[tx] = li[0]
                    argmax_tree(tx, red_f, red_i, red_f2, red_i2)
                    lf[2] = red_f[0]
                    li[1] = red_i[0]
                    if wanted and r < num_top[bx] and tx == 0:
                        logprob[bx, r + 1] = lf[2] - lse
                        top_ids[bx, r] = li[1]
                    T.tvm_storage_sync("shared")

    return token_logprobs.with_attr("global_symbol", "token_logprobs")


# ============================================================================================
# CPU twins
# ============================================================================================
# wick's native CPU backend swaps the two kernels above for these inside an already built Relax
# module, by name: same parameters (names, shapes with the same symbolic ``b`` / ``nnz``,
# dtypes), same global symbols, same results. Rows run in parallel on TVM's thread pool; inside
# a row everything is serial.


@built_once
def process_logits_prim_func_cpu(vocab_size: int) -> PrimFunc:
    """``apply_logit_rules`` for LLVM CPU targets: the dense mask copy, then the sparse entries
    in order (a later entry for the same token wins, as on the GPU). One difference: an entry
    whose token lies outside ``[0, V)`` is skipped, where the GPU kernel would write outside
    the row (WebGPU clamps such an access; a CPU would corrupt memory)."""
    V = int(vocab_size)
    W = bitmask_words(V)
    WF = V // 32  # full mask words: 32 tokens each, an unconditional (vectorizable) inner loop

    @T.prim_func
    def apply_logit_rules(var_logits: T.handle, var_mask: T.handle, var_mask_on: T.handle,
                          var_indptr: T.handle, var_tokens: T.handle, var_rep: T.handle,
                          var_add: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int32()
        nnz = T.int32()
        logits = T.match_buffer(var_logits, (b, V), "float32")
        mask = T.match_buffer(var_mask, (b, W), "int32")
        mask_on = T.match_buffer(var_mask_on, (b,), "int32")
        indptr = T.match_buffer(var_indptr, (b + 1,), "int32")
        tokens = T.match_buffer(var_tokens, (nnz,), "int32")
        rep = T.match_buffer(var_rep, (nnz,), "float32")
        add = T.match_buffer(var_add, (nnz,), "float32")
        out = T.match_buffer(var_out, (b, V), "float32")
        for r in T.parallel(b):
            masking: T.let[T.bool] = mask_on[r] != 0
            # ---- dense: copy, masked tokens -> MASKED (xgrammar's bit i % 32 of word i // 32) ----
            for w in T.serial(WF):
                for u in T.vectorized(32):
                    # Select (both sides evaluated; the load is in bounds) and a bit test
                    # against the constant 1 << u keep this a plain vector loop
                    out[r, w * 32 + u] = T.Select(
                        masking and T.bitwise_and(mask[r, w], T.shift_left(1, u)) == 0,
                        T.float32(MASKED), logits[r, w * 32 + u])
            for i in T.serial(WF * 32, V):
                out[r, i] = T.if_then_else(
                    masking and T.bitwise_and(T.shift_right(mask[r, WF], i - WF * 32), 1) == 0,
                    T.float32(MASKED), logits[r, i])
            # ---- sparse: penalties and bias from the ORIGINAL logit, the mask still wins ----
            for e in T.serial(indptr[r + 1] - indptr[r]):
                k: T.let[T.int32] = indptr[r] + e
                t: T.let[T.int32] = tokens[k]
                if t >= 0 and t < V:
                    x: T.let[T.float32] = logits[r, t]
                    x2: T.let[T.float32] = T.if_then_else(x < T.float32(0), x * rep[k],
                                                          x / rep[k]) + add[k]
                    ok: T.let[T.bool] = T.bitwise_and(
                        T.shift_right(mask[r, T.floordiv(t, 32)], T.floormod(t, 32)), 1) != 0
                    out[r, t] = T.if_then_else(masking and not ok, T.float32(MASKED), x2)

    return apply_logit_rules.with_attr("global_symbol", "apply_logit_rules")


@built_once
def logprobs_prim_func_cpu(vocab_size: int) -> PrimFunc:
    """``token_logprobs`` for LLVM CPU targets, the GPU kernel's outputs:

    * the row max, then the sum of ``exp(l - max)`` in the GPU kernel's order (256 strided
      lanes, then its halving tree), so ``lse`` is the GPU's up to ``expf``'s last ulp;
    * the top entries in ONE pass instead of one argmax pass per entry: each token enters a
      sorted list of ``n = min(num_top, K)`` entries (held in the output rows themselves, as
      raw logits until ``lse`` is known) when it beats the last one, and bubbles up past
      strictly smaller values only. Tokens arrive in index order, so equal values keep the
      smaller index first: the GPU's order (value descending, ties to the smaller index).
      NaN logits are never listed (the GPU's rounds never pick one either).

    If a row has fewer than ``n`` tokens, the missing entries are the GPU's empty rounds
    (``-3e38 - lse``, id ``INT_MAX``); only there could the GPU differ (its later rounds
    would list a ``-inf`` token again), and only when ``V < K``."""
    V = int(vocab_size)
    K = MAX_TOP_LOGPROBS
    NT = NUM_THREADS
    CH = (V + NT - 1) // NT

    @T.prim_func
    def token_logprobs(var_logits: T.handle, var_token: T.handle, var_num_top: T.handle,
                       var_logprob: T.handle, var_top_ids: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int32()
        logits = T.match_buffer(var_logits, (b, V), "float32")
        token = T.match_buffer(var_token, (b,), "int32")
        num_top = T.match_buffer(var_num_top, (b,), "int32")
        logprob = T.match_buffer(var_logprob, (b, K + 1), "float32")
        top_ids = T.match_buffer(var_top_ids, (b, K), "int32")
        for r in T.parallel(b):
            # a row with num_top < 0 wants nothing: its outputs stay unwritten
            if num_top[r] >= 0:
                part = T.alloc_buffer((NT,), "float32")  # the GPU's lane sums
                mx = T.alloc_buffer((1,), "float32")
                si = T.alloc_buffer((2,), "int32")  # entries listed, slot of the newcomer
                n: T.let[T.int32] = T.min(num_top[r], K)
                # ---- one pass: row max and the sorted top-n list ----
                mx[0] = logits[r, 0]
                si[0] = 0
                for i in T.serial(V):
                    x: T.let[T.float32] = logits[r, i]
                    if x > mx[0]:
                        mx[0] = x
                    # entry j (0-based) sits at logprob[r, 1 + j] / top_ids[r, j]
                    if not T.isnan(x) and (si[0] < n or (n > 0 and x > logprob[r, n])):
                        si[1] = T.min(si[0], n - 1)  # a new slot, or the last one's
                        si[0] = T.min(si[0] + 1, n)
                        # (both sides of `and` may be evaluated: at slot 0 the read is
                        # logprob[r, 0], in bounds and then ignored)
                        while si[1] > 0 and x > logprob[r, si[1]]:
                            logprob[r, si[1] + 1] = logprob[r, si[1]]
                            top_ids[r, si[1]] = top_ids[r, si[1] - 1]
                            si[1] = si[1] - 1
                        logprob[r, si[1] + 1] = x
                        top_ids[r, si[1]] = i
                row_max: T.let[T.float32] = mx[0]
                # ---- log-sum-exp: strided lanes, then the halving tree ----
                for t in T.serial(NT):
                    part[t] = T.float32(0)
                for j in T.serial(CH):
                    for t in T.serial(T.min(NT, V - j * NT)):
                        part[t] = part[t] + T.exp(logits[r, j * NT + t] - row_max)
                for s in T.serial(NT.bit_length() - 1):
                    for t in T.serial(NT >> (s + 1)):
                        part[t] = part[t] + part[t + (NT >> (s + 1))]
                lse: T.let[T.float32] = row_max + T.log(T.max(part[0], T.float32(1e-30)))
                logprob[r, 0] = logits[r, T.min(T.max(token[r], 0), V - 1)] - lse
                for j in T.serial(n):
                    if j < si[0]:
                        logprob[r, j + 1] = logprob[r, j + 1] - lse
                    else:
                        logprob[r, j + 1] = T.float32(-3.0e38) - lse
                        top_ids[r, j] = INT_MAX

    return token_logprobs.with_attr("global_symbol", "token_logprobs")
