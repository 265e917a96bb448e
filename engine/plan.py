"""The plan interpreter: turns one call of a compiled entry point into backend dispatches.

The compiler exports each Relax function as an instruction list (compiler/lower.py) and, in
the GPU kernel sets, each TIR function as its device launches (compiler/targets/,
compiler/tir_lower.py); docs/artifact.md documents both. Here we evaluate them:
bind the symbolic shape variables from the input tensors, place every intermediate tensor in its
pre-planned storage, and emit one ``Dispatch`` per kernel launch with its uniform packed.

Storages are allocated once, at their upper-bound size, so a step allocates nothing; and the
dispatch list depends only on the input shapes, so it is cached per shape signature.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .artifact import FORMS
from .backend import (DTYPE_BYTES, Backend, BufferSlice, Call, Dispatch, KernelSet, KernelSpec,
                      TensorRef)
from .errors import ArtifactError

if TYPE_CHECKING:
    from .artifact import Artifact

def evaluate(expr: Any, env: Mapping[str, int]) -> Any:
    """Evaluate a JSON expression from the compiler (ints, {"v": name}, [op, *args])."""
    if isinstance(expr, (int, float)):
        return expr
    if isinstance(expr, dict):
        return env[expr["v"]]
    op, *args = expr
    if op == "?":
        return evaluate(args[1], env) if evaluate(args[0], env) else evaluate(args[2], env)
    vals = [evaluate(a, env) for a in args]
    if op == "+":
        return vals[0] + vals[1]
    if op == "-":
        return vals[0] - vals[1]
    if op == "*":
        return vals[0] * vals[1]
    if op == "//":
        return vals[0] // vals[1]
    if op == "%":
        return vals[0] % vals[1]
    if op == "/":  # TIR Div on integers truncates toward zero
        q = abs(vals[0]) // abs(vals[1])
        return q if (vals[0] >= 0) == (vals[1] >= 0) else -q
    if op == "min":
        return min(vals)
    if op == "max":
        return max(vals)
    if op == "not":
        return not vals[0]
    return {
        "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
        "and": lambda a, b: bool(a and b), "or": lambda a, b: bool(a or b),
    }[op](*vals)


def bind_shapes(env: dict[str, int], declared: Sequence[Sequence[Any]],
                actual: Sequence[Sequence[int]], names: Sequence[str]) -> None:
    """Bind the variables of declared shapes from actual shapes, then check every dimension
    (a variable may first appear inside an expression, e.g. ``batch_size + 1``)."""
    for pattern, shape, name in zip(declared, actual, names):
        if len(pattern) != len(shape):
            raise ArtifactError(f"{name}: expected rank {len(pattern)}, got shape {tuple(shape)}")
        for dim, size in zip(pattern, shape):
            if isinstance(dim, dict) and dim["v"] not in env:
                env[dim["v"]] = size
    for pattern, shape, name in zip(declared, actual, names):
        for dim, size in zip(pattern, shape):
            if evaluate(dim, env) != size:
                bound = {k: v for k, v in env.items() if k in str(pattern)}
                raise ArtifactError(f"{name}: shape {tuple(shape)} does not match {pattern} "
                                    f"with {bound}")


_SCALAR_CODES = {"float32": "f", "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q"}


def scalar_format(dtypes: Sequence[str], suffix: str = "", words: bool = False) -> str:
    """The ``struct`` format of a kernel's scalar parameters (little-endian, packed). With
    ``words`` every scalar is one 32-bit word (a WGSL uniform, whose codegen narrows 64-bit
    index scalars to i32)."""
    try:
        codes = [_SCALAR_CODES[d] for d in dtypes]
    except KeyError as e:
        raise ArtifactError(f"kernel scalar of type {e} is not supported") from None
    if words:
        codes = ["i" if c == "q" else "I" if c == "Q" else c for c in codes]
    return "<" + "".join(codes) + suffix


class KernelTable:
    """All kernels of an artifact, loaded into a backend once."""

    grid_word = True  # the uniform ends with packGridDimX (WGSL kernels, docs/kernel-abi.md)

    def __init__(self, kernels: Sequence[dict], backend: Backend) -> None:
        self.index = {k["name"]: i for i, k in enumerate(kernels)}
        self.scalar_formats = [scalar_format(k["scalar_dtypes"], "I", words=True)
                               for k in kernels]
        specs = [
            KernelSpec(k["name"], k["wgsl"], k.get("entry_point", k["name"]),
                       tuple(k["storage_access"]), True)
            for k in kernels
        ]
        # our kernels' first index on the device
        self.base = backend.load(KernelSet("shaders", {}, tuple(specs)))


class LibraryTable:
    """A kernel set compiled as one library (native CPU or WebAssembly, a function per TIR
    function), loaded once."""

    def __init__(self, entry: dict, directory: str, data: bytes, backend: Backend) -> None:
        """``entry``: the manifest's kernel set (form "library"); ``data``: its file's verified
        bytes."""
        self.index = {n: i for i, n in enumerate(entry["functions"])}
        self.base = backend.load(KernelSet("library", entry, (), f"{directory}/{entry['file']}", data))


class SourceKernelTable:
    """A kernel set kept as one source file (CUDA C, compiled by the backend at load), launched
    like WGSL kernels: ``Dispatch``es whose uniform holds the kernel's scalars only."""

    grid_word = False

    def __init__(self, entry: dict, directory: str, data: bytes, backend: Backend) -> None:
        """``entry``: the manifest's kernel set (form "source"); ``data``: its file's verified
        bytes."""
        self.index = {k["name"]: i for i, k in enumerate(entry["kernels"])}
        self.scalar_formats = [scalar_format(k["scalar_dtypes"]) for k in entry["kernels"]]
        self.base = backend.load(KernelSet("source", entry, (), f"{directory}/{entry['file']}", data))


KernelTables = KernelTable | LibraryTable | SourceKernelTable


def load_kernel_set(artifact: "Artifact", backend: Backend,
                    called: set[str]) -> tuple[KernelTables, dict]:
    """The artifact's kernel set for ``backend.kind``, loaded by its form (engine/artifact.py
    ``FORMS``), and its TIR functions' launches (none for a library: it runs each function
    whole). ``called``: the TIR functions the engine will call (a "shaders" set compiles only
    their kernels)."""
    entry = artifact.kernel_set(backend.kind)
    form = entry.get("form")
    tir = entry.get("tir_functions", {})
    if form == "shaders":
        used = {launch["kernel"] for f in called for launch in tir[f]["launches"]}
        return KernelTable(artifact.kernels(used), backend), tir
    if form not in FORMS:
        raise ArtifactError(f"artifact {artifact.location or artifact.model_id}: kernel set "
                            f"{backend.kind!r} has the unknown form {form!r} (a newer wick's?)")
    data = artifact.read_verified(entry["file"], entry["sha256"])  # a corrupt file is named
    table = SourceKernelTable if form == "source" else LibraryTable
    return table(entry, artifact.location, data, backend), tir


class PlanFunction:
    """One entry point (e.g. ``forward``) bound to a backend."""

    def __init__(self, plan: dict, tir_functions: Mapping[str, dict],
                 kernels: KernelTable | LibraryTable | SourceKernelTable,
                 backend: Backend, params: Mapping[str, TensorRef]) -> None:
        self.name = plan["name"]
        self.plan = plan
        self.tir = tir_functions
        self.kernels = kernels
        self.backend = backend
        self.params = params
        missing = [p for p in plan["params"] if p not in params]
        if missing:
            raise ArtifactError(f"{self.name}: parameters not loaded: {', '.join(missing[:5])}")
        self.input_names = [i["name"] for i in plan["inputs"]]
        self.storages: dict[str, int] = {}
        bounds = plan.get("upper_bounds", {})
        for ins in plan["instrs"]:  # storages live for the whole session, at their max size
            if ins["op"] == "alloc_storage":
                try:
                    nbytes = evaluate(ins["nbytes"], bounds)
                except KeyError as e:
                    raise ArtifactError(f"{self.name}: no upper bound for {e} in storage size") from None
                self.storages[ins["dst"]] = backend.alloc(max(int(nbytes), 4))
        self._cache: dict[tuple, tuple[list[Dispatch], list[TensorRef]]] = {}

    def signature(self, inputs: Mapping[str, TensorRef]) -> tuple:
        """What this function's dispatches depend on: each input's buffer, offset and shape
        (the same signature always brings the same, cached, dispatch list)."""
        return tuple((inputs[n].buffer, inputs[n].offset, inputs[n].shape)
                     for n in self.input_names)

    def __call__(self, inputs: Mapping[str, TensorRef],
                 step: list | None = None) -> tuple[list[Dispatch], list[TensorRef]]:
        """Dispatches computing this function on ``inputs``, and the output tensors. ``step``:
        a step's key being built (engine/runner.py), to which this call adds its name and
        signature."""
        key = self.signature(inputs)
        if step is not None:
            step.append((self.name, key))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._build(inputs)
        return hit

    def _build(self, inputs: Mapping[str, TensorRef]) -> tuple[list[Dispatch], list[TensorRef]]:
        env: dict[str, int] = {}
        values: dict[str, TensorRef] = dict(self.params)
        for spec in self.plan["inputs"]:
            t = inputs[spec["name"]]
            if t.dtype != spec["dtype"]:
                raise ArtifactError(f"{self.name}: input {spec['name']} must be {spec['dtype']}")
            values[spec["name"]] = t
        specs = self.plan["inputs"]
        bind_shapes(env, [s["shape"] for s in specs], [values[s["name"]].shape for s in specs],
                    [f"{self.name} input {s['name']}" for s in specs])
        dispatches: list[Dispatch] = []
        for ins in self.plan["instrs"]:
            op = ins["op"]
            if op == "alloc_storage":
                continue
            if op == "alloc_tensor":
                shape = tuple(evaluate(d, env) for d in ins["shape"])
                values[ins["dst"]] = TensorRef(self.storages[ins["storage"]],
                                               evaluate(ins["offset"], env), shape, ins["dtype"])
            elif op == "view":
                src = values[ins["src"]]
                shape = tuple(evaluate(d, env) for d in ins["shape"])
                values[ins["dst"]] = TensorRef(src.buffer, src.offset, shape, ins["dtype"])
            elif op == "call":
                self._call(ins["func"], [values[a] for a in ins["args"]], dispatches)
            else:
                raise ArtifactError(f"{self.name}: unknown plan instruction {op!r}")
        return dispatches, [values[o] for o in self.plan["outputs"]]

    def _call(self, func: str, args: list[TensorRef], out: list) -> None:
        tir_call(func, args, self.tir, self.kernels, out)


def tir_call(func: str, args: Sequence[TensorRef], tir: Mapping[str, dict],
             kernels: KernelTable | LibraryTable | SourceKernelTable, out: list) -> None:
    """Append to ``out`` what computes TIR function ``func`` on ``args``: one ``Call`` for a
    library kernel set, else one ``Dispatch`` per launch of ``tir[func]``."""
    if isinstance(kernels, LibraryTable):  # the function checks its shapes itself
        out.append(Call(kernels.base + kernels.index[func], tuple(args)))
        return
    tf = tir[func]
    env: dict[str, int] = {}
    bind_shapes(env, [p["shape"] for p in tf["params"]], [t.shape for t in args],
                [f"{func} argument {i}" for i in range(len(args))])
    for launch in tf["launches"]:
        kid = kernels.index[launch["kernel"]]
        x, y, z = (int(evaluate(g, env)) for g in launch["grid"])
        if x <= 0 or y <= 0:
            continue  # empty launch (no rows)
        scalars = [evaluate(s, env) for s in launch["scalars"]]
        if kernels.grid_word:
            scalars.append(x)
        uniform = struct.pack(kernels.scalar_formats[kid], *scalars)
        storage = []
        for p in launch["buffers"]:
            t = args[p]
            size = max(4, (t.nbytes + 3) // 4 * 4)
            storage.append(BufferSlice(t.buffer, t.offset, size))
        # the grid stays unfolded: backends fold x > 65535 into x * z (docs/kernel-abi.md)
        out.append(Dispatch(kernels.base + kid, tuple(storage), uniform, (x, y, z)))
