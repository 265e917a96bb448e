"""TIR functions -> device kernels and their host launches, the part of lowering every GPU
kernel set shares (compiler/targets/webgpu.py, compiler/targets/cuda.py): TVM lowers
a scheduled TIR module as usual, and each function's host side is read off as launches (which
kernel, which buffers to which binding, the scalars and the grid as expressions over the
function's shape variables) instead of being compiled for a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import tvm
from tvm import tirx

_BINOPS = {
    tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%",
    tirx.Div: "/", tirx.Mod: "%", tirx.Min: "min", tirx.Max: "max",
    tirx.LT: "<", tirx.LE: "<=", tirx.GT: ">", tirx.GE: ">=", tirx.EQ: "==", tirx.NE: "!=",
    tirx.And: "and", tirx.Or: "or",
}


def expr_to_json(e, resolve: Callable[[tirx.Var], Any]) -> Any:
    """PrimExpr -> JSON expression. ``resolve`` maps free variables to JSON."""
    if isinstance(e, int):
        return e
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    if isinstance(e, tirx.FloatImm):
        return float(e.value)
    if isinstance(e, tirx.Var):
        return resolve(e)
    if isinstance(e, tirx.Cast):
        return expr_to_json(e.value, resolve)
    for cls, name in _BINOPS.items():
        if isinstance(e, cls):
            return [name, expr_to_json(e.a, resolve), expr_to_json(e.b, resolve)]
    if isinstance(e, tirx.Not):
        return ["not", expr_to_json(e.a, resolve)]
    if isinstance(e, tirx.Select):
        return ["?", *(expr_to_json(x, resolve) for x in (e.condition, e.true_value, e.false_value))]
    if isinstance(e, tvm.ir.Call) and e.op.name == "tirx.if_then_else":
        return ["?", *(expr_to_json(x, resolve) for x in e.args)]
    raise NotImplementedError(f"cannot export expression {e!r} ({type(e).__name__})")


def free_var_names(x: Any) -> set[str]:
    if isinstance(x, dict):
        return {x["v"]}
    if isinstance(x, list):
        return set().union(*(free_var_names(a) for a in x[1:])) if len(x) > 1 else set()
    return set()


# --------------------------------------------------------------------------- kernels


def same_code(a: tirx.PrimFunc, b: tirx.PrimFunc) -> bool:
    """Whether two TIR functions are the same code, whatever their names."""
    import tvm_ffi

    return tvm_ffi.structural_equal(a.without_attr("global_symbol"),
                                    b.without_attr("global_symbol"))


def scalar_dtype(x) -> str | None:
    """The dtype of a scalar TIR value; None for buffer handles."""
    ty = getattr(x, "ty", None)
    if isinstance(ty, tvm.ir.PrimType):
        return str(ty.dtype)
    if isinstance(ty, tvm.ir.PointerType) or ty is not None:
        return None
    return str(x.dtype)


@dataclass
class TirFunction:
    """One TIR function as the plan calls it: params and the device launches it makes."""

    name: str
    params: list[dict]  # {"shape": [expr...], "dtype": str}
    launches: list[dict]  # {"kernel", "buffers": [param idx], "scalars": [expr], "grid": [x, y, z]}


def _lower_tir(tir_mod: tvm.IRModule, target) -> tvm.IRModule:
    """Run TVM's TIR pipeline but keep host functions in their buffer-level form."""
    tt = tirx.transform
    skipped = ("MakePackedAPI", "FP8StorageLegalize", "BF16StorageLegalize")
    saved = {name: getattr(tt, name) for name in skipped}
    pipe, _host_passes, _device_passes = tvm.tirx.get_tir_pipeline("s_tir")
    try:
        for name in skipped:  # these passes turn host code into the packed C ABI
            setattr(tt, name, lambda: tvm.transform.Sequential([]))
        return pipe(tt.BindTarget(target)(tir_mod))
    finally:
        for name, fn in saved.items():
            setattr(tt, name, fn)


def _walk_host(stmt, binds: dict, decls: dict, calls: list, where: str) -> None:
    """Collect let-bindings, buffer aliases and kernel launches of a straight-line host body."""
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _walk_host(s, binds, decls, calls, where)
        return
    if isinstance(stmt, tirx.Bind):
        binds[stmt.var] = stmt.value
    elif isinstance(stmt, tirx.DeclBuffer):
        decls[stmt.buffer] = stmt.data
    elif isinstance(stmt, tirx.Evaluate):
        call = stmt.value
        if isinstance(call, tvm.ir.Call) and call.op.name == "tirx.call_ffi_kernel":
            calls.append(call)
    elif isinstance(stmt, (tirx.IfThenElse, tirx.For, tirx.While)):
        raise NotImplementedError(f"{where}: control flow in host code")
    body = getattr(stmt, "body", None)
    if isinstance(body, tirx.Stmt):
        _walk_host(body, binds, decls, calls, where)


def host_launches(func: tirx.PrimFunc, devices: dict[str, tirx.PrimFunc],
                   block: bool = False) -> TirFunction:
    """Read the launches of one host function (buffer-level form, before MakePackedAPI).
    With ``block``, each launch also says its thread block and dynamic shared memory (CUDA
    takes them at launch; a WGSL kernel declares its workgroup size itself)."""
    name = str(func.attrs["global_symbol"])
    param_index, offset_vars, shape_vars = {}, set(), {}
    for i, p in enumerate(func.params):
        ty = p.ty
        if not hasattr(ty, "shape"):
            raise NotImplementedError(f"{name}: scalar parameter {p} (specialize it away)")
        param_index[p] = i
        if isinstance(ty.elem_offset, tirx.Var):
            offset_vars.add(ty.elem_offset)
        for dim in ty.shape:
            if isinstance(dim, tirx.Var):
                shape_vars.setdefault(dim, i)
    binds: dict = {}
    decls: dict = {}
    calls: list[tirx.Call] = []
    _walk_host(func.body, binds, decls, calls, name)

    def buffer_param(e) -> int:
        """buffer_data(x) where x is a parameter or a DeclBuffer alias of one -> param index."""
        while True:
            if not (isinstance(e, tvm.ir.Call) and e.op.name == "tirx.buffer_data"):
                raise NotImplementedError(f"{name}: buffer argument {e}")
            v = e.args[0]
            if v in param_index:
                return param_index[v]
            e = decls[v]

    def resolve(v: tirx.Var):
        if v in binds:
            return expr_to_json(binds[v], resolve)
        if v in shape_vars:
            return {"v": v.name}
        if v in offset_vars:  # elem_offset of a parameter: the engine binds tensors at 0
            return 0
        raise NotImplementedError(f"{name}: unbound host variable {v.name}")

    params = [{"shape": [expr_to_json(d, resolve) for d in p.ty.shape], "dtype": str(p.ty.dtype)}
              for p in func.params]
    launches = []
    for call in calls:
        kname = str(call.args[0].value)
        nparams = len(devices[kname].params)
        args = list(call.args[1:])
        tags = [str(t) for t in call.attrs.launch_params]
        buffers, scalars = [], []
        for a in args[:nparams]:
            if scalar_dtype(a) is None:
                buffers.append(buffer_param(a))
            else:
                scalars.append(expr_to_json(a, resolve))
        grid: list = [1, 1, 1]
        threads: list = [1, 1, 1]
        shared: Any = 0
        for tag, value in zip(tags, args[nparams:]):
            if tag.startswith("blockIdx."):
                grid["xyz".index(tag[-1])] = expr_to_json(value, resolve)
            elif tag.startswith("threadIdx."):
                threads["xyz".index(tag[-1])] = expr_to_json(value, resolve)
            elif tag == "tirx.use_dyn_shared_memory" and block:
                shared = expr_to_json(value, resolve)
            else:
                raise NotImplementedError(f"{kname}: launch parameter {tag}")
        launch = {"kernel": kname, "buffers": buffers, "scalars": scalars, "grid": grid}
        if block:
            launch.update(block=threads, shared=shared)
        launches.append(launch)
    return TirFunction(name, params, launches)


def lower_split(tir_mod: tvm.IRModule, target
                ) -> tuple[dict[str, tirx.PrimFunc], tvm.IRModule, list[tirx.PrimFunc]]:
    """Scheduled TIR lowered for ``target`` and split: the device functions as the host code
    names them, the same after TVM's device passes (what codegen takes), the host functions."""
    lowered = _lower_tir(tir_mod, target)
    device_funcs: dict[str, tirx.PrimFunc] = {}
    host_funcs = []
    for gv, f in lowered.functions.items():
        if f.attrs.get("calling_conv") is not None and int(f.attrs["calling_conv"]) == 2:
            device_funcs[gv.name_hint] = f
        else:
            host_funcs.append(f)
    _, _, device_passes = tvm.tirx.get_tir_pipeline("s_tir")
    dmod = device_passes()(tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in device_funcs.items()}))
    return device_funcs, dmod, host_funcs


def schedule_rules(kind: str) -> list:
    """dlight rules: tiled GEMM where many rows share weights (prefill), GEMV where few do.

    ``decode`` and ``decode1`` (the same step for any b, and for b == 1) differ here only in
    how many rows a workgroup pads to (4 or 1). Each row of LowBatchGEMV reduces in the same
    order whatever that number, so a sequence's decode logits are bit-identical alone and in
    a batch. (dlight's plain GEMV rule, which takes static b == 1 only, sums in another
    order.) On the GPU targets the dequantize-GEMVs are compiler/batched_gemv.py's, scheduled
    before these rules, which take the rest (q0's GEMVs among them); a mixture-of-experts
    model's expert matmuls are compiler/expert_gemv.py's (first: dlight's rules assert on
    them)."""
    from tvm.s_tir import dlight as dl

    from .expert_gemv import Declining, ExpertGEMV, RouterKernels

    tail = [Declining(dl.gpu.Reduction()), Declining(dl.gpu.GeneralReduction()),
            dl.gpu.Fallback()]
    if kind == "prefill":
        return [ExpertGEMV(), RouterKernels(), dl.gpu.Matmul(), Declining(dl.gpu.GEMV())] + tail
    if kind in ("decode", "decode1"):
        rows = 4 if kind == "decode" else 1
        return [ExpertGEMV(), RouterKernels(), Declining(dl.gpu.GEMV()),
                Declining(dl.gpu.LowBatchGEMV(rows)),
                dl.gpu.Matmul()] + tail
    raise ValueError(kind)
