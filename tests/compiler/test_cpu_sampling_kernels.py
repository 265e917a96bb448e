"""The CPU twins of the sampling kernels (``*_prim_func_cpu`` in compiler/sampling.py and
compiler/logits.py), built for LLVM and run through TVM's CPU runtime, against their GPU kernels
run on wgpu (lavapipe) through the GPU tests' harness, and against float64 / transformers
references: same parameters, same tokens, same processed logits, same logprobs."""

from __future__ import annotations

import functools
import inspect

import numpy as np
import pytest

from .kernel_harness import KernelRunner, compile_prim, device
from .test_logits_kernels import _pack, _reference, _row_cases
from .test_sampling_kernel import GREEDY_EPS, Ambiguous

from wick.compiler.logits import (  # noqa: E402
    LOGPROBS_PARAM_ORDER,
    MASKED,
    PROCESS_PARAM_ORDER,
    bitmask_words,
    logprobs_prim_func,
    logprobs_prim_func_cpu,
    process_logits_prim_func,
    process_logits_prim_func_cpu,
)
from wick.compiler.sampling import (  # noqa: E402
    PARAM_ORDER,
    sampling_prim_func,
    sampling_prim_func_cpu,
)
from wick.engine.batch import MAX_TOP_LOGPROBS as K  # noqa: E402
from wick.engine.sequence import logit_adjustments  # noqa: E402

tvm = pytest.importorskip("tvm")
torch = pytest.importorskip("torch")

CPU_TARGET = {"kind": "llvm", "num-cores": 2}
U_MAX = float(np.float32(0.99999994))  # the largest f32 below 1


# --------------------------------------------------------------------------------------------
# building and running
# --------------------------------------------------------------------------------------------
class CpuKernel:
    """A CPU PrimFunc built on its own; ``run(arrays)`` takes the arrays in parameter order
    (inputs, then preallocated outputs) and returns every array after the call."""

    def __init__(self, func):
        self.name = str(func.attrs["global_symbol"])
        self.mod = tvm.tirx.build(tvm.IRModule({self.name: func}),
                                  target=tvm.target.Target(CPU_TARGET))

    def run(self, arrays):
        tensors = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
        self.mod[self.name](*tensors)
        return [t.numpy() for t in tensors]


MAKERS = {  # kind -> (GPU kernel, CPU twin, parameter order)
    "sample": (sampling_prim_func, sampling_prim_func_cpu, PARAM_ORDER),
    "process": (process_logits_prim_func, process_logits_prim_func_cpu, PROCESS_PARAM_ORDER),
    "logprobs": (logprobs_prim_func, logprobs_prim_func_cpu, LOGPROBS_PARAM_ORDER),
}


@functools.lru_cache(maxsize=None)
def prim_funcs(kind: str, V: int, *dtype: str):
    """(GPU PrimFunc, CPU PrimFunc), parsed once per test session."""
    gpu, cpu, _ = MAKERS[kind]
    return gpu(V, *dtype), cpu(V, *dtype)


class Pair:
    """The GPU kernel (lavapipe) and its CPU twin, fed the same named arrays."""

    def __init__(self, kind, V, *dtype):
        gpu_func, cpu_func = prim_funcs(kind, V, *dtype)
        self.order = MAKERS[kind][2]
        self.gpu = KernelRunner(compile_prim(gpu_func, self.order))
        self.cpu = CpuKernel(cpu_func)

    def __call__(self, arrays: dict, outputs: tuple[str, ...]):
        b = arrays[self.order[0]].shape[0]
        got_gpu = self.gpu.run(arrays, {"b": b})
        got_cpu = dict(zip(self.order, self.cpu.run([arrays[n] for n in self.order])))
        return {n: got_cpu[n] for n in outputs}, {n: got_gpu[n] for n in outputs}


def sample(pair, logits, temp, top_p, top_k, min_p, uni):
    b = logits.shape[0]
    arrays = {
        "logits": logits, "temperature": np.asarray(temp, np.float32),
        "top_p": np.asarray(top_p, np.float32), "top_k": np.asarray(top_k, np.int32),
        "min_p": np.asarray(min_p, np.float32), "uniform": np.asarray(uni, np.float32),
        "token": np.full(b, -7, np.int32),
    }
    cpu, gpu = pair(arrays, ("token",))
    return cpu["token"], gpu["token"]


# --------------------------------------------------------------------------------------------
# float64 reference of sample_token's rule, min-p included (the GPU test's ref_row has none)
# --------------------------------------------------------------------------------------------
def reference_token(row, t, top_p, top_k, min_p, u, tol=2e-6):
    """The token by the rule in compiler/sampling.py's docstring, with the kernels' own f32
    z = (l - max) * (1 / t) but exp and sums in float64. Raises Ambiguous where a threshold,
    the min-p bound or a CDF boundary lies within `tol` (relative) of deciding differently:
    there either kernel's f32 exp / summation order may legitimately go either way."""
    V = row.size
    x = row.astype(np.float32)
    if not np.float32(t) > np.float32(GREEDY_EPS):
        return int(np.argmax(x))
    inv_t = np.float32(1) / np.maximum(np.float32(t), np.float32(GREEDY_EPS))
    with np.errstate(over="ignore", invalid="ignore"):  # MASKED rows: z = -inf, as in f32
        z = ((x - x.max()) * inv_t).astype(np.float64)
    e = np.exp(z)

    def near(a, b):
        return a != b and abs(a - b) <= tol * max(a, b)

    s = np.sort(e)[::-1]
    tau = 0.0
    if 0 < top_k < V:
        tau = max(tau, s[top_k - 1])
        if near(s[top_k - 1], s[top_k]):
            raise Ambiguous("top_k near-tie")
    if np.float32(top_p) < 1:
        # the GPU keeps the largest tau with kept mass >= target: a whole group of equal e
        # values is in or out, so boundaries lie at the ends of such groups
        target = float(np.float32(top_p)) * e.sum()
        neg_vals, first = np.unique(-s, return_index=True)
        ends = np.append(first[1:], V) - 1
        mass = np.cumsum(s)[ends]
        g = min(int(np.searchsorted(mass, target, side="left")), len(mass) - 1)
        tau = max(tau, -neg_vals[g])
        if mass[g] - target < tol * mass[-1] or (g > 0 and target - mass[g - 1] < tol * mass[-1]):
            raise Ambiguous("top_p mass boundary")
        if g + 1 < len(mass) and near(-neg_vals[g], -neg_vals[g + 1]):
            raise Ambiguous("top_p near-tie")
    mp = min(max(float(np.float32(min_p)), 0.0), 1.0)
    if mp > 0:
        tau = max(tau, mp)
        if any(near(v, mp) for v in e[np.abs(e - mp) <= tol * mp]):
            raise Ambiguous("min_p bound")
    kept = e >= tau
    cdf = np.cumsum(np.where(kept, e, 0.0))
    total = cdf[-1]
    target = max(float(np.float32(u)), 0.0) * total
    last = int(np.nonzero(kept)[0][-1])
    i = int(np.searchsorted(cdf, target, side="right"))  # first cdf[i] > target
    if i >= V:
        return last  # rounding ran off the end: the kernels' fallback
    if target == 0.0:
        if e[i] < 1e-30:
            raise Ambiguous("first kept token underflows in f32")
        return i
    if i > 0 and target - cdf[i - 1] < tol * total:
        raise Ambiguous("cdf boundary below")
    if i != last and cdf[i] - target < tol * total:
        raise Ambiguous("cdf boundary above")
    return i


def make_rows(V: int, rows: int, seed: int):
    """Logit rows and per-row parameters mixing every rule; parameters that make a row
    ambiguous (see reference_token) are redrawn, so every expected token is exact."""
    rng = np.random.default_rng(seed)
    logits = np.zeros((rows, V), np.float32)
    for r in range(rows):
        style = (r + r // 12) % 6  # shifts against the 12 kinds below: every pairing occurs
        x = rng.standard_normal(V) * rng.choice([0.5, 2.5, 5.0])
        if style == 1:
            x[rng.integers(0, V, 8)] += 9.0  # a few dominant tokens
        elif style == 2:
            x = np.round(x * 2) / 2  # coarse grid: many exact ties
        elif style == 3:
            x[rng.random(V) < 0.5] = -np.inf  # grammar-style mask
        elif style == 4:
            x[rng.random(V) < 0.5] = MASKED  # apply_logit_rules' mask value
        elif style == 5 and r % 2 == 1 and V * 2e-6 < 0.1:
            x[:] = 1.25  # every token tied (each CDF step 1/V of the mass: not too small)
        logits[r] = x
    tie_row = 0
    logits[tie_row, [V // 3, 7 % V]] = logits[tie_row].max() + 1.0  # argmax tie -> smaller id

    kinds = ["greedy", "temp", "top_k", "top_p", "min_p", "k_p", "p_min_p", "all", "top_k1",
             "top_p_tiny", "inactive", "u_edge"]
    cols = {n: np.zeros(rows, np.float32) for n in ("temp", "top_p", "min_p", "uni")}
    top_k = np.zeros(rows, np.int32)
    expect = np.zeros(rows, np.int32)
    for r in range(rows):
        kind = "greedy" if r == tie_row else kinds[r % len(kinds)]
        for _attempt in range(300):
            t = float(rng.choice([0.3, 0.7, 1.0, 1.6, 3.0]))
            if kind == "greedy":
                t = float(rng.choice([0.0, 1e-6, GREEDY_EPS]))
            k, p, mp = 0, 1.0, 0.0
            if kind in ("top_k", "k_p", "all"):
                k = int(rng.choice([2, 5, 40, max(V // 3, 1), V - 1]))
            if kind in ("top_p", "k_p", "p_min_p", "all"):
                p = float(rng.choice([0.05, 0.3, 0.6, 0.9, 0.97]) + rng.uniform(-0.02, 0.02))
            if kind in ("min_p", "p_min_p", "all"):
                mp = float(rng.choice([0.01, 0.05, 0.2, 0.5, 1.0]) * rng.uniform(0.8, 1.0))
            if kind == "top_k1":
                k = 1
            if kind == "top_p_tiny":
                p = float(rng.choice([1e-6, 0.0, -0.5]))
            if kind == "inactive":
                k = int(rng.choice([0, V, V + 5, -1]))
                p = float(rng.choice([1.0, 1.5]))
                mp = float(rng.choice([0.0, -0.3]))
            u = float(np.float32(rng.random()))
            if kind == "u_edge":
                u = float(rng.choice([0.0, U_MAX]))
                k = int(rng.choice([0, 10]))
            try:
                expect[r] = reference_token(logits[r], t, p, k, mp, u)
            except Ambiguous:
                continue
            break
        else:
            raise AssertionError(f"row {r}: could not draw unambiguous parameters")
        cols["temp"][r], cols["top_p"][r], cols["min_p"][r], cols["uni"][r] = t, p, mp, u
        top_k[r] = k
    return logits, cols["temp"], cols["top_p"], top_k, cols["min_p"], cols["uni"], expect


def check_tokens(cpu, gpu, expect, params):
    bad = np.nonzero((cpu != gpu) | (cpu != expect))[0]
    assert bad.size == 0, [
        (int(r), "cpu", int(cpu[r]), "gpu", int(gpu[r]), "ref", int(expect[r]),
         *(float(p[r]) for p in params)) for r in bad[:10]
    ]


# --------------------------------------------------------------------------------------------
# fixtures: each kernel compiled once per vocabulary
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[77, 4133])
def vocab(request):
    return request.param


@pytest.fixture(scope="module")
def sampler(vocab):
    return vocab, Pair("sample", vocab)


@pytest.fixture(scope="module")
def processor(vocab):
    return vocab, Pair("process", vocab)


@pytest.fixture(scope="module", params=[13, 4133])  # 13 < K: fewer tokens than asked for
def logprobber(request):
    return request.param, Pair("logprobs", request.param)


# --------------------------------------------------------------------------------------------
# parameters: the compiler swaps one function for the other by name
# --------------------------------------------------------------------------------------------
def signature(func):
    return {
        "global_symbol": str(func.attrs["global_symbol"]),
        "params": [(p.name, str(p.dtype), [(str(s), str(s.ty)) for s in p.shape], p.scope(),
                    [str(s) for s in p.strides], str(p.elem_offset), p.data_alignment,
                    p.offset_factor) for p in func.params],
    }


@pytest.mark.parametrize("kind, V", [(kind, V) for kind in ("sample", "process", "logprobs")
                                     for V in (13 if kind == "logprobs" else 77, 4133)])
def test_signature_matches_gpu(kind, V):
    gpu, cpu = prim_funcs(kind, V)
    assert signature(cpu) == signature(gpu)
    assert cpu.attrs["tirx.is_scheduled"] and cpu.attrs["tirx.noalias"]
    text = cpu.script()
    assert "T.parallel" in text
    for gpu_only in ("thread_binding", "shared", "local", "storage_sync"):
        assert gpu_only not in text, gpu_only


def test_sampling_signature_per_dtype():
    gpu16, cpu16 = prim_funcs("sample", 4133, "float16")
    assert signature(cpu16) == signature(gpu16)
    assert signature(cpu16)["params"][0][1] == "float16"
    # the default logits dtype is float32, as the GPU kernel's
    for make in (sampling_prim_func, sampling_prim_func_cpu):
        assert inspect.signature(make).parameters["logits_dtype"].default == "float32"


# --------------------------------------------------------------------------------------------
# sample_token
# --------------------------------------------------------------------------------------------
def test_tokens_match_gpu_and_reference(sampler):
    V, pair = sampler
    logits, temp, top_p, top_k, min_p, uni, expect = make_rows(V, 96, seed=V)
    cpu, gpu = sample(pair, logits, temp, top_p, top_k, min_p, uni)
    check_tokens(cpu, gpu, expect, (temp, top_p, top_k, min_p, uni))
    assert expect[0] == min(V // 3, 7 % V)  # the argmax tie went to the smaller index
    assert len(set(cpu.tolist())) > 20  # really sampling, not collapsing to a few tokens


def test_one_distribution_many_uniforms(sampler):
    """One row, 64 uniforms, under top-p + top-k + min-p: the inverse CDF walks the same."""
    V, pair = sampler
    rng = np.random.default_rng(17)
    row = (rng.standard_normal(V) * 2.0).astype(np.float32)
    rows = 64
    temp = np.full(rows, 0.8, np.float32)
    top_p = np.where(np.arange(rows) % 2 == 0, 0.9, 1.0).astype(np.float32)
    top_k = np.where(np.arange(rows) % 4 < 2, 0, min(50, V - 1)).astype(np.int32)
    min_p = np.where(np.arange(rows) % 3 == 0, 0.02, 0.0).astype(np.float32)
    uni = np.zeros(rows, np.float32)
    expect = np.zeros(rows, np.int32)
    for r in range(rows):
        while True:
            u = float(np.float32(rng.random()))
            try:
                expect[r] = reference_token(row, temp[r], top_p[r], int(top_k[r]), min_p[r], u)
                uni[r] = u
                break
            except Ambiguous:
                pass
    cpu, gpu = sample(pair, np.repeat(row[None], rows, 0), temp, top_p, top_k, min_p, uni)
    check_tokens(cpu, gpu, expect, (top_p, top_k, min_p, uni))


def test_degenerate_filters_and_uniform_extremes(sampler):
    """top_k = 1, a tiny top_p and min_p >= 1 (clamped to 1) keep exactly the tokens tied at the
    max; u = 0 picks the first kept token with e > 0, u -> 1 the last kept one, and u >= 1 (the
    walk runs off its chunk) falls back to the last kept token."""
    V, pair = sampler
    rng = np.random.default_rng(23)
    specs = []  # (tie at max, leading -inf, temperature, top_k, top_p, min_p, uniform)
    for u in (0.0, U_MAX, 1.0):
        specs += [(True, False, 1.0, 1, 1.0, 0.0, u), (True, False, 0.5, 0, 1e-7, 0.0, u),
                  (True, False, 2.0, 0, 1.0, 1.0, u), (True, False, 1.0, 0, 1.0, 1.5, u),
                  (False, False, 1.0, min(10, V - 1), 1.0, 0.0, u),
                  (False, True, 0.7, 0, 1.0, 0.0, u), (False, True, 1.0, 0, 0.5, 0.0, u)]
    specs.append((False, False, 1.0, min(10, V - 1), 1.0, 0.0, 1.5))
    rows = len(specs)
    logits = (rng.standard_normal((rows, V)) * 3).astype(np.float32)
    for r, (tie, lead, *_rest) in enumerate(specs):
        if tie:
            logits[r, [V // 2, V - 1]] = logits[r].max() + 0.5
        if lead:
            logits[r, :5] = -np.inf
    temp, top_k, top_p, min_p, uni = (np.array(c) for c in list(zip(*specs))[2:])
    cpu, gpu = sample(pair, logits, temp, top_p, top_k, min_p, uni)
    np.testing.assert_array_equal(cpu, gpu)
    for r, (tie, lead, t, k, p, mp, u) in enumerate(specs):
        if lead and u >= 1:
            continue  # thousands of kept tokens: rounding picks one near the end (CPU == GPU)
        if tie:
            kept = np.array([V // 2, V - 1])
        elif k:
            kept = np.sort(np.argsort(-logits[r].astype(np.float64), kind="stable")[:k])
        elif p == 1.0:
            kept = np.arange(5, V)  # the -inf tokens are kept too (e = 0 >= tau = 0) ...
        else:
            kept = np.array([reference_token(logits[r], t, p, k, mp, 0.0)])
        want = kept[0] if u == 0 else kept[-1]  # ... but u = 0 needs e > 0
        if lead and p < 1:
            want = reference_token(logits[r], t, p, k, mp, u)
        assert cpu[r] == want, (r, specs[r], cpu[r], kept)


def test_signed_zeros_and_masked_rows(sampler):
    """-0.0 == +0.0 (the argmax takes the first, both are kept); rows masked to -inf or to
    MASKED, sampled or not, give the GPU's token."""
    V, pair = sampler
    rng = np.random.default_rng(29)
    rows = 8
    logits = (-1.0 - rng.random((rows, V))).astype(np.float32)
    logits[:3, 1] = -0.0
    logits[:3, 3] = 0.0
    logits[3:5] = -np.inf
    logits[3, V - 2] = -1e30
    logits[5:7] = MASKED
    logits[5, 4] = 2.0
    temp = np.array([0, 1, 1, 0, 1, 0, 0.7, 1], np.float32)
    top_k = np.array([0, 1, 1, 0, 3, 0, 0, 0], np.int32)
    top_p = np.array([1, 1, 1, 1, 1, 1, 0.5, 1], np.float32)
    uni = np.array([0, U_MAX, 0, 0.5, 0.5, 0.5, 0.5, 0.5], np.float32)
    cpu, gpu = sample(pair, logits, temp, top_p, top_k, np.zeros(rows), uni)
    np.testing.assert_array_equal(cpu, gpu)
    np.testing.assert_array_equal(cpu[:4], [1, 3, 1, V - 2])
    assert cpu[5] == 4 and cpu[6] == V // 2  # all MASKED: all tied, uniform over the row


def test_threshold_is_exact(sampler):
    """The (k+1)-th token's e sits a few ulps below the k-th and has the highest index: u -> 1
    returns it iff a threshold is even slightly too low (the GPU test's exactness case)."""
    V, pair = sampler  # (77 or 4133 tokens)
    rng = np.random.default_rng(19)
    k = 6
    row = (rng.standard_normal(V) - 20.0).astype(np.float32)
    top_idx = np.sort(rng.choice(V - 1, k, replace=False))
    row[top_idx] = np.linspace(0.0, -0.5, k).astype(np.float32)
    row[V - 1] = np.float32(-0.5) - np.float32(1e-6)
    e = np.exp(row.astype(np.float64) - row.max())
    s = np.sort(e)[::-1]
    p = np.float32((s[: k - 1].sum() + 0.5 * s[k - 1]) / e.sum())
    top_k = np.array([k, 0, k, k + 1, 0], np.int32)
    top_p = np.array([1.0, p, p, 1.0, 1.0], np.float32)
    min_p = np.array([0, 0, 0, 0, s[k - 1] * (1 - 5e-7)], np.float32)  # ~8 ulps below
    rows = len(top_k)
    cpu, gpu = sample(pair, np.repeat(row[None], rows, 0), np.ones(rows), top_p, top_k, min_p,
                      np.full(rows, U_MAX))
    np.testing.assert_array_equal(gpu, [top_idx[-1]] * 3 + [V - 1, top_idx[-1]])
    np.testing.assert_array_equal(cpu, gpu)


def test_float16_logits():
    V = 4133
    pair = Pair("sample", V, "float16")
    if "shader-f16" not in device().features:
        pytest.skip("device lacks shader-f16")
    logits, temp, top_p, top_k, min_p, uni, _ = make_rows(V, 24, seed=3)
    with np.errstate(over="ignore"):
        l16 = logits.astype(np.float16)  # MASKED -> -inf
    keep, expect = [], []
    for r in range(l16.shape[0]):
        try:
            expect.append(reference_token(l16[r].astype(np.float32), temp[r], top_p[r],
                                          int(top_k[r]), min_p[r], uni[r]))
            keep.append(r)
        except Ambiguous:
            pass
    assert len(keep) >= 16
    cpu, gpu = sample(pair, l16, temp, top_p, top_k, min_p, uni)
    check_tokens(cpu[keep], gpu[keep], np.array(expect), (temp[keep], top_p[keep]))


# --------------------------------------------------------------------------------------------
# apply_logit_rules
# --------------------------------------------------------------------------------------------
def process_inputs(V, rng):
    cases = _row_cases(V, rng)
    allowed_none = np.zeros(V, bool)
    allowed_none[int(rng.integers(0, V))] = True  # a grammar that allows a single token
    cases.append((cases[2][0], cases[2][1], cases[2][2], allowed_none))
    b = len(cases)
    logits = (rng.standard_normal((b, V)) * 3).astype(np.float32)
    mask = rng.integers(-2**31, 2**31, (b, bitmask_words(V)), dtype=np.int64).astype(np.int32)
    mask_on = np.zeros(b, np.int32)
    indptr, tokens, rep, add = [0], [], [], []
    for r, (params, prompt, output, allowed) in enumerate(cases):
        counts: dict[int, int] = {}
        for t in output:
            counts[t] = counts.get(t, 0) + 1
        for t, f, a in logit_adjustments(params, frozenset(prompt), counts):
            tokens.append(t)
            rep.append(f)
            add.append(a)
        indptr.append(len(tokens))
        if allowed is not None:  # rows without a grammar keep random bits: mask_on = 0 wins
            mask[r] = _pack(allowed)
            mask_on[r] = 1
    arrays = {"logits": logits, "mask": mask, "mask_on": mask_on,
              "indptr": np.array(indptr, np.int32), "tokens": np.array(tokens, np.int32),
              "rep": np.array(rep, np.float32), "add": np.array(add, np.float32),
              "out": np.full((b, V), 7.0, np.float32)}
    return cases, arrays


def test_processed_logits_match_gpu_and_transformers(processor):
    V, pair = processor
    cases, arrays = process_inputs(V, np.random.default_rng(V + 1))
    cpu, gpu = pair(arrays, ("out",))
    np.testing.assert_array_equal(cpu["out"], gpu["out"])  # bit for bit
    logits = arrays["logits"]
    np.testing.assert_array_equal(cpu["out"][0], logits[0])
    for r, (params, prompt, output, allowed) in enumerate(cases):
        want = _reference(logits[r], params, prompt, output, allowed)
        masked = ~np.isfinite(want)
        np.testing.assert_array_equal(cpu["out"][r] == np.float32(MASKED), masked, f"row {r}")
        np.testing.assert_allclose(cpu["out"][r][~masked], want[~masked], rtol=1e-6, atol=1e-4,
                                   err_msg=f"row {r}")


def test_processed_logits_empty_batch_entries(processor):
    """No sparse entry at all (nnz = 0) and no mask: a plain copy on both."""
    V, pair = processor
    b = 3
    logits = np.random.default_rng(2).standard_normal((b, V)).astype(np.float32)
    arrays = {"logits": logits, "mask": np.zeros((b, bitmask_words(V)), np.int32),
              "mask_on": np.zeros(b, np.int32), "indptr": np.zeros(b + 1, np.int32),
              "tokens": np.zeros(0, np.int32), "rep": np.zeros(0, np.float32),
              "add": np.zeros(0, np.float32), "out": np.zeros((b, V), np.float32)}
    cpu, gpu = pair(arrays, ("out",))
    np.testing.assert_array_equal(cpu["out"], logits)
    np.testing.assert_array_equal(gpu["out"], logits)


# --------------------------------------------------------------------------------------------
# token_logprobs
# --------------------------------------------------------------------------------------------
TIED = (11, 5, 3)  # three tokens tied at the top of row 3: listed in ascending id order


def logprob_inputs(V, rng):
    b = 8
    logits = (rng.standard_normal((b, V)) * 4).astype(np.float32)
    logits[3, list(TIED)] = logits[3].max() + 2.0
    logits[4] = np.round(logits[4])  # many ties all down the list
    if V >= K:  # (with V < K the GPU's rounds past the end would list a -inf token again)
        logits[5, rng.random(V) < 0.7] = -np.inf
    logits[6, rng.random(V) < 0.5] = MASKED
    token = rng.integers(0, V, b).astype(np.int32)
    token[[2, 6]] = [-4, V + 3]  # out of range: clamped
    num_top = np.array([20, 0, 5, 3, K, 25, 17, -1], np.int32)
    return {"logits": logits, "token": token, "num_top": num_top,
            "logprob": np.full((b, K + 1), 7.0, np.float32),
            "top_ids": np.full((b, K), -7, np.int32)}


def check_logprobs(cpu, gpu, arrays):
    logits, token, num_top = arrays["logits"], arrays["token"], arrays["num_top"]
    V = logits.shape[1]
    np.testing.assert_array_equal(cpu["top_ids"], gpu["top_ids"])
    np.testing.assert_allclose(cpu["logprob"], gpu["logprob"], rtol=0, atol=1e-5)
    ref = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), dim=-1).numpy()
    for r in range(logits.shape[0]):
        if num_top[r] < 0:  # nothing wanted: outputs untouched
            assert (cpu["logprob"][r] == 7.0).all() and (cpu["top_ids"][r] == -7).all()
            continue
        n = min(int(num_top[r]), K)
        m = min(n, V)  # entries past the vocabulary: the GPU's empty rounds
        np.testing.assert_allclose(cpu["logprob"][r, 0], ref[r, np.clip(token[r], 0, V - 1)],
                                   rtol=0, atol=1e-4)
        order = np.lexsort((np.arange(V), -logits[r]))[:m]  # value descending, then id
        np.testing.assert_array_equal(cpu["top_ids"][r, :m], order, f"row {r}")
        np.testing.assert_allclose(cpu["logprob"][r, 1:m + 1], ref[r, order], atol=1e-4)
        assert (cpu["top_ids"][r, m:n] == 2**31 - 1).all()
        assert (cpu["logprob"][r, m + 1:n + 1] == np.float32(-3e38)).all()
        assert (cpu["logprob"][r, n + 1:] == 7.0).all() and (cpu["top_ids"][r, n:] == -7).all()


def test_logprobs_match_gpu_and_torch(logprobber):
    V, pair = logprobber
    arrays = logprob_inputs(V, np.random.default_rng(V + 2))
    cpu, gpu = pair(arrays, ("logprob", "top_ids"))
    check_logprobs(cpu, gpu, arrays)
    np.testing.assert_array_equal(cpu["top_ids"][3, :3], sorted(TIED))
    if V < K:
        assert (cpu["top_ids"][0, V:] == 2**31 - 1).all()  # the vocabulary ran out


# --------------------------------------------------------------------------------------------
# the largest vocabulary, once
# --------------------------------------------------------------------------------------------
def test_vocab_262144():
    V = 262144
    pair = Pair("sample", V)
    logits, temp, top_p, top_k, min_p, uni, expect = make_rows(V, 9, seed=1)
    cpu, gpu = sample(pair, logits, temp, top_p, top_k, min_p, uni)
    check_tokens(cpu, gpu, expect, (temp, top_p, top_k, min_p, uni))
    lp = Pair("logprobs", V)
    arrays = logprob_inputs(V, np.random.default_rng(4))
    cpu, gpu = lp(arrays, ("logprob", "top_ids"))
    check_logprobs(cpu, gpu, arrays)
