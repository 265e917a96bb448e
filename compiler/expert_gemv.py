"""The GPU kernel sets' dlight rules for a mixture-of-experts step (compiler/models/moe.py),
first in compiler/tir_lower.schedule_rules.

``ExpertGEMV``: the expert matmul (compiler/models/layers.py ``ExpertLinears``),
``y[r, s, j] = sum_k x[r, (s,) k] * W[experts[r, s], j, k]``, W dequantized inside. dlight has
no rule for a matmul whose weight is picked by an index read at run time: its rules assert on
the read (its region spans every expert) instead of declining. Here each (token, slot) row is a
GEMV of its expert: a workgroup computes ``outputs`` outputs of one row (one per threadIdx.y),
each by a warp whose ``lanes`` lanes split the reduction (the weight read in the lanes' order,
coalesced) and meet in a cross-thread sum; the elementwise blocks after it (a cast, an
activation FuseOps joined to it) run on the sum where it is. Each output's sum runs in one
order whatever the step's rows, so batches keep a sequence's tokens.

``RouterKernels``: the router's small kernels. ``Declining``: a dlight rule that declines
where it would assert.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl


class ExpertGEMV(dl.ScheduleRule):
    """A dlight rule for functions with an expert matmul; None (declined) for the others."""

    def __init__(self, outputs: int = 4, lanes: int = 32) -> None:
        self.outputs, self.lanes = outputs, lanes

    def apply(self, func: tirx.PrimFunc, target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = s_tir.Schedule(func)
        mm = _expert_matmul(sch)
        if mm is None:
            return None
        for block in sch.get_producers(mm):  # (dequantization, an activation of the input)
            _inline_all(sch, block)
        epilogue = []
        cur = mm
        while len(consumers := sch.get_consumers(cur)) == 1:
            epilogue.append(consumers[0])
            cur = consumers[0]
        if consumers:  # (a result read by two blocks: not this schedule's form)
            return None
        if any(any(int(iv.iter_type) != 0 for iv in sch.get(b).iter_vars) for b in epilogue):
            return None  # (a reduction after the sum would race across the rows' workgroups)
        r, s, j, k = sch.get_loops(mm)
        extent_j, extent_k = (sch.get(loop).extent for loop in (j, k))
        if not (isinstance(extent_j, tirx.IntImm) and isinstance(extent_k, tirx.IntImm)):
            return None
        outputs = self.outputs if extent_j.value % self.outputs == 0 else 1
        lanes = self.lanes
        while extent_k.value % lanes:
            lanes //= 2
        row = sch.fuse(r, s)
        bx, ty = sch.split(j, [None, outputs])
        ko, tx = sch.split(k, [None, lanes])
        sch.reorder(row, bx, ty, ko, tx)
        rf = sch.rfactor(tx, factor_axis=0)  # each lane's partial sum; mm adds the lanes'
        row, bx, ty, ko, tx = sch.get_loops(rf)
        sch.reorder(row, bx, ty, tx, ko)
        # (the rows, n x top_k of them, on x: the engine splits an x extent past the grid's
        # 65535 into y (engine/plan.py); the outputs' workgroups, a few hundred, on y)
        sch.bind(row, "blockIdx.x")
        sch.bind(bx, "blockIdx.y")
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.set_scope(rf, 0, "local")
        sch.decompose_reduction(rf, ko)
        sch.reverse_compute_at(mm, ty, preserve_unit_loops=True)
        lane, *units = sch.get_loops(mm)[3:]
        sch.reorder(*units, lane)  # (a cross-thread sum's loop must be the innermost)
        sch.bind(lane, "threadIdx.x")  # the lanes' sum: a cross-thread one
        if epilogue:  # one block (the others inlined into it) on the sum in registers
            for block in epilogue[:-1]:
                sch.compute_inline(block)
            sch.set_scope(mm, 0, "local")
            sch.reverse_compute_at(epilogue[-1], ty, preserve_unit_loops=True)
        return sch


class RouterKernels(dl.ScheduleRule):
    """The router's small kernels (compiler/models/moe.py ``ROUTER_BLOCKS``: ranks, each slot's
    expert and weight; a few dozen operations a token): a thread per output, its reduction
    in order. (dlight's reduction rules assert on the ranking, whose block compares a token's
    scores with each other, and its Fallback's cross-thread sums find no reducer in a sum of
    selected expert numbers.)"""

    def __init__(self, threads: int = 64) -> None:
        self.threads = threads

    def apply(self, func: tirx.PrimFunc, target, tunable: bool):
        from .models.moe import ROUTER_BLOCKS

        if not isinstance(func, tirx.PrimFunc):
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if not any(sch.get(b).name_hint in ROUTER_BLOCKS for b in blocks):
            return None
        for block in blocks:
            kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
            loops = sch.get_loops(block)
            spatial = loops[:next((i for i, kind in enumerate(kinds) if kind != 0), len(kinds))]
            if not spatial:
                return None
            _, tx = sch.split(sch.fuse(*spatial), [None, self.threads])
            sch.bind(sch.get_loops(block)[0], "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
        return sch


class Declining(dl.ScheduleRule):
    """``rule``, declining (None) where it asserts: dlight's GEMV and reduction rules assert
    that a block reads one element of each buffer an iteration, which a block reading through
    an index need not (the rules after them schedule such a function, or these rules' own)."""

    def __init__(self, rule: dl.ScheduleRule) -> None:
        self.rule = rule

    def apply(self, func: tirx.PrimFunc, target, tunable: bool):
        try:
            return self.rule.apply(func, target, tunable)
        except AssertionError:
            return None


def _expert_matmul(sch: s_tir.Schedule):
    """The function's ``matmul`` block of loops (row, slot, output, k) that reads a weight
    at an index read from a buffer (the expert), or None."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        if stmt.name_hint == "matmul" and len(stmt.iter_vars) == 4 and any(
                _loaded(rng.min) for region in stmt.reads for rng in region.region):
            return block
    return None


def _loaded(index) -> bool:
    """Whether ``index`` holds a value read from a buffer (cast, clamped or not). (By type
    name, as compiler/batched_gemv.py reads TIR: this TVM's expression constructors are
    functions.)"""
    if type(index).__name__ in ("BufferLoad", "TensorLoad"):
        return True
    return any(_loaded(getattr(index, part)) for part in ("a", "b", "value")
               if hasattr(index, part))


def _inline_all(sch: s_tir.Schedule, block) -> None:
    """``block`` and its own producers inlined into their consumers."""
    for producer in sch.get_producers(block):
        _inline_all(sch, producer)
    sch.compute_inline(block)
