"""wick's CPU schedules: how each kind of TIR function runs on a multi-core CPU.

TVM's own CPU rules (``dlight.cpu``) measured 0.2-2 GB/s on this project's machines, and its
default pipeline emits single-threaded scalar loops that also materialize every intermediate
(a dequantized weight matrix per call). So the rules are wick's own, in this one module:

1. **Inline** every elementwise producer into its consumer (dequantization into the matmul,
   casts into norms) and every elementwise epilogue into its producer (a residual add into the
   matmul's output loop), so no intermediate the size of a weight exists.
2. **Matmul-like reductions** (``out[i, j] = sum_k x[i, k] * w[j, k]``, any dequantization
   inlined) split ``k`` into chunks of 16 whose partial sums live in a vector register
   (``rfactor``): the inner loop loads 16 inputs, dequantizes 16 weights and does one vector
   multiply-add. Output columns ``j`` run in parallel, all rows ``i`` of a column
   together (a weight row is read from memory once per step, whatever the batch).
3. **Everything else**: the outermost spatial loops of each remaining block fused and run in
   parallel when there is enough work to share (a one-token norm is not); TVM's plain loops
   inside.

A function marked ``tirx.is_scheduled`` (the hand-written CPU twins of attention and sampling)
is left as it is, and the float32 q4 and q8 matmuls (alone, or adding a bias and/or a residual) are
replaced by the kernel written for them in compiler/cpu_gemv.py, the float32 matmuls of plain
weights by compiler/cpu_gemm.py's (tiles of rows x columns: rule 2 for a batch does one
output at a time).
"""

from __future__ import annotations

import threading

import tvm
from tvm import tirx

# partial sums per output: 16 f32 lanes, one AVX-512 register (two AVX2 ones). 32 or 64 (more
# independent multiply-add chains) measured 3-6x slower: the sums left registers for memory.
LANE_CHOICES = (16,)
PARALLEL_MIN_WORK = 1 << 14  # loop iterations below which elementwise work stays serial
# A function attribute: its calls run many rows (an encoder's forward; no decode step reuses
# its matmuls, whose sums must then agree with it), so its float32 matmuls take
# cpu_gemm.f32_matmul_rows_in_lanes.
WIDE_BATCHES = "wick.wide_batches"


# Scheduling parses TVMScript (hand-written kernels are built from Python source), and CPython
# 3.11's ast.parse is not thread-safe: two kernel sets scheduled at once on the compile's two
# threads failed with "SystemError: AST constructor recursion depth mismatch" (a clean-clone
# run of stop 40). Scheduling takes turns; LLVM's build, the long part, still runs on both.
_SCHEDULING = threading.Lock()


def build_scheduled(functions: dict[str, tirx.PrimFunc], target):
    """Every function scheduled for ``target`` (native CPU or wasm32) and compiled by LLVM into
    one module, each exported under its name."""
    funcs = {}
    with _SCHEDULING:
        for name, f in functions.items():
            # (a rule may return a new function: name it after scheduling)
            funcs[tvm.ir.GlobalVar(name)] = schedule(f, target).with_attr("global_symbol", name)
    return tvm.tirx.build(tvm.IRModule(funcs), target=target)


def schedule(func: tirx.PrimFunc, target) -> tirx.PrimFunc:
    """``func`` scheduled for ``target`` (an LLVM CPU target)."""
    if func.attrs is not None and func.attrs.get("tirx.is_scheduled"):
        return func
    from tvm import s_tir

    from .cpu_gemm import f32_matmul_prim_func, f32_matmul_rows_in_lanes, match_f32_matmul
    from .cpu_gemv import (expert_matmul_prim_func, match_expert_matmul, match_q4_matmul,
                           q4_matmul_prim_func)

    isa = vector_isa(target)
    q4 = match_q4_matmul(func)
    if q4 is not None:  # the float32 q4/q8 matmul: a kernel written for it (cpu_gemv.py)
        return q4_matmul_prim_func(**q4, isa=isa)
    experts = match_expert_matmul(func)
    if experts is not None:  # ... and a mixture-of-experts step's gathered one, of its pieces
        return expert_matmul_prim_func(**experts, isa=isa)
    f32 = match_f32_matmul(func)
    if f32 is not None:  # the float32 matmul of plain weights: another (cpu_gemm.py)
        if func.attrs is not None and func.attrs.get(WIDE_BATCHES):
            return f32_matmul_rows_in_lanes(**f32, isa=isa)
        return f32_matmul_prim_func(**f32, isa=isa)

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    _inline_elementwise(sch)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if not _schedule_matmul(sch, block):
            _parallel_outer(sch, block)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def vector_isa(target) -> str:
    """"wasm", "avx512" or "avx2": the register budget the hand-written kernels' tiles are
    sized for (a CPU without AVX-512 has 16 vector registers, as AVX2 has; ARM's NEON 32 of a
    quarter of AVX-512's width; an x86 CPU without AVX2 would spill the AVX2 tile's 8-lane
    sums into its 16 SSE registers, slower but correct). Read from the target's CPU, as LLVM
    reads it to emit the code."""
    if "wasm" in str(target.attrs.get("mtriple", "")):
        return "wasm"
    from tvm.target import codegen

    return "avx512" if codegen.target_has_features("avx512f", target) else "avx2"


def _iter_types(sch, block) -> list[str]:
    """"S"/"R"/other per block iteration variable."""
    kinds = {0: "S", 2: "R"}  # IterVar.DataPar, IterVar.CommReduce
    return [kinds.get(int(iv.iter_type), "O") for iv in sch.get(block).iter_vars]


def _inline_elementwise(sch) -> None:
    """Inline producers into consumers, then epilogues into producers, until nothing moves.
    """
    changed = True
    while changed:
        changed = False
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
        for block in blocks:
            if sch.get(block).name_hint in outputs or "R" in _iter_types(sch, block):
                continue
            try:
                sch.compute_inline(block)
                changed = True
                break
            except Exception:
                pass
        if changed:
            continue
        for block in reversed(sch.get_child_blocks(sch.get_sblock("root"))):
            if "R" in _iter_types(sch, block):
                continue
            try:
                sch.reverse_compute_inline(block)
                changed = True
                break
            except Exception:
                pass


def _schedule_matmul(sch, block) -> bool:
    """Rule 2 for a block with spatial loops (.., i, j) and one innermost reduction loop k
    of static extent divisible by LANES; False (nothing changed) for any other block."""
    types = _iter_types(sch, block)
    if types.count("R") != 1 or types[-1] != "R" or len(types) < 2:
        return False
    loops = sch.get_loops(block)
    if len(loops) != len(types):
        return False
    k = loops[-1]
    extent = sch.get(k).extent
    if not isinstance(extent, tirx.IntImm):
        return False
    lanes = next((n for n in LANE_CHOICES if int(extent) % n == 0 and int(extent) >= 2 * n), 0)
    if not lanes:
        return False
    # the output column j (the last spatial loop) outermost and parallel; rows i inside it
    *outer, j = loops[:-1]
    sch.reorder(j, *outer)
    ko, ki = sch.split(k, [None, lanes])
    rf = sch.rfactor(ki, 0)  # partial sums per lane: rf[lane, i.., j], loops j, i.., ko, ki
    # the final sum of one output right after its partial sums (so they stay in registers)
    sch.reverse_compute_at(block, sch.get_loops(rf)[-3])
    chunk, lane = sch.get_loops(rf)[-2:]
    sch.vectorize(lane)
    sch.parallel(sch.get_loops(rf)[0])
    # zero the 16 sums before the chunk loop (last: TVM checks parallel and vectorized
    # loops for reduction blocks with an init)
    sch.decompose_reduction(rf, chunk)
    return True


def _static_work(sch, loops) -> int:
    """The product of the loops' extents, a symbolic extent (the batch, the step's tokens)
    counting as 1: the work the loops do in a one-token decode step."""
    work = 1
    for loop in loops:
        extent = sch.get(loop).extent
        work *= int(extent) if isinstance(extent, tirx.IntImm) else 1
    return work


def _parallel_outer(sch, block) -> None:
    """Rule 3: fuse the block's leading spatial loops and run them in parallel, unless a
    decode step gives them less than PARALLEL_MIN_WORK elements (waking the thread pool
    costs more than a norm or an activation over one token's vector)."""
    types = _iter_types(sch, block)
    loops = sch.get_loops(block)
    if len(loops) != len(types) or _static_work(sch, loops) < PARALLEL_MIN_WORK:
        return
    spatial = []
    for loop, t in zip(loops, types):
        if t != "S":
            break
        spatial.append(loop)
    if not spatial:
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    sch.parallel(fused)
