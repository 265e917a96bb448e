"""A batched dequantize-GEMV schedule for the GPU kernel sets' decode plans: a step of a few rows
(a batch of sequences, or one sequence's verify rows) reads each weight once.

dlight's LowBatchGEMV pads the rows to a bucket and gives each bucket of rows its own pass over
the weights: on an H200 a step of 8 rows costs 2.1x a step of 4, 16 rows 4.2x
(bench/gpu_gemv.py). Here each warp owns ``outputs`` output columns; its 32 lanes split the
reduction (``pack`` weights, one packed word, per lane per step; fewer lanes where the words
do not split 32 ways), dequantize their words into
registers once per step and apply them to a tile of ``rows`` rows whose inputs are in
registers too (one 16-byte load per row); the lanes' partial sums then meet in a warp
reduction (shuffles: CUDA), or in workgroup memory (WebGPU, whose subgroups are an optional
feature: TVM lowers a reduction over threads there to a tree of 7 barriers per sum, 224 per tile
of 8 rows x 4 outputs; stored once and summed by one lane per sum, a tile takes 2).
Rows past the tile take another pass over the weights.

Each row's sum runs in the same order whatever ``rows`` is and however many rows the step has
(per lane in k order, then the warp's fixed reduction tree or lane order), so one sequence's
logits are the same alone and in a batch, and a one-row plan may use ``rows=1``.
"""

from __future__ import annotations

import logging

from tvm import DataType, s_tir, tirx

log = logging.getLogger("wick")

# Rows of a decode step that one pass over the weights serves. A row's sum does not depend on
# it, so decode and decode1 agree bit for bit.
DECODE_GEMV_ROWS = {"decode": 8, "decode1": 1}


def decode_gemvs(funcs: dict, schedule: str, **options) -> dict:
    """A plan's functions with its dequantize-GEMVs scheduled here when it is a decode plan
    (``options``: ``schedule_batched_gemv``'s), the others as they are (dlight's then)."""
    rows = DECODE_GEMV_ROWS.get(schedule)
    if rows is None:
        return funcs
    return {gv: batched_gemv(f, rows, **options) for gv, f in funcs.items()}


def batched_gemv(func: tirx.PrimFunc, rows: int, **options) -> tirx.PrimFunc:
    """``func`` scheduled here when it is a dequantize-GEMV this schedule takes, else as it is."""
    if func.attrs is not None and func.attrs.get("tirx.is_scheduled"):
        return func
    try:
        return schedule_batched_gemv(func, rows=rows, **options) or func
    except (RuntimeError, ValueError) as e:  # (TVM's errors: a form it does not foresee)
        log.debug("batched_gemv left %s to dlight: %s", func.attrs.get("global_symbol"),
                  str(e).splitlines()[-1])
        return func


def schedule_batched_gemv(func: tirx.PrimFunc, rows: int = 8, outputs: int = 4,
                          warps: int = 4, lanes: int = 32,
                          vector_loads: bool = True,
                          reduction: str = "warp") -> tirx.PrimFunc | None:
    """``func`` (a dequantize block, a matmul of [b, K] rows by the [N, K] weights, then
    elementwise blocks) scheduled as above; None when it has another form. ``vector_loads``:
    each row's inputs of a step in one load (CUDA; WGSL has no 8-lane vectors). ``reduction``:
    "warp" (a reduction over threadIdx.x) or "shared" (workgroup memory, summed in lane order:
    ``warps x lanes x rows x outputs`` floats of it, 8 KiB for 2 x 32 x 8 x 4)."""
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(root)}
    deq = next((b for n, b in blocks.items() if n.startswith("dequantize")), None)
    mm = next((b for n, b in blocks.items() if n.startswith("matmul")), None)
    if deq is None or mm is None or len(sch.get_loops(mm)) != 3:
        return None
    pack = _weights_per_word(sch.get(deq))
    _, j, k = (sch.get(loop).extent for loop in sch.get_loops(mm))
    if pack is None or not (isinstance(j, tirx.IntImm) and isinstance(k, tirx.IntImm)):
        return None
    if j.value % (warps * outputs) or k.value % pack:
        return None
    while (k.value // pack) % lanes:  # (lanes that split the words evenly: 8 for K = 576)
        lanes //= 2
    # rows padded to the tile (zeros in, nothing out), then the blocks after the matmul folded
    # into the last one, the epilogue
    sch.pad_einsum(mm, [rows, 1, 1])
    epilogue = None
    cur = mm
    while len(consumers := sch.get_consumers(cur)) == 1:
        if epilogue is not None:
            sch.compute_inline(epilogue)
        epilogue = cur = consumers[0]
    if len(consumers) > 1:  # (a result read by two blocks: not this schedule's form)
        return None
    if epilogue is None:  # (the matmul writes the output itself, f32 models: sums in registers)
        epilogue = sch.cache_write(mm, 0, "local")

    i, j, k = sch.get_loops(mm)
    io, ii = sch.split(i, [None, rows])
    bx, ty, jn = sch.split(j, [None, warps, outputs])
    ko, tx, kv = sch.split(k, [None, lanes, pack])
    sch.reorder(bx, ty, io, tx, ko, jn, ii, kv)
    rf = sch.rfactor(tx, factor_axis=0)  # per-lane partial sums; mm adds the lanes' up
    bx, ty, io, tx, ko, jn, ii, kv = sch.get_loops(rf)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.reverse_compute_at(mm, io, preserve_unit_loops=True)
    if epilogue is not None:  # (before mm's loops are bound: its region is then the tile's)
        sch.reverse_compute_at(epilogue, io, preserve_unit_loops=True)
    lane, row, out = sch.get_loops(mm)[3:]
    sch.reorder(row, out, lane)
    if reduction == "warp":
        sch.bind(lane, "threadIdx.x")  # (a reduction over a thread axis: a warp reduction)
    else:  # each of a warp's lanes sums one (row, output)'s partial sums, in lane order
        _spread_over_lanes(sch, sch.fuse(row, out), lanes)
        if epilogue is not None:  # (and writes the sums it made)
            _spread_over_lanes(sch, sch.fuse(*sch.get_loops(epilogue)[3:]), lanes)
    sch.set_scope(rf, 0, "local")
    sch.set_scope(mm, 0, "local")
    if reduction != "warp":  # the lanes' partial sums meet in workgroup memory: 2 barriers
        meet = sch.cache_read(mm, 0, "shared")  # (placed under io, before mm)
        sch.bind(sch.get_loops(meet)[3], "threadIdx.x")  # (each lane stores its own sums)
        sch.storage_align(meet, 0, axis=0, factor=32, offset=1)  # (lanes' stores: no conflict)
    sch.compute_at(deq, ko, preserve_unit_loops=True)  # the step's weights, dequantized once
    sch.set_scope(deq, 0, "local")
    x_local = sch.cache_read(rf, 0, "local")  # the step's inputs of the tile's rows
    sch.compute_at(x_local, ko, preserve_unit_loops=True)
    if vector_loads:  # (16 bytes a load at most: 8 halves, or 4 floats twice)
        width = 16 // DataType(str(sch.get(x_local).writes[0].source.dtype)).itemsize
        _, vec = sch.split(sch.get_loops(x_local)[-1], [None, min(width, pack)])
        sch.vectorize(vec)
    sch.decompose_reduction(rf, ko)
    for name, block in {sch.get(b).name_hint: b for b in sch.get_child_blocks(root)}.items():
        if name.endswith("_pad") and not sch.get_producers(block):
            sch.compute_inline(block)  # (the padded input: read in place, zeros past b)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _spread_over_lanes(sch: s_tir.Schedule, loop, lanes: int) -> None:
    """``loop``'s iterations dealt to a warp's ``lanes`` lanes (the last lanes idle where it
    has fewer: a one-row tile's 4 sums)."""
    _, lane = sch.split(loop, [None, lanes])
    sch.bind(lane, "threadIdx.x")


def _weights_per_word(block: s_tir.SBlock) -> int | None:
    """How many weights one word of the packed buffer holds (8 for 4-bit in uint32), read off
    the dequantize block's index ``k // pack``; None when it reads no packed word."""
    for region in block.reads:
        buffer = region.source  # (TVM's region of a buffer)
        index = region.region[-1].min
        if (buffer.dtype == "uint32" and type(index).__name__ == "FloorDiv"
                and isinstance(getattr(index.b, "value", None), int)):
            return int(index.b.value)
    return None
