"""GPU token sampling as one hand-written TIR kernel (compiled to WGSL like every other kernel).

``sampling_prim_func(V)`` builds ``sample_token``: one workgroup of 256 threads per batch row.

    sample_token(logits: (b, V) f32|f16, temperature: (b,) f32, top_p: (b,) f32,
                 top_k: (b,) i32, min_p: (b,) f32, uniform: (b,) f32) -> token: (b,) i32

``b`` is symbolic, ``V`` fixed at build time. Per row ``r`` (all arithmetic in f32):

* ``temperature[r] <= 1e-5``: greedy, ``token = argmax(logits[r])`` (ties -> smallest index).
* otherwise ``e_i = exp((l_i - max l) / t)`` (so ``p_i = e_i / sum e``; never stored, recomputed
  on the fly from the logits) and the kept set is ``{i : e_i >= tau}``, ``tau = max(tau_k, tau_p)``:

  - ``tau_k`` (only when ``0 < top_k < V``) is the largest tau with ``count(e >= tau) >= top_k``,
    i.e. exactly the k-th largest value (ties keep every tied token);
  - ``tau_p`` (only when ``top_p < 1``) is the largest tau with ``sum(e >= tau) >= top_p * sum e``;
  - ``min_p`` itself (only when ``min_p > 0``): ``e_i >= min_p`` is ``p_i >= min_p * max p``,
    the min-p rule (as transformers' ``MinPLogitsWarper``, after temperature);

  both are found by bisection on the f32 *bit pattern* (for non-negative floats the int order is
  the float order), 30 steps over ``[0.0, 1.0]`` (``0x3F800000 < 2**30``), so the result is the
  exact float threshold, not an approximation. Then inverse CDF over the kept tokens in
  vocabulary order: the smallest ``i`` with ``cumsum_{j<=i, kept} e_j > uniform * kept_mass``.
  Each thread owns a contiguous chunk; the 256 chunk sums go to shared memory and every thread
  scans them in the same sequential order, so thread t's interval end is bit-identical to thread
  t+1's start: the intervals tile ``[0, kept_mass)`` exactly, one thread owns the target and walks
  its chunk (falling back to its last kept token if rounding runs it off the end).

Every barrier sits in workgroup-uniform control flow (WGSL uniformity rules): all loops around
barriers have fixed trip counts; data-dependent branches (greedy row, no filter on) only wrap
barrier-free data loops, so such rows skip the exp passes but still step through the 30
reductions. Index arithmetic is int32: ``b * V`` must stay below 2**31.

Calling it (Relax): ``relax.call_tir(gv, [logits, temperature, top_p, top_k, min_p, uniform],
out_ty=R.Tensor((b,), "int32"))`` or ``nn.op.tensor_ir_op(func, "sample_token", args=[...],
out=nn.Tensor.placeholder((b,), "int32"))``. After lowering, the WGSL kernel
``sample_token_kernel`` binds storage buffers in ITS order -- 0 logits (read), 1 temperature,
then the rest (min_p among them) -- then the uniform ``{b: i32, packGridDimX: u32}``; dispatch ``(b, 1, 1)`` workgroups of 256. (Read the order from
the host's ``call_ffi_kernel``, as the tests do, rather than trusting this comment.)

``sampling_prim_func_cpu(V)`` (at the end of this file) is the same function for LLVM CPU
targets: identical parameters and global symbol, the same rule and summation order, with the
thresholds found by bisection on the logits instead (see the comment there).

TVM 0.27 WebGPU codegen quirks met here: a let named like a WGSL keyword (``target``) is emitted
verbatim and rejected by naga; ``-inf`` prints as ``-inff`` (no WGSL literal); ThreadSync refuses
shared loads inside an ``if`` condition and a read-then-write of one shared buffer inside an
``if`` (hence the ping-pong buffers in the argmax tree).
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.tirx import PrimFunc

from .kernel_memo import built_once

NUM_THREADS = 256
GREEDY_EPS = 1e-5
# bisection steps on the bit pattern: hi - lo starts at 0x3F800001 - 0 < 2**30
BISECT_STEPS = 30
ONE_PLUS_BITS = 0x3F800001  # just above the bit pattern of 1.0f

PARAM_ORDER = ("logits", "temperature", "top_p", "top_k", "min_p", "uniform", "token")
LOG_NT = NUM_THREADS.bit_length() - 1
INT_MAX = 2147483647


@T.macro
def tree_sum(tx, red_f, red_i):
    """``red_f`` / ``red_i`` hold one partial per thread; afterwards ``[0]`` holds the totals."""
    for s in T.unroll(LOG_NT):
        T.tvm_storage_sync("shared")
        if tx < (NUM_THREADS >> (s + 1)):
            red_f[tx] = red_f[tx] + red_f[tx + (NUM_THREADS >> (s + 1))]
            red_i[tx] = red_i[tx] + red_i[tx + (NUM_THREADS >> (s + 1))]
    T.tvm_storage_sync("shared")


@T.macro
def argmax_step(tx, half, fsrc, isrc, fdst, idst):
    """One level of a (value, index) argmax tree; index INT_MAX marks an empty slot (threads
    past V when V < 256). Ties on value keep the smaller index, like numpy.argmax."""
    T.tvm_storage_sync("shared")
    if tx < half:
        take: T.let[T.bool] = isrc[tx + half] != INT_MAX and (
            isrc[tx] == INT_MAX
            or fsrc[tx + half] > fsrc[tx]
            or (fsrc[tx + half] == fsrc[tx] and isrc[tx + half] < isrc[tx])
        )
        idst[tx] = T.if_then_else(take, isrc[tx + half], isrc[tx])
        fdst[tx] = T.if_then_else(take, fsrc[tx + half], fsrc[tx])


@T.macro
def argmax_tree(tx, red_f, red_i, red_f2, red_i2):
    """The whole argmax over 256 slots, result in ``red_f[0]`` / ``red_i[0]``. Ping-pong
    between two buffer pairs: ThreadSync cannot put a barrier between a shared read and a
    dependent write of the same buffer inside an ``if``."""
    for h in T.unroll(LOG_NT // 2):
        argmax_step(tx, NUM_THREADS >> (2 * h + 1), red_f, red_i, red_f2, red_i2)
        argmax_step(tx, NUM_THREADS >> (2 * h + 2), red_f2, red_i2, red_f, red_i)
    T.tvm_storage_sync("shared")


@built_once
def sampling_prim_func(vocab_size: int, logits_dtype: str = "float32") -> PrimFunc:
    """The ``sample_token`` PrimFunc for a fixed vocabulary size (see the module docstring)."""
    if logits_dtype not in ("float32", "float16"):
        raise ValueError(f"logits_dtype must be float32 or float16, not {logits_dtype!r}")
    V = int(vocab_size)
    if V <= 0:
        raise ValueError("vocab_size must be positive")
    NT = NUM_THREADS
    CH = (V + NT - 1) // NT  # contiguous chunk per thread (final pass)
    # WGSL has no infinity literal (TVM would print `-inff`): start from the lowest finite-ish
    # value; the first element of each thread is taken unconditionally anyway.
    NEG_BIG = T.float32(-3.0e38)
    @T.prim_func(s_tir=True)
    def sample_token(
        var_logits: T.handle,
        var_temperature: T.handle,
        var_top_p: T.handle,
        var_top_k: T.handle,
        var_min_p: T.handle,
        var_uniform: T.handle,
        var_token: T.handle,
    ):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int32()
        logits = T.match_buffer(var_logits, (b, V), logits_dtype)
        temperature = T.match_buffer(var_temperature, (b,), "float32")
        top_p = T.match_buffer(var_top_p, (b,), "float32")
        top_k = T.match_buffer(var_top_k, (b,), "int32")
        min_p = T.match_buffer(var_min_p, (b,), "float32")
        uniform = T.match_buffer(var_uniform, (b,), "float32")
        token = T.match_buffer(var_token, (b,), "int32")

        red_f = T.sblock_alloc_buffer((NT,), "float32", scope="shared")
        red_i = T.sblock_alloc_buffer((NT,), "int32", scope="shared")
        red_f2 = T.sblock_alloc_buffer((NT,), "float32", scope="shared")
        red_i2 = T.sblock_alloc_buffer((NT,), "int32", scope="shared")
        res = T.sblock_alloc_buffer((1,), "int32", scope="shared")
        lf = T.sblock_alloc_buffer((4,), "float32", scope="local")  # max, sum/scratch, run, tau
        li = T.sblock_alloc_buffer((8,), "int32", scope="local")  # arg, lo_k, hi_k, lo_p, hi_p, cnt, tok, last

        for bx in T.thread_binding(b, thread="blockIdx.x"):
            for tx in T.thread_binding(NT, thread="threadIdx.x"):
                inv_t: T.let[T.float32] = T.float32(1.0) / T.max(
                    temperature[bx], T.float32(GREEDY_EPS)
                )
                # Branches on these only wrap barrier-free data loops (never a barrier), so
                # the kernel stays valid under WGSL's uniformity rules whatever they read.
                sampled: T.let[T.bool] = temperature[bx] > T.float32(GREEDY_EPS)
                k_on: T.let[T.bool] = top_k[bx] > 0 and top_k[bx] < V
                p_on: T.let[T.bool] = top_p[bx] < T.float32(1)
                # ---- pass 1: row max and argmax (strided: coalesced reads) ----
                lf[0] = NEG_BIG
                li[0] = INT_MAX
                for j in T.serial(CH):
                    if j * NT + tx < V:
                        x: T.let[T.float32] = T.Cast("float32", logits[bx, j * NT + tx])
                        if x > lf[0] or li[0] == INT_MAX:
                            lf[0] = x
                            li[0] = j * NT + tx
                red_f[tx] = lf[0]
                red_i[tx] = li[0]
                argmax_tree(tx, red_f, red_i, red_f2, red_i2)
                row_max: T.let[T.float32] = red_f[0]
                row_arg: T.let[T.int32] = red_i[0]
                T.tvm_storage_sync("shared")
                # ---- pass 2: sum of exp ----
                lf[1] = T.float32(0)
                if sampled:
                    for j in T.serial(CH):
                        if j * NT + tx < V:
                            lf[1] = lf[1] + T.exp(
                                (T.Cast("float32", logits[bx, j * NT + tx]) - row_max) * inv_t
                            )
                red_f[tx] = lf[1]
                red_i[tx] = 0
                tree_sum(tx, red_f, red_i)
                p_target: T.let[T.float32] = red_f[0] * top_p[bx]
                T.tvm_storage_sync("shared")
                # ---- bisection on bit patterns for tau_k and tau_p, together ----
                li[1] = 0
                li[2] = ONE_PLUS_BITS
                li[3] = 0
                li[4] = ONE_PLUS_BITS
                for _it in T.serial(BISECT_STEPS):
                    li[5] = 0
                    lf[1] = T.float32(0)
                    # the data loop (no barrier inside) is skipped when no filter is on
                    if sampled and (k_on or p_on):
                        for j in T.serial(CH):
                            if j * NT + tx < V:
                                e: T.let[T.float32] = T.exp(
                                    (T.Cast("float32", logits[bx, j * NT + tx]) - row_max)
                                    * inv_t
                                )
                                if e >= T.reinterpret("float32", T.shift_right(li[1] + li[2], 1)):
                                    li[5] = li[5] + 1
                                if e >= T.reinterpret("float32", T.shift_right(li[3] + li[4], 1)):
                                    lf[1] = lf[1] + e
                    red_f[tx] = lf[1]
                    red_i[tx] = li[5]
                    tree_sum(tx, red_f, red_i)
                    cnt_all: T.let[T.int32] = red_i[0]
                    mass_all: T.let[T.float32] = red_f[0]
                    if cnt_all >= top_k[bx]:
                        li[1] = T.shift_right(li[1] + li[2], 1)
                    else:
                        li[2] = T.shift_right(li[1] + li[2], 1)
                    if mass_all >= p_target:
                        li[3] = T.shift_right(li[3] + li[4], 1)
                    else:
                        li[4] = T.shift_right(li[3] + li[4], 1)
                    T.tvm_storage_sync("shared")
                # ---- final pass: kept mass per contiguous chunk, scan, owner walks ----
                lf[3] = T.max(
                    T.max(
                        T.if_then_else(k_on, T.reinterpret("float32", li[1]), T.float32(0)),
                        T.if_then_else(p_on, T.reinterpret("float32", li[3]), T.float32(0)),
                    ),
                    T.min(T.max(min_p[bx], T.float32(0)), T.float32(1)),
                )
                lf[1] = T.float32(0)
                if sampled:
                    for j in T.serial(CH):
                        if tx * CH + j < V:
                            e2: T.let[T.float32] = T.exp(
                                (T.Cast("float32", logits[bx, tx * CH + j]) - row_max) * inv_t
                            )
                            if e2 >= lf[3]:
                                lf[1] = lf[1] + e2
                red_f[tx] = lf[1]
                if tx == 0:
                    res[0] = row_arg
                T.tvm_storage_sync("shared")
                # every thread runs the same sequential scan over the chunk sums, so thread t's
                # interval end is bit-identical to thread t+1's start: the intervals tile
                # [0, kept_total) exactly and exactly one thread owns u_target.
                # (let names avoid WGSL reserved words: TVM emits them verbatim, and
                # `target`/`end`... are reserved.)
                lf[2] = T.float32(0)
                for t in T.serial(NT):
                    chunk_sum: T.let[T.float32] = red_f[t]
                    if t == tx:
                        lf[0] = lf[2]
                    lf[2] = lf[2] + chunk_sum
                    if t == tx:
                        lf[1] = lf[2]
                kept_total: T.let[T.float32] = lf[2]
                iv_start: T.let[T.float32] = lf[0]
                iv_end: T.let[T.float32] = lf[1]
                u_target: T.let[T.float32] = T.max(uniform[bx], T.float32(0)) * kept_total
                if (
                    iv_start <= u_target
                    and iv_start < iv_end
                    and (u_target < iv_end or iv_end >= kept_total)
                ):
                    lf[2] = iv_start
                    li[6] = -1
                    li[7] = row_arg
                    for j in T.serial(CH):
                        if tx * CH + j < V:
                            e3: T.let[T.float32] = T.exp(
                                (T.Cast("float32", logits[bx, tx * CH + j]) - row_max) * inv_t
                            )
                            if e3 >= lf[3]:
                                lf[2] = lf[2] + e3
                                li[7] = tx * CH + j
                                if lf[2] > u_target and li[6] < 0:
                                    li[6] = tx * CH + j
                    res[0] = T.if_then_else(li[6] >= 0, li[6], li[7])
                T.tvm_storage_sync("shared")
                if tx == 0:
                    token[bx] = T.if_then_else(sampled, res[0], row_arg)

    return sample_token.with_attr("global_symbol", "sample_token")


# ============================================================================================
# CPU twin
# ============================================================================================
# wick's native CPU backend swaps ``sample_token`` for this function inside an already built
# Relax module, by name, so the parameters (names, shapes, the symbolic ``b``, dtypes) and the
# global symbol are the GPU kernel's. The rule it implements is the GPU kernel's, term for term
# (see the module docstring); what changes is how the two thresholds are found.
#
# The GPU bisects on the bit pattern of ``e`` and recomputes ``exp`` over the whole row in each
# of its 30 steps. Here the bisection runs on the *logits* instead, through an order-preserving
# int32 key of their f32 bit pattern (``_order_key``): ``e_i = exp((l_i - max) * inv_t)`` is a
# non-decreasing function of ``l_i`` (an f32 subtraction, a product with a positive constant and
# ``expf`` are all monotone), so
#
# * the k-th largest ``e`` (``tau_k``) is ``e`` of the k-th largest logit: the count passes need
#   no ``exp`` at all;
# * ``tau_p`` is ``e`` of the largest logit ``L`` whose kept mass ``sum(e_i : key_i >= key(L))``
#   reaches ``top_p * sum e``. Among tokens of equal ``e`` the one with the smallest key makes
#   ``{key_i >= key}`` the very set ``{e_i >= e}`` the GPU sums, so the masses compared are the
#   GPU's masses; and ``exp`` is only evaluated for tokens above the candidate logit.
#
# Every f32 sum is taken in the GPU kernel's order: the row's sum of ``e`` and the bisection
# masses as 256 strided lanes then the same halving tree, the final inverse CDF as 256 contiguous
# chunks, scanned sequentially, and a walk of the owning chunk. With the same ``e`` values the
# token is therefore the GPU's bit for bit; ``expf`` here and the GPU's ``exp`` may differ in the
# last ulp, which can only move a token whose threshold or CDF boundary is that close (a genuine
# near-tie). NaN logits are undefined in both kernels.
#
# Scratch per row: 256 floats (the lane / chunk sums) and the largest key of each block of 256
# tokens (V / 64 bytes), which lets a pass skip the blocks that cannot contribute.

INT32_MIN = -2147483648


def _order_key(x):
    """int32 key of an f32 with ``key(a) < key(b)`` iff ``a < b`` (-0.0 just below +0.0):
    non-negative floats keep their bit pattern, negative ones flip their magnitude bits. The
    same map turns a key back into the float's bits (it is its own inverse)."""
    bits = T.reinterpret("int32", x)
    return T.if_then_else(bits >= 0, bits, T.bitwise_xor(bits, 0x7FFFFFFF))


def _key_float(key):
    return T.reinterpret("float32", T.if_then_else(key >= 0, key, T.bitwise_xor(key, 0x7FFFFFFF)))


@built_once
def sampling_prim_func_cpu(vocab_size: int, logits_dtype: str = "float32") -> PrimFunc:
    """``sample_token`` for LLVM CPU targets: the GPU kernel's parameters and rule (see above).

    Rows run in parallel on TVM's thread pool; each row is a few serial passes over its logits,
    never a copy of the row."""
    if logits_dtype not in ("float32", "float16"):
        raise ValueError(f"logits_dtype must be float32 or float16, not {logits_dtype!r}")
    V = int(vocab_size)
    if V <= 0:
        raise ValueError("vocab_size must be positive")
    NT = NUM_THREADS  # the GPU's workgroup: its lanes and chunks fix the summation order
    CH = (V + NT - 1) // NT  # blocks of NT tokens (lane j-th terms) = tokens per chunk

    @T.macro
    def lane_mass(part, bmax, logits, r, row_max, inv_t, key_lo):
        """sum of e_i over the tokens with key >= key_lo, into part[0]: GPU thread t sums tokens
        t, t + 256, ... in order (block j holds each thread's j-th term), then the 256 partials
        meet in its halving tree. A block whose largest key is below key_lo adds nothing."""
        for t in T.serial(NT):
            part[t] = T.float32(0)
        for j in T.serial(CH):
            if bmax[j] >= key_lo:
                for t in T.serial(T.min(NT, V - j * NT)):
                    x: T.let[T.float32] = T.Cast("float32", logits[r, j * NT + t])
                    if _order_key(x) >= key_lo:
                        part[t] = part[t] + T.exp((x - row_max) * inv_t)
        for s in T.serial(LOG_NT):
            for t in T.serial(NT >> (s + 1)):
                part[t] = part[t] + part[t + (NT >> (s + 1))]

    @T.prim_func
    def sample_token(
        var_logits: T.handle,
        var_temperature: T.handle,
        var_top_p: T.handle,
        var_top_k: T.handle,
        var_min_p: T.handle,
        var_uniform: T.handle,
        var_token: T.handle,
    ):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        b = T.int32()
        logits = T.match_buffer(var_logits, (b, V), logits_dtype)
        temperature = T.match_buffer(var_temperature, (b,), "float32")
        top_p = T.match_buffer(var_top_p, (b,), "float32")
        top_k = T.match_buffer(var_top_k, (b,), "int32")
        min_p = T.match_buffer(var_min_p, (b,), "float32")
        uniform = T.match_buffer(var_uniform, (b,), "float32")
        token = T.match_buffer(var_token, (b,), "int32")

        for r in T.parallel(b):
            part = T.alloc_buffer((NT,), "float32")  # lane sums, then chunk sums
            bmax = T.alloc_buffer((CH,), "int32")  # largest key of each block of NT tokens
            # f32 state: 0 tau_k, 1 tau_p, 2 tau, 3 running sum, 4 chunk start, 5 walk sum
            sf = T.alloc_buffer((6,), "float32")
            # i32 state: 0 argmax, 1 k-th key, 2 max key / count, 3 search on, 4 owner chunk,
            # 5 first token past the target, 6 last kept token, 7 the token
            si = T.alloc_buffer((8,), "int32")
            bis = T.alloc_buffer((2,), "int64")  # bisection on keys: lo holds, hi fails
            inv_t: T.let[T.float32] = T.float32(1.0) / T.max(temperature[r], T.float32(GREEDY_EPS))
            sampled: T.let[T.bool] = temperature[r] > T.float32(GREEDY_EPS)
            k_on: T.let[T.bool] = top_k[r] > 0 and top_k[r] < V
            p_on: T.let[T.bool] = top_p[r] < T.float32(1)
            # ---- pass 1: the largest key of each block (a branch-free reduction) ----
            si[2] = INT32_MIN
            for j in T.serial(CH):
                bmax[j] = INT32_MIN
                for t in T.serial(T.min(NT, V - j * NT)):
                    bmax[j] = T.max(bmax[j], _order_key(T.Cast("float32", logits[r, j * NT + t])))
                si[2] = T.max(si[2], bmax[j])
            # the row max, and its first index (numpy's tie rule, as the GPU's argmax tree;
            # -0.0 == +0.0 here as there). Only a NaN row finds none: index 0.
            row_max: T.let[T.float32] = _key_float(si[2])
            si[0] = -1
            for j in T.serial(CH):
                if si[0] < 0 and _key_float(bmax[j]) == row_max:
                    for t in T.serial(T.min(NT, V - j * NT)):
                        if si[0] < 0 and T.Cast("float32", logits[r, j * NT + t]) == row_max:
                            si[0] = j * NT + t
            row_arg: T.let[T.int32] = T.max(si[0], 0)
            si[7] = row_arg
            if sampled:
                # ---- tau_k = e of the k-th largest logit: bisection on keys, counts only ----
                sf[0] = T.float32(0)
                if k_on:
                    bis[0] = T.int64(INT32_MIN)  # every token has a key >= this: V >= k
                    bis[1] = T.int64(-INT32_MIN)  # none has a key this large: 0 < k
                    while bis[1] - bis[0] > T.int64(1):
                        mid_k: T.let[T.int32] = T.Cast("int32", bis[0] + (bis[1] - bis[0]) // 2)
                        si[2] = 0
                        for j in T.serial(CH):
                            if bmax[j] >= mid_k:
                                for t in T.serial(T.min(NT, V - j * NT)):  # branch-free
                                    si[2] = si[2] + T.Cast("int32", _order_key(
                                        T.Cast("float32", logits[r, j * NT + t])) >= mid_k)
                        if si[2] >= top_k[r]:
                            bis[0] = T.Cast("int64", mid_k)
                        else:
                            bis[1] = T.Cast("int64", mid_k)
                    si[1] = T.Cast("int32", bis[0])
                    sf[0] = T.exp((_key_float(si[1]) - row_max) * inv_t)
                # ---- tau_p = e of the largest logit whose kept mass reaches the target ----
                if p_on:
                    # the row's sum of e, in the GPU's order (only top-p needs it)
                    lane_mass(part, bmax, logits, r, row_max, inv_t, INT32_MIN)
                    total: T.let[T.float32] = part[0]
                    p_target: T.let[T.float32] = total * top_p[r]
                    # The search starts from a key whose kept mass (summed as the GPU does)
                    # reaches the target: the lowest key (all of the mass) always does.
                    bis[0] = T.int64(INT32_MIN)
                    bis[1] = T.int64(-INT32_MIN)
                    si[3] = 1
                    # a target <= 0 (top_p <= 0) holds everywhere: the GPU's search ends at the
                    # top of its range, 1.0
                    sf[1] = T.float32(1)
                    if not (p_target > T.float32(0)):
                        si[3] = 0
                    # with top-k on, a tau_p below tau_k changes nothing: start at the k-th key,
                    # or skip the search when even the top-k set misses the target
                    if k_on and si[3] == 1:
                        lane_mass(part, bmax, logits, r, row_max, inv_t, si[1])
                        if part[0] >= p_target:
                            bis[0] = T.Cast("int64", si[1])
                        else:
                            si[3] = 0
                            sf[1] = T.float32(0)
                    # tokens with e < tau0 = (total - target) / (2V) hold at most half of the
                    # mass top-p may drop, so (rounding aside) the key of ~tau0 holds too: once
                    # checked, starting there spares the long tail's exp in the first steps
                    key0: T.let[T.int32] = _order_key(
                        row_max + T.log((total - p_target) / T.float32(2 * V)) / inv_t)
                    if si[3] == 1 and total > p_target and T.Cast("int64", key0) > bis[0]:
                        lane_mass(part, bmax, logits, r, row_max, inv_t, key0)
                        if part[0] >= p_target:
                            bis[0] = T.Cast("int64", key0)
                    if si[3] == 1:
                        while bis[1] - bis[0] > T.int64(1):
                            mid_p: T.let[T.int32] = T.Cast(
                                "int32", bis[0] + (bis[1] - bis[0]) // 2)
                            lane_mass(part, bmax, logits, r, row_max, inv_t, mid_p)
                            if part[0] >= p_target:
                                bis[0] = T.Cast("int64", mid_p)
                            else:
                                bis[1] = T.Cast("int64", mid_p)
                        sf[1] = T.exp((_key_float(T.Cast("int32", bis[0])) - row_max) * inv_t)
                sf[2] = T.max(
                    T.max(T.if_then_else(k_on, sf[0], T.float32(0)),
                          T.if_then_else(p_on, sf[1], T.float32(0))),
                    T.min(T.max(min_p[r], T.float32(0)), T.float32(1)),
                )
                tau: T.let[T.float32] = sf[2]
                # exp is skipped where z < log(tau) - 1 (then e < 0.37 tau: not kept, however
                # expf rounds); never when tau is ~0, where even e = 0 tokens are kept.
                prune: T.let[T.bool] = tau >= T.float32(1e-30)
                z_floor: T.let[T.float32] = T.log(T.max(tau, T.float32(1e-30))) - T.float32(1)
                # ---- kept mass of 256 contiguous chunks of CH tokens (the GPU's threads) ----
                for c in T.serial(NT):
                    part[c] = T.float32(0)
                    for j in T.serial(T.max(T.min(CH, V - c * CH), 0)):
                        z2: T.let[T.float32] = (
                            T.Cast("float32", logits[r, c * CH + j]) - row_max) * inv_t
                        if not prune or z2 >= z_floor:
                            e2: T.let[T.float32] = T.exp(z2)
                            if e2 >= tau:
                                part[c] = part[c] + e2
                # ---- the GPU's sequential scan: chunk c owns [start_c, start_c + part[c]) ----
                sf[3] = T.float32(0)
                for c in T.serial(NT):
                    sf[3] = sf[3] + part[c]
                kept_total: T.let[T.float32] = sf[3]
                u_target: T.let[T.float32] = T.max(uniform[r], T.float32(0)) * kept_total
                sf[3] = T.float32(0)
                si[4] = -1
                for c in T.serial(NT):
                    sf[4] = sf[3]
                    sf[3] = sf[3] + part[c]
                    if (si[4] < 0 and sf[4] <= u_target and sf[4] < sf[3]
                            and (u_target < sf[3] or sf[3] >= kept_total)):
                        si[4] = c
                        sf[5] = sf[4]
                # ---- the owner walks its chunk: first cumsum > target, else its last kept ----
                if si[4] >= 0:
                    si[5] = -1
                    si[6] = row_arg
                    for j in T.serial(T.min(CH, V - si[4] * CH)):
                        z3: T.let[T.float32] = (
                            T.Cast("float32", logits[r, si[4] * CH + j]) - row_max) * inv_t
                        if not prune or z3 >= z_floor:
                            e3: T.let[T.float32] = T.exp(z3)
                            if e3 >= tau:
                                sf[5] = sf[5] + e3
                                si[6] = si[4] * CH + j
                                if sf[5] > u_target and si[5] < 0:
                                    si[5] = si[4] * CH + j
                    si[7] = T.if_then_else(si[5] >= 0, si[5], si[6])
            token[r] = si[7]

    return sample_token.with_attr("global_symbol", "sample_token")
