"""The Runner: one scheduled ``Batch`` -> one backend call -> sampled token ids.

It owns the device state of a loaded artifact: weights, the per-layer KV page buffers, the
step-input buffers (sized for the largest step) and the bound plan functions. A step uploads
the index arrays, dispatches ``forward`` then ``sample`` in one submit, and reads back one int32
per sequence: logits never leave the device.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Callable

from .artifact import Artifact
from .backend import Backend, Read, Write
from .batch import Batch, SampledToken
from .errors import ArtifactError, MissingFeatureError
from .kv_cache import pages_for, window_pages
from .plan import (DTYPE_BYTES, KernelTables, PlanFunction, TensorRef, evaluate,
                   load_kernel_set, tir_call)
from .step_inputs import STEP_INPUTS, WINDOW_INPUTS, step_bounds, step_values


KV_INPUT_PREFIX = "kv_pages."  # forward's per-layer KV page tensors: kv_pages.0, kv_pages.1, ...
_SAMPLE_INPUTS = (("temperature", "float32", "f"), ("top_p", "float32", "f"),
                  ("top_k", "int32", "i"), ("min_p", "float32", "f"), ("uniform", "float32", "f"))


DEFAULT_KV_BUDGET = 256 << 20  # bytes of KV pages when the caller does not say


MAIN_POOL, WINDOW_POOL = "num_pages", "num_window_pages"  # a KV tensor's page-count variable


def kv_layers(manifest: dict) -> list[tuple[tuple[int, ...], str, str]]:
    """(shape of one page, dtype, pool) of each layer's KV tensor, read off the ``forward``
    plan's inputs: whatever a family's attention stores (heads, head size, dtype), the runner
    sizes it from the plan, never from the model's config. ``pool`` is the variable naming its
    page count: the main pool, or the windowed layers' own (engine/kv_cache.PairedKVCache)."""
    layers = []
    for spec in manifest["plans"]["forward"]["inputs"]:
        if spec["name"].startswith(KV_INPUT_PREFIX):
            first = spec["shape"][0]
            pool = first["v"] if isinstance(first, dict) else MAIN_POOL
            dims = [evaluate(d, {MAIN_POOL: 1, WINDOW_POOL: 1}) for d in spec["shape"]]
            layers.append((tuple(dims[1:]), spec["dtype"], pool))  # dims[0]: the page count
    if not layers:
        raise ArtifactError("the forward plan takes no KV page tensors")
    return layers


def _layer_page_bytes(manifest: dict, pool: str = MAIN_POOL) -> list[int]:
    """Device bytes one page of ``pool`` takes in each of its layers."""
    sizes = []
    for shape, dtype, layer_pool in kv_layers(manifest):
        if layer_pool != pool:
            continue
        count = DTYPE_BYTES[dtype]
        for d in shape:
            count *= d
        sizes.append(count)
    return sizes


def window_pages_for(manifest: dict, num_pages: int, max_storage_binding: int | None = None
                     ) -> int:
    """Pages of the windowed layers' own pool (0 without one), beside ``num_pages`` main
    pages: what the batch's sequences can use at most (each its window, one step's tokens and
    a page for alignment), but never more than the main pool (a sequence holds no more local
    pages than main ones, give or take one) nor one binding."""
    model = manifest["model"]
    window = model.get("kv_window_pool")
    if not window:
        return 0
    per_sequence = window_pages(window, model["prefill_chunk_size"], model["page_size"])
    pages = min(model["max_batch_size"] * per_sequence, num_pages)
    if max_storage_binding:
        pages = min(pages, max_storage_binding // max(_layer_page_bytes(manifest, WINDOW_POOL)))
    return max(1, pages)


def kv_pages_for(manifest: dict, budget_bytes: int, max_storage_binding: int) -> int:
    """How many main-pool KV pages fit the budget (beside the windowed layers' pool, if the
    model has one: ``window_pages_for``), and one layer's tensor in a storage binding; capped
    at what the compiled bounds can ever use."""
    model = manifest["model"]
    per_layer = _layer_page_bytes(manifest)
    main_bytes = sum(per_layer)
    window_bytes = sum(_layer_page_bytes(manifest, WINDOW_POOL))
    per_sequence = pages_for(model["context_window"], model["page_size"])
    if model.get("kv_window"):  # a sequence holds its window's pages and one step's
        per_sequence = min(per_sequence, window_pages(model["kv_window"],
                                                      model["prefill_chunk_size"],
                                                      model["page_size"]))
    useful = model["max_batch_size"] * per_sequence
    pages = budget_bytes // (main_bytes + window_bytes)  # as many local pages as main ones
    most_local = window_pages_for(manifest, 1 << 30) if window_bytes else 0
    if window_bytes and pages > most_local:  # the local pool is full: the rest is main pages
        pages = (budget_bytes - most_local * window_bytes) // main_bytes
    return max(1, min(pages, max_storage_binding // max(per_layer), useful))


@dataclass(frozen=True, slots=True)
class WeightPlacement:
    """Where one parameter's bytes go: ``nbytes`` from ``offset`` of shard ``shard`` into
    device buffer ``buffer`` at 0."""

    shard: int
    offset: int
    nbytes: int
    buffer: int


@dataclass(slots=True)
class StepTimings:
    """Host-side milliseconds of the last step, split by who spent them."""

    plan_ms: float = 0.0  # building inputs and dispatch lists
    backend_ms: float = 0.0  # encode + submit + wait + read back
    steps: int = 0  # and the sums over every step so far
    plan_ms_total: float = 0.0
    backend_ms_total: float = 0.0

    def record(self, plan_ms: float, backend_ms: float) -> None:
        self.plan_ms, self.backend_ms = plan_ms, backend_ms
        self.steps += 1
        self.plan_ms_total += plan_ms
        self.backend_ms_total += backend_ms


class Runner:
    def __init__(self, artifact: Artifact, backend: Backend, *, num_pages: int,
                 progress: Callable[[str, int, int], None] | None = None,
                 upload_weights: bool = True) -> None:
        """A step of generating sequences only (``Batch.decode_only``) runs ``decode1`` (b == 1)
        or ``decode``, any other step ``forward`` (tiled GEMM). The decode plans sum each
        sequence's row in the same order (compiler/tir_lower.py ``schedule_rules``), ``forward``
        in another; in f16 variants the two round apart now and then. So a sequence's tokens
        do not depend on what runs beside it as long as the scheduler keeps prompt work out of
        decode steps (``Scheduler(separate_prefill=True)``, the engine's default).

        ``upload_weights=False`` only allocates the weight buffers: the caller fills them as
        ``weight_placements`` say before the first step (the browser streams verified shards
        straight into them, so weights never pass through Python)."""
        missing = [f for f in artifact.required_features if f not in backend.features]
        if missing:
            raise MissingFeatureError(missing[0], artifact.fallback_variants,
                                      requested=f"{artifact.model_id} {artifact.quantization}")
        m = artifact.model
        self.backend = backend
        self.page_size = m["page_size"]
        self.num_pages = num_pages
        self.prefill_chunk_size = m["prefill_chunk_size"]
        self.max_batch = m["max_batch_size"]
        self.vocab_size = m["vocab_size"]
        self.timings = StepTimings()
        self._plan_ms = 0.0
        report = progress or (lambda stage, done, total: None)

        plans = artifact.manifest["plans"]
        # an embedding model's forward returns (b, dimensions) pooled vectors: nothing samples
        self.embedding = m.get("embedding") if m.get("task") == "embed" else None
        entries = [e for e in ("forward", "decode", "decode1", "sample", "process_logits",
                               "logprobs") if e in plans]
        fill_functions = artifact.manifest.get("synthetic", {}).get("fill_functions", {})
        self.kernels, tir = self._kernel_set(artifact, backend, entries,
                                             set(fill_functions.values()))
        params, self.weight_placements = self._alloc_params(artifact)
        if upload_weights:
            self._write_weights(artifact, report)
        self._fill_weights(artifact, params, tir, fill_functions, report)
        self.num_window_pages = window_pages_for(artifact.manifest, num_pages,
                                                 backend.max_storage_binding)
        self.window_pool = m.get("kv_window_pool")  # the windowed layers' window, if a pool
        self.kv_pages = self._alloc_pages(artifact)
        self.bounds = bounds = step_bounds(self.prefill_chunk_size, self.max_batch, num_pages,
                                           self.num_window_pages)
        planned = {i["name"] for i in plans["forward"]["inputs"]}
        self.step_inputs = STEP_INPUTS + tuple(i for i in WINDOW_INPUTS if i.name in planned)
        self.inputs = {}
        for spec in self.step_inputs:
            count = 1
            for d in spec.dims:
                count *= bounds[d]
            self.inputs[spec.name] = backend.alloc(DTYPE_BYTES[spec.dtype] * count)
        self.sample_inputs = {name: backend.alloc(4 * self.max_batch) for name, _, _ in _SAMPLE_INPUTS}
        # logit processing: the bitmask rows, and the sparse entries (grown on demand)
        self.mask_words = (self.vocab_size + 31) // 32
        self.process_inputs = {"mask": backend.alloc(4 * self.mask_words * self.max_batch),
                               "mask_on": backend.alloc(4 * self.max_batch),
                               "indptr": backend.alloc(4 * (self.max_batch + 1)),
                               "num_top": backend.alloc(4 * self.max_batch)}
        self._sparse_capacity = 0
        self._sparse: dict[str, int] = {}
        self._top_k_compiled = 0  # the logprobs kernel's K, from its output shape
        self.forward = PlanFunction(plans["forward"], tir, self.kernels, backend, params)
        # one new token per sequence: batched-GEMV kernels instead of tiled GEMM, padded to
        # four rows (decode) or one (decode1: a single sequence); both sum a row in the same
        # order (artifacts compiled before decode1 existed fall back to decode)
        self.decode = (PlanFunction(plans["decode"], tir, self.kernels, backend, params)
                       if "decode" in entries else self.forward)
        self.decode1 = (PlanFunction(plans["decode1"], tir, self.kernels, backend, params)
                        if "decode1" in entries else self.decode)
        self.sample = (PlanFunction(plans["sample"], tir, self.kernels, backend, {})
                       if "sample" in entries else None)
        # artifacts compiled before logit processing existed lack these two (refused per
        # request, with a clear error, only when a request needs them)
        self.process_logits = (PlanFunction(plans["process_logits"], tir, self.kernels, backend, {})
                               if "process_logits" in entries else None)
        self.logprobs = (PlanFunction(plans["logprobs"], tir, self.kernels, backend, {})
                         if "logprobs" in entries else None)

    # ------------------------------------------------------------------ loading

    @staticmethod
    def _kernel_set(artifact: Artifact, backend: Backend, entries: list[str],
                    functions: set[str]) -> tuple[KernelTables, dict]:
        """The artifact's kernel set for this backend's kind (engine/backend.py), loaded. The
        plan ``entries`` and the TIR ``functions`` called directly say which of a "shaders"
        set's kernels to compile."""
        plans = artifact.manifest["plans"]
        called = functions | {ins["func"] for e in entries for ins in plans[e]["instrs"]
                              if ins["op"] == "call"}
        return load_kernel_set(artifact, backend, called)

    def _alloc_params(self, artifact: Artifact) -> tuple[dict[str, TensorRef], list[WeightPlacement]]:
        """One zero-filled device buffer per parameter, and where its bytes come from."""
        params: dict[str, TensorRef] = {}
        placements = []
        for p in artifact.params:
            if p.nbytes > self.backend.max_storage_binding:
                raise ArtifactError(
                    f"parameter {p.name} is {p.nbytes} bytes, over this device's storage "
                    f"binding limit of {self.backend.max_storage_binding}"
                )
            handle = self.backend.alloc(p.nbytes)
            params[p.name] = TensorRef(handle, 0, p.shape, p.dtype)
            if p.fill is None:
                placements.append(WeightPlacement(p.shard, p.offset, p.nbytes, handle))
        return params, placements

    def _fill_weights(self, artifact: Artifact, params: dict[str, TensorRef], tir: dict,
                      functions: dict[str, str], report) -> None:
        """Fill the parameters a synthetic artifact stores no bytes for, on the device, with
        their dtype's fill kernel (compiler/synthetic.py): one small step each."""
        todo = [p for p in artifact.params if p.fill is not None]
        if not todo:
            return
        spec = self.backend.alloc(16)
        for i, p in enumerate(todo):
            if p.dtype not in functions:
                raise ArtifactError(f"parameter {p.name}: no fill kernel for {p.dtype}")
            count = p.nbytes // DTYPE_BYTES[p.dtype]
            flat = TensorRef(params[p.name].buffer, 0, (count,), p.dtype)
            calls: list = []
            tir_call(functions[p.dtype], [flat, TensorRef(spec, 0, (4,), "float32")], tir,
                     self.kernels, calls)
            self.backend.run([Write(spec, 0, array("f", [*p.fill, 0.0]).tobytes())], calls, [])
            report("generate weights", i + 1, len(todo))
        self.backend.free(spec)

    def _write_weights(self, artifact: Artifact, report) -> None:
        by_shard: dict[int, list[WeightPlacement]] = {}
        for w in self.weight_placements:
            by_shard.setdefault(w.shard, []).append(w)
        total = sum(w.nbytes for w in self.weight_placements)
        done = 0
        for shard, data in artifact.shard_bytes():
            view = memoryview(data)
            for w in by_shard.get(shard, []):
                self.backend.write(w.buffer, 0, view[w.offset:w.offset + w.nbytes])
                done += w.nbytes
                report("upload weights", done, total)

    def _alloc_pages(self, artifact: Artifact) -> list[TensorRef]:
        pages = []
        counts = {MAIN_POOL: self.num_pages, WINDOW_POOL: self.num_window_pages}
        for page_shape, dtype, pool in kv_layers(artifact.manifest):
            shape = (counts[pool], *page_shape)
            t = TensorRef(0, 0, shape, dtype)
            if t.nbytes > self.backend.max_storage_binding:
                raise ArtifactError(
                    f"KV cache of {counts[pool]} pages needs {t.nbytes} bytes per layer, over the "
                    f"storage binding limit {self.backend.max_storage_binding}: use fewer pages"
                )
            pages.append(TensorRef(self.backend.alloc(t.nbytes), 0, shape, dtype))
        return pages

    # ------------------------------------------------------------------ stepping

    def _forward_call(self, batch: Batch, key: list) -> tuple[list[Write], list, TensorRef]:
        """Uploads of the step's index arrays, the forward dispatches and the logits tensor;
        appends the plan's name and signature to the step's ``key``."""
        b, n = len(batch.seq_ids), batch.num_tokens
        if n > self.prefill_chunk_size or b > self.max_batch:
            raise ArtifactError(f"step of {n} tokens / {b} sequences exceeds the compiled bounds "
                                f"({self.prefill_chunk_size} / {self.max_batch})")
        writes: list[Write] = []
        inputs: dict[str, TensorRef] = {}
        for name, values in step_values(batch, self.step_inputs, self.bounds).items():
            handle = self.inputs[name]
            if values:
                writes.append(Write(handle, 0, array("i", values).tobytes()))
            inputs[name] = TensorRef(handle, 0, (len(values),), "int32")
        for i, pages in enumerate(self.kv_pages):
            inputs[f"{KV_INPUT_PREFIX}{i}"] = pages
        if batch.decode_only:
            plan = self.decode1 if b == 1 else self.decode
        else:
            plan = self.forward
        dispatches, (logits,) = plan(inputs, key)
        return writes, dispatches, logits

    def _step_call(self, batch: Batch) -> tuple[list[Write], list, list[Read], tuple]:
        """Everything one step sends to the device: uploads, forward (+ process_logits) +
        sample (+ logprobs) dispatches, the reads of one sampled token per sequence (and of
        the logprobs when a row asked for them), and the step's key (the backend's ``step``:
        the plans run and their signatures, which fix the dispatches)."""
        t0 = time.perf_counter()
        b = len(batch.seq_ids)
        key: list = []
        writes, dispatches, logits = self._forward_call(batch, key)
        if self.embedding is not None:  # the rows are the vectors: read them back
            self._plan_ms = (time.perf_counter() - t0) * 1e3
            return (writes, dispatches, [Read(logits.buffer, logits.offset, logits.nbytes)],
                    tuple(key))
        if self.sample is None:
            raise ArtifactError("this artifact has no sampling plan")
        dispatches = list(dispatches)  # the plan's cached list: never extend it in place
        rows = [None] * b
        for row, s in zip(batch.sample_rows, batch.sampling):
            rows[row] = s
        sampled_logits = logits
        if any(s is not None and s.needs_processing for s in rows):
            sampled_logits = self._process_call(rows, logits, writes, dispatches, key)
        columns: dict[str, list] = {"temperature": [], "top_p": [], "top_k": [], "min_p": [],
                                    "uniform": []}
        for s in rows:  # rows that sample nothing still get a (cheap, greedy) token
            columns["temperature"].append(s.temperature if s else 0.0)
            columns["top_p"].append(s.top_p if s else 1.0)
            columns["top_k"].append(s.top_k if s else 0)
            columns["min_p"].append(s.min_p if s else 0.0)
            columns["uniform"].append(s.uniform if s else 0.0)
        sample_inputs = {"logits": sampled_logits}
        for name, dtype, code in _SAMPLE_INPUTS:
            handle = self.sample_inputs[name]
            writes.append(Write(handle, 0, array(code, columns[name]).tobytes()))
            sample_inputs[name] = TensorRef(handle, 0, (b,), dtype)
        sample_dispatches, (tokens,) = self.sample(sample_inputs, key)
        dispatches += sample_dispatches
        reads = [Read(tokens.buffer, tokens.offset, 4 * b)]
        if any(s is not None and s.num_top_logprobs >= 0 for s in rows):
            if self.logprobs is None:
                raise ArtifactError("this artifact has no logprobs kernel; recompile it "
                                    "(wick compile) to get logprobs")
            handle = self.process_inputs["num_top"]
            writes.append(Write(handle, 0, array("i", [
                s.num_top_logprobs if s is not None else -1 for s in rows]).tobytes()))
            lp_dispatches, (lp, ids) = self.logprobs({
                "logits": logits, "token": tokens,
                "num_top": TensorRef(handle, 0, (b,), "int32")}, key)
            dispatches += lp_dispatches
            reads += [Read(lp.buffer, lp.offset, lp.nbytes), Read(ids.buffer, ids.offset, ids.nbytes)]
            self._top_k_compiled = ids.shape[1]
        self._plan_ms = (time.perf_counter() - t0) * 1e3
        return writes, dispatches, reads, tuple(key)

    def _process_call(self, rows: list, logits: TensorRef, writes: list[Write],
                      dispatches: list, key: list) -> TensorRef:
        """Upload the rows' bitmasks and sparse adjustments, dispatch ``process_logits``;
        returns the processed logits."""
        if self.process_logits is None:
            raise ArtifactError("this artifact has no logit processing kernel (grammars, "
                                "penalties, logit_bias); recompile it with wick compile")
        b = len(rows)
        words = self.mask_words
        mask_on, indptr, tokens, rep, add = [], [0], [], [], []
        for row, s in enumerate(rows):
            on = s is not None and s.mask is not None
            mask_on.append(1 if on else 0)
            if on:
                if len(s.mask) != 4 * words:
                    raise ArtifactError(f"grammar bitmask of {len(s.mask)} bytes; the model's "
                                        f"vocabulary needs {4 * words}")
                writes.append(Write(self.process_inputs["mask"], 4 * words * row, s.mask))
            for t, r, a in (s.adjust if s is not None else ()):
                tokens.append(t)
                rep.append(r)
                add.append(a)
            indptr.append(len(tokens))
        nnz = len(tokens)
        self._ensure_sparse(nnz)
        cap = self._sparse_capacity
        inputs = {"logits": logits}
        for name, values, code, shape in (
            ("mask_on", mask_on, "i", (b,)), ("indptr", indptr, "i", (b + 1,))):
            writes.append(Write(self.process_inputs[name], 0, array(code, values).tobytes()))
            inputs[name] = TensorRef(self.process_inputs[name], 0, shape, "int32")
        inputs["mask"] = TensorRef(self.process_inputs["mask"], 0, (b, words), "int32")
        for name, values, code, dtype in (("tokens", tokens, "i", "int32"),
                                          ("rep", rep, "f", "float32"),
                                          ("add", add, "f", "float32")):
            if values:
                writes.append(Write(self._sparse[name], 0, array(code, values).tobytes()))
            # the whole capacity as the shape: one cached dispatch list per capacity, not per nnz
            inputs[name] = TensorRef(self._sparse[name], 0, (cap,), dtype)
        process_dispatches, (processed,) = self.process_logits(inputs, key)
        dispatches += process_dispatches
        return processed

    def _ensure_sparse(self, nnz: int) -> None:
        if self._sparse and nnz <= self._sparse_capacity:
            return
        cap = max(256, self._sparse_capacity)
        while cap < nnz:
            cap *= 2
        for handle in self._sparse.values():
            self.backend.free(handle)
        self._sparse = {name: self.backend.alloc(4 * cap) for name in ("tokens", "rep", "add")}
        self._sparse_capacity = cap

    def _sampled(self, raws: list, batch: Batch) -> list:
        """One entry per sample row: the token id, or a ``SampledToken`` with its logprobs
        when the row asked for them."""
        if self.embedding is not None:  # one vector per row (every row is an input's)
            values = array("f")
            values.frombytes(bytes(raws[0]))
            size = len(values) // len(batch.seq_ids)
            return [values[row * size:(row + 1) * size] for row in batch.sample_rows]
        sampled = array("i")
        sampled.frombytes(bytes(raws[0][: 4 * len(batch.seq_ids)]))
        if len(raws) == 1:
            return [sampled[row] for row in batch.sample_rows]
        K = self._top_k_compiled
        lp, ids = array("f"), array("i")
        lp.frombytes(bytes(raws[1]))
        ids.frombytes(bytes(raws[2]))
        out: list = []
        for row, s in zip(batch.sample_rows, batch.sampling):
            if s.num_top_logprobs < 0:
                out.append(sampled[row])
                continue
            top = tuple((ids[row * K + j], lp[row * (K + 1) + 1 + j])
                        for j in range(min(s.num_top_logprobs, K)))
            out.append(SampledToken(sampled[row], lp[row * (K + 1)], top))
        return out

    def step(self, batch: Batch) -> list:
        writes, dispatches, reads, key = self._step_call(batch)
        t0 = time.perf_counter()
        raws = self.backend.run(writes, dispatches, reads, key)
        self.timings.record(self._plan_ms, (time.perf_counter() - t0) * 1e3)
        return self._sampled(raws, batch)

    @property
    def steps_async(self) -> bool:
        """Whether a step must be awaited: the backend reads back through a promise."""
        return self.backend.reads_async

    async def step_async(self, batch: Batch) -> list:
        """The same step for an event loop: a backend that ``reads_async`` (WebGPU in a
        worker, whose readback is a promise) is awaited; otherwise the step runs inline."""
        if not self.backend.reads_async:
            return self.step(batch)
        writes, dispatches, reads, key = self._step_call(batch)
        t0 = time.perf_counter()
        raws = await self.backend.run_async(writes, dispatches, reads, key)
        self.timings.record(self._plan_ms, (time.perf_counter() - t0) * 1e3)
        return self._sampled(raws, batch)

    def read_logits(self, batch: Batch) -> list[list[float]]:
        """Run ``forward`` only and return the logits rows (tests and perplexity; slow path)."""
        key: list = []
        writes, dispatches, logits = self._forward_call(batch, key)
        (raw,) = self.backend.run(writes, dispatches,
                                  [Read(logits.buffer, logits.offset, logits.nbytes)], tuple(key))
        flat = array("f")
        flat.frombytes(bytes(raw))
        v = logits.shape[1]
        return [list(flat[i * v:(i + 1) * v]) for i in range(logits.shape[0])]
