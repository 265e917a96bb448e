"""Relax model -> plans (entry points as data) + the TIR functions they call, lowered into
every kernel set.

TVM compiles the model as usual (Relax passes, then per target its schedules and TIR lowering),
but the host side is never turned into native code: the browser has no TVM runtime, so the host
logic is extracted as data instead:

* each Relax function becomes a *plan*: an instruction list (alloc_storage, alloc_tensor, view,
  call) read off the function after memory planning, i.e. what the Relax VM bytecode would do.
  This part knows no target (``extract``);
* the TIR functions the plans call go to each target of compiler/targets/ (``lower``), which
  makes them its kernel set: for the GPU sets, each function's host part becomes a list of
  *launches* (compiler/tir_lower.py).

One plan serves every kernel set, so a function the plans call has one name in all of them:
``merge`` joins the lowerings of several Relax modules by one rule.

Expressions are JSON: an int/float, ``{"v": name}`` for a variable, or ``[op, args...]``.
The engine evaluates them (engine/plan.py); docs/artifact.md documents both formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx
from tvm.relax.backend.gpu_generic import pipeline as gpu_pipeline

from .targets import targets
from .targets.webgpu import webgpu_target
from .tir_lower import expr_to_json

# --------------------------------------------------------------------------- plans


def relax_passes(target) -> tvm.transform.Pass:
    """Relax -> memory-planned Relax calling unscheduled TIR functions. Nothing here depends on
    the target's kind, so one plan serves every kernel set; each set schedules the same TIR
    functions its own way afterwards."""
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
class Extracted:
    """What a Relax module is before any target: its plans, its parameters and the TIR
    functions the plans call (unscheduled)."""

    plans: dict[str, dict]
    param_specs: dict[str, dict]  # param name -> {"shape", "dtype"}
    tir_mod: tvm.IRModule


def extract(mod: tvm.IRModule, upper_bounds: dict[str, dict[str, int]],
            extra_tir: dict[str, tirx.PrimFunc] | None = None) -> Extracted:
    """The plans of a Relax module exported by ``nn.Module.export_tvm`` (each function's shape
    variables bounded by ``upper_bounds``) and the TIR functions they call. ``extra_tir``: TIR
    functions no plan calls, compiled into every kernel set too (the engine calls them by name:
    compiler/synthetic.py)."""
    target = webgpu_target()  # (the GPU pipeline's passes want one; none depends on it)
    for fname, bounds in upper_bounds.items():
        mod[fname] = mod[fname].with_attr("tir_var_upper_bound", bounds)
    with target:
        mod = relax_passes(target)(mod)
    tir_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items()
                            if isinstance(f, tirx.PrimFunc)})
    for name, f in (extra_tir or {}).items():
        tir_mod[name] = f.with_attr("global_symbol", name)
    plans, param_specs = {}, {}
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            plans[gv.name_hint] = build_plan(f, gv.name_hint, upper_bounds.get(gv.name_hint, {}))
            num_input = int(f.attrs["num_input"]) if "num_input" in f.attrs else len(f.params)
            for p in f.params[num_input:]:
                param_specs[p.name] = {"shape": [int(d) for d in p.ty.shape.values],
                                       "dtype": str(p.ty.dtype)}
    return Extracted(plans, param_specs, tir_mod)


@dataclass
class Lowered:
    """The plans and, per target (compiler/targets/), the lowered set of the functions they
    call."""

    plans: dict[str, dict]
    param_specs: dict[str, dict]  # param name -> {"shape", "dtype"}
    sets: dict = field(default_factory=dict)  # target KIND -> its lowered set


def lower(mod: tvm.IRModule, upper_bounds: dict[str, dict[str, int]], schedule: str = "prefill",
          twins: dict[str, dict[str, tirx.PrimFunc]] | None = None,
          extra_tir: dict[str, tirx.PrimFunc] | None = None,
          chosen: tuple[str, ...] | None = None) -> Lowered:
    """``extract`` a Relax module and lower its TIR functions for every target the ``chosen``
    kernel sets read (compiler/targets/ ``targets``; all for None), scheduled as ``schedule``
    (``prefill``, ``decode``, ``decode1``: tir_lower.schedule_rules). ``twins``: per target
    KIND, the functions that replace the plans' in that set (same name, same parameters:
    compiler/compile.py ``kernel_twins``)."""
    ex = extract(mod, upper_bounds, extra_tir)
    sets = {kind: target.lower(ex.tir_mod, schedule, (twins or {}).get(kind, {}))
            for kind, target in targets(chosen).items()}
    return Lowered(ex.plans, ex.param_specs, sets)


def merge(base: Lowered, other: Lowered, prefix: str) -> Lowered:
    """``other``'s plans added to ``base``'s. A function of ``other`` keeps its name where
    ``base`` has none of that name, or one that is the same in every kernel set; else it takes
    the name of a function an earlier merge named apart that is the same in every set (decode1's
    CUDA attention is decode's), else ``prefix`` + its name. Each set joins its kernels its own
    way (the sets' ``merging``); the plans call the functions by their new names."""
    for lowered in (base, other):  # (one plan: every set has the same functions)
        named = {kind: set(s.names) for kind, s in lowered.sets.items()}
        if len({frozenset(n) for n in named.values()}) > 1:
            raise ValueError(f"the kernel sets lower different functions: {named}")
    joins = {kind: base.sets[kind].merging(other.sets[kind], prefix) for kind in base.sets}
    names: dict[str, str] = {}
    known = list(base.sets[next(iter(base.sets))].names)

    def agree(mine: str, theirs: str) -> bool:
        return all(join.same(mine, theirs) for join in joins.values())

    for name in other.sets[next(iter(other.sets))].names:
        new = name
        if name in known and not agree(name, name):
            new = next((n for n in known if n != name and n.endswith(name) and agree(n, name)),
                       prefix + name)
        names[name] = new
        for join in joins.values():
            join.add(name, new)
        if new not in known:
            known.append(new)
    plans = dict(base.plans)
    for pname, plan in other.plans.items():
        instrs = [{**i, "func": names[i["func"]]} if i["op"] == "call" else i
                  for i in plan["instrs"]]
        plans[pname] = {**plan, "instrs": instrs}
    return Lowered(plans, {**base.param_specs, **other.param_specs},
                   {kind: join.result() for kind, join in joins.items()})
