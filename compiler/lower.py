"""Relax model -> WGSL kernels + launch metadata + the plan (entry points as data).

TVM compiles the model as usual (Relax GPU pipeline + dlight schedules + TIR lowering), but we
stop before the host side is turned into native code: the browser has no TVM runtime, so the
host logic is extracted as data instead:

* each TIR function's host part becomes a list of *launches*: which device kernel, which of the
  function's buffers go to which binding, the POD scalars and the grid as small expressions over
  the function's shape variables (the order TVM's ``call_ffi_kernel`` passes them;
  compiler/tir_lower.py, which the CUDA kernel set shares);
* each Relax function becomes a *plan*: an instruction list (alloc_storage, alloc_tensor, view,
  call) read off the function after memory planning, i.e. what the Relax VM bytecode would do.

Expressions are JSON: an int/float, ``{"v": name}`` for a variable, or ``[op, args...]``.
The engine evaluates them (engine/plan.py); docs/artifact.md documents both formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.relax.backend.gpu_generic import pipeline as gpu_pipeline

from .tir_lower import (
    Kernel,
    TirFunction,
    build_kernels,
    expr_to_json,
    schedule_rules,
    webgpu_target,
)

# --------------------------------------------------------------------------- plans


def relax_passes(target) -> tvm.transform.Pass:
    """Relax -> memory-planned Relax calling unscheduled TIR functions. Nothing here depends on
    the target's kind, so one plan serves every kernel set (WebGPU, CPU); each set schedules
    the same TIR functions its own way afterwards."""
    return tvm.transform.Sequential(
        [relax.transform.FuseTransposeMatmul()]
        + gpu_pipeline.library_dispatch_passes(target)
        + [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
        + gpu_pipeline.dataflow_lower_passes(target)
        + [
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            relax.transform.AttachGlobalSymbol(),
        ]
    )


def _dtype_name(x) -> str:
    return str(x.value) if hasattr(x, "value") else str(x)


def build_plan(func: relax.Function, name: str, upper_bounds: dict[str, int]) -> dict:
    """Read the memory-planned Relax function as a plan (see docs/artifact.md)."""
    num_input = int(func.attrs["num_input"]) if "num_input" in func.attrs else len(func.params)
    names: dict[relax.Var, str] = {}

    def ref(v) -> str:
        if isinstance(v, relax.Var):
            return names[v]
        raise NotImplementedError(f"{name}: unsupported argument {v!r}")

    def shape(sinfo) -> list:
        return [expr_to_json(d, lambda v: {"v": v.name}) for d in sinfo.shape.values]

    inputs, params = [], []
    for i, p in enumerate(func.params):
        group = inputs if i < num_input else params
        if isinstance(p.ty, relax.TupleType):  # e.g. kv_pages: one tensor per layer
            names[p] = [f"{p.name}.{j}" for j in range(len(p.ty.fields))]  # type: ignore[assignment]
            for j, field_ty in enumerate(p.ty.fields):
                group.append({"name": f"{p.name}.{j}", "shape": shape(field_ty), "dtype": str(field_ty.dtype)})
            continue
        names[p] = p.name
        group.append({"name": p.name, "shape": shape(p.ty), "dtype": str(p.ty.dtype)})
    instrs: list[dict] = []
    counter = 0

    def fresh(v: relax.Var) -> str:
        nonlocal counter
        counter += 1
        names[v] = f"%{counter}"
        return names[v]

    def values_of(e) -> list:
        return [expr_to_json(d, lambda v: {"v": v.name}) for d in e.values]

    for block in func.body.blocks:
        for b in block.bindings:
            v, e = b.var, b.value
            if isinstance(e, relax.Var):
                names[v] = names[e]
                continue
            if isinstance(e, relax.Tuple):
                names[v] = [names[f] for f in e.fields]  # type: ignore[assignment]
                continue
            if isinstance(e, relax.TupleGetItem):
                names[v] = names[e.tuple_value][e.index]
                continue
            if not isinstance(e, relax.Call):
                raise NotImplementedError(f"{name}: binding {type(e).__name__}")
            op = e.op
            if isinstance(op, tvm.ir.Op):
                opname = op.name
                if opname == "relax.memory.alloc_storage":
                    instrs.append({"op": "alloc_storage", "dst": fresh(v), "nbytes": values_of(e.args[0])[0]})
                elif opname == "relax.memory.alloc_tensor":
                    instrs.append({"op": "alloc_tensor", "dst": fresh(v), "storage": ref(e.args[0]),
                                   "offset": expr_to_json(e.args[1].value, lambda x: {"v": x.name}),
                                   "shape": values_of(e.args[2]), "dtype": _dtype_name(e.args[3])})
                elif opname == "relax.builtin.alloc_tensor":
                    instrs.append({"op": "alloc", "dst": fresh(v), "shape": values_of(e.args[0]),
                                   "dtype": _dtype_name(e.args[1])})
                elif opname in ("relax.reshape", "relax.memory.view"):
                    instrs.append({"op": "view", "dst": fresh(v), "src": ref(e.args[0]),
                                   "shape": shape(v.ty), "dtype": str(v.ty.dtype)})
                elif opname in ("relax.memory.kill_tensor", "relax.memory.kill_storage"):
                    continue
                else:
                    raise NotImplementedError(f"{name}: operator {opname}")
            elif isinstance(op, tvm.ir.GlobalVar):
                args = []
                for a in e.args:
                    if isinstance(a, relax.ShapeExpr):
                        raise NotImplementedError(f"{name}: symbolic scalar arguments to {op.name}")
                    args.append(ref(a))
                instrs.append({"op": "call", "func": op.name_hint, "args": args})
            else:
                raise NotImplementedError(f"{name}: call of {op!r}")
    out = func.body.body
    outputs = [names[f] for f in out.fields] if isinstance(out, relax.Tuple) else [names[out]]
    # a function returning a tuple (bound to a variable) lists its fields, flattened
    while any(isinstance(o, list) for o in outputs):
        outputs = [x for o in outputs for x in (o if isinstance(o, list) else [o])]
    return {"name": name, "inputs": inputs, "params": [p["name"] for p in params],
            "upper_bounds": upper_bounds, "instrs": instrs, "outputs": outputs}


@dataclass
class Lowered:
    kernels: list[Kernel]
    tir_functions: dict[str, TirFunction]
    plans: dict[str, dict]
    param_specs: dict[str, dict]  # param name -> {"shape", "dtype"}
    # the same TIR functions for the CPU kernel set (compiler/cpu_kernels.py), unscheduled, with
    # the GPU-only ones (attention, sampling) replaced by their CPU twins
    cpu_functions: dict[str, tirx.PrimFunc] = field(default_factory=dict)
    # the same TIR functions lowered for CUDA (compiler/cuda_kernels.py), when asked for
    cuda: Any = None


def lower(mod: tvm.IRModule, upper_bounds: dict[str, dict[str, int]], target=None,
          schedule: str = "prefill", cpu_twins: dict[str, tirx.PrimFunc] | None = None,
          cuda_twins: dict[str, tirx.PrimFunc] | None = None,
          extra_tir: dict[str, tirx.PrimFunc] | None = None) -> Lowered:
    """Compile a Relax module exported by ``nn.Module.export_tvm``: its plans, its WebGPU
    kernels, and (given ``cpu_twins``: TIR function name -> CPU replacement for each function
    that only has a GPU form) its TIR functions for the CPU kernel set; given ``cuda_twins``
    (the functions with a CUDA form of their own), its CUDA kernel set too. ``extra_tir``:
    TIR functions no plan calls, compiled into every kernel set too (the engine calls them by
    name: compiler/synthetic.py)."""
    from tvm.s_tir import dlight as dl

    target = target or webgpu_target()
    for fname, bounds in upper_bounds.items():
        mod[fname] = mod[fname].with_attr("tir_var_upper_bound", bounds)
    with target:
        mod = relax_passes(target)(mod)
    tir_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)})
    for name, f in (extra_tir or {}).items():
        tir_mod[name] = f.with_attr("global_symbol", name)
    cpu_functions = {}
    if cpu_twins is not None:
        for gv, f in tir_mod.functions.items():
            cpu_functions[gv.name_hint] = cpu_twins.get(gv.name_hint, f)
    with target:  # (dlight schedules a module in place: a copy, so that tir_mod stays
        # unscheduled for the CUDA set, which schedules it for CUDA's threads and warps)
        scheduled = dl.ApplyDefaultSchedule(*schedule_rules(schedule))(
            tvm.IRModule(dict(tir_mod.functions)))
    kernels, funcs = build_kernels(scheduled, target)
    plans, param_specs = {}, {}
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            plans[gv.name_hint] = build_plan(f, gv.name_hint, upper_bounds.get(gv.name_hint, {}))
            num_input = int(f.attrs["num_input"]) if "num_input" in f.attrs else len(f.params)
            for p in f.params[num_input:]:
                param_specs[p.name] = {"shape": [int(d) for d in p.ty.shape.values],
                                            "dtype": str(p.ty.dtype)}
    used = {l["kernel"] for tf in funcs.values() for l in tf.launches}
    kernels = [k for k in kernels if k.name in used]
    cuda = None
    if cuda_twins is not None:
        from .cuda_kernels import lower_cuda

        cuda = lower_cuda(tir_mod, schedule, cuda_twins)
    return Lowered(kernels, funcs, plans, param_specs, cpu_functions, cuda)


def _cuda_differs(base, mine: str, other, theirs: str) -> bool:
    """Whether TIR function ``mine`` of one lowering and ``theirs`` of another lower to
    different CUDA kernels (a plan's own CUDA twin: PagedAttention.gpu_twins' decode kernel):
    then the plans must call them by different names in every kernel set, since one plan
    serves them all."""
    if base is None or other is None:
        return False
    a, b = base.tir_functions.get(mine), other.tir_functions.get(theirs)
    if a is None or b is None:
        return False
    if a.params != b.params or len(a.launches) != len(b.launches):
        return True
    from .cuda_kernels import same_kernel

    return not all(same_kernel(base.kernels[x["kernel"]], other.kernels[y["kernel"]])
                   for x, y in zip(a.launches, b.launches))


def merge(base: Lowered, other: Lowered, prefix: str) -> Lowered:
    """Add ``other``'s plans to ``base``. Kernels and TIR functions with the same name and
    identical content are shared; different ones from ``other`` get ``prefix`` on their name."""
    kernels = {k.name: k for k in base.kernels}
    kernel_names: dict[str, str] = {}
    for k in other.kernels:
        same = kernels.get(k.name)
        name = k.name if same is None or same.wgsl == k.wgsl else prefix + k.name
        kernel_names[k.name] = name
        if name not in kernels:
            kernels[name] = Kernel(name, k.wgsl, k.scalar_dtypes, k.storage_access, k.entry_point)
    funcs = dict(base.tir_functions)
    func_names: dict[str, str] = {}
    for name, f in other.tir_functions.items():
        launches = [{**l, "kernel": kernel_names[l["kernel"]]} for l in f.launches]
        renamed = TirFunction(name, f.params, launches)
        same = funcs.get(name)
        if same is not None and ((same.params, same.launches) != (renamed.params, renamed.launches)
                                 or _cuda_differs(base.cuda, name, other.cuda, name)):
            # an equal function an earlier merge named apart (decode1's CUDA twin is decode's)
            renamed.name = next(
                (n for n, g in funcs.items() if n != name and n.endswith(name)
                 and (g.params, g.launches) == (renamed.params, renamed.launches)
                 and not _cuda_differs(base.cuda, n, other.cuda, name)), prefix + name)
        func_names[name] = renamed.name
        funcs.setdefault(renamed.name, renamed)
    cpu_functions = dict(base.cpu_functions)
    for name, f in other.cpu_functions.items():  # (the WebGPU set's names: one plan for both)
        cpu_functions.setdefault(func_names[name], f)
    plans = dict(base.plans)
    for pname, plan in other.plans.items():
        instrs = [{**i, "func": func_names[i["func"]]} if i["op"] == "call" else i for i in plan["instrs"]]
        plans[pname] = {**plan, "instrs": instrs}
    cuda = base.cuda
    if base.cuda is not None and other.cuda is not None:
        from .cuda_kernels import merge_cuda

        cuda = merge_cuda(base.cuda, other.cuda, prefix, func_names)
    return Lowered(list(kernels.values()), funcs, plans, {**base.param_specs, **other.param_specs},
                   cpu_functions, cuda)
