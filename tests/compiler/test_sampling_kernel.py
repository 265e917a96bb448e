"""The GPU sampling kernel (compiler/sampling.py): TIR -> WGSL the way wick lowers kernels, run on
wgpu (lavapipe here), compared token-for-token with an exact numpy (float64, sort-based) reference."""

from __future__ import annotations

import numpy as np
import pytest

from .kernel_harness import KernelRunner, compile_prim, device

from wick.compiler.sampling import PARAM_ORDER, sampling_prim_func  # noqa: E402

GREEDY_EPS = 1e-5


def compile_kernel(vocab_size: int, logits_dtype: str = "float32") -> dict:
    func = sampling_prim_func(vocab_size, logits_dtype)
    assert func.attrs["global_symbol"] == "sample_token"
    return compile_prim(func, PARAM_ORDER)


class Runner(KernelRunner):
    def __call__(self, logits, temperature, top_p, top_k, uniform, repeat: int = 1, min_p=None):
        b = logits.shape[0]
        arrays = {
            "logits": logits,
            "temperature": np.ascontiguousarray(temperature, np.float32),
            "top_p": np.ascontiguousarray(top_p, np.float32),
            "top_k": np.ascontiguousarray(top_k, np.int32),
            "min_p": np.ascontiguousarray(np.zeros(b) if min_p is None else min_p, np.float32),
            "uniform": np.ascontiguousarray(uniform, np.float32),
            "token": np.full(b, -7, np.int32),
        }
        return self.run(arrays, {"b": b}, repeat)["token"]


# --------------------------------------------------------------------------------------------
# exact reference (float64, sort-based thresholds, inverse CDF in index order)
# --------------------------------------------------------------------------------------------
def ref_row(logits, t, top_p, top_k, u, check=None):
    """Returns the token; with check=tol, raises Ambiguous when f32 rounding could flip it."""
    V = logits.shape[0]
    x = logits.astype(np.float64)
    if t <= GREEDY_EPS:
        return int(np.argmax(x))
    z = (x - x.max()) / float(np.float32(t))
    p = np.exp(z)
    p /= p.sum()
    s = np.sort(p)[::-1]
    tau = 0.0
    if 0 < top_k < V:
        tau = max(tau, s[top_k - 1])
        if check and top_k < V and s[top_k - 1] - s[top_k] < check * s[top_k - 1]:
            raise Ambiguous("top_k tie")
    if top_p < 1:
        c = np.cumsum(s)
        j = min(int(np.searchsorted(c, top_p, side="left")), V - 1)  # first c[j] >= top_p
        tau = max(tau, s[j])
        if check:
            near = abs(c[j] - top_p) < check or (j > 0 and abs(c[j - 1] - top_p) < check)
            if near or (j + 1 < V and s[j] - s[j + 1] < check * s[j]):
                raise Ambiguous("top_p boundary")
    q = np.where(p >= tau, p, 0.0)
    cdf = np.cumsum(q)
    target = u * cdf[-1]
    i = int(np.searchsorted(cdf, target, side="right"))  # first cdf[i] > target
    i = min(i, V - 1)
    if check:
        lo = cdf[i - 1] if i > 0 else 0.0
        if min(target - lo, cdf[i] - target) < check * cdf[-1]:
            raise Ambiguous("cdf boundary")
    return i


class Ambiguous(Exception):
    pass


def make_batch(V: int, rows: int, seed: int, tol: float = 2e-6):
    """Rows mixing greedy / temperature / top-k / top-p / both; parameters that land within
    `tol` of a threshold or CDF boundary are redrawn, so every expected token is unambiguous."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, V)) * 2.5).astype(np.float32)
    # a few peaked rows, a masked row (grammar-style -inf), a greedy tie
    logits[1, rng.integers(0, V, 8)] += 9.0
    logits[2, : V // 2] = -np.inf
    logits[3, [V // 3, 7]] = logits[3].max() + 1.0  # tie: argmax must be index 7
    temp = np.zeros(rows, np.float32)
    top_p = np.ones(rows, np.float32)
    top_k = np.zeros(rows, np.int32)
    uni = np.zeros(rows, np.float32)
    expect = np.zeros(rows, np.int32)
    kinds = ["greedy", "temp", "top_k", "top_p", "both", "k_inactive", "p_eq_1"]
    for r in range(rows):
        kind = kinds[r % len(kinds)] if r != 3 else "greedy"
        for _attempt in range(200):
            t = 0.0 if kind == "greedy" else float(rng.choice([0.3, 0.7, 1.0, 1.6]))
            if kind == "greedy" and r % 2:
                t = 1e-6
            k = 0
            p = 1.0
            if kind in ("top_k", "both"):
                k = int(rng.choice([2, 5, 40, 300, V - 1]))
            if kind in ("top_p", "both"):
                p = float(rng.choice([0.05, 0.3, 0.6, 0.9, 0.97]) + rng.uniform(-0.02, 0.02))
            if kind == "k_inactive":
                k = int(rng.choice([V, V + 5, -1]))
            u = float(np.float32(rng.random()))
            try:
                e = ref_row(logits[r], t, np.float32(p), k, u, check=tol)
            except Ambiguous:
                continue
            break
        else:
            raise AssertionError("could not draw unambiguous parameters")
        temp[r], top_p[r], top_k[r], uni[r], expect[r] = t, p, k, u, e
    return logits, temp, top_p, top_k, uni, expect


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[1000, 49152])
def kernel(request):
    V = request.param
    return V, Runner(compile_kernel(V))


def test_compile_abi():
    c = compile_kernel(1000)
    assert c["pod"] == ["b"] and c["launch"] == ["b", "256"]
    assert c["access"][c["buffers"].index("token")] == "read_write"
    assert all(a == "read" for n, a in zip(c["buffers"], c["access"]) if n != "token")
    # dynamic batch: b is a uniform scalar, V is baked in
    assert "b: i32" in c["wgsl"] and "1000i" in c["wgsl"]


def test_matches_reference(kernel):
    V, run = kernel
    logits, temp, top_p, top_k, uni, expect = make_batch(V, 64, seed=V)
    got = run(logits, temp, top_p, top_k, uni)
    bad = np.nonzero(got != expect)[0]
    assert bad.size == 0, [
        (int(r), int(got[r]), int(expect[r]), float(temp[r]), float(top_p[r]), int(top_k[r]),
         float(uni[r])) for r in bad
    ]
    assert expect[3] == 7  # tie -> smallest index


def test_many_uniforms_one_distribution(kernel):
    """The same logits row with 64 different uniforms (temperature + top-p + top-k)."""
    V, run = kernel
    rng = np.random.default_rng(7)
    row = (rng.standard_normal(V) * 2.0).astype(np.float32)
    rows = 64
    logits = np.repeat(row[None], rows, 0)
    temp = np.full(rows, 0.8, np.float32)
    top_p = np.where(np.arange(rows) % 2 == 0, np.float32(0.9), np.float32(1.0)).astype(np.float32)
    top_k = np.where(np.arange(rows) % 4 < 2, 0, 50).astype(np.int32)
    uni = np.zeros(rows, np.float32)
    expect = np.zeros(rows, np.int32)
    for r in range(rows):
        while True:
            u = float(np.float32(rng.random()))
            try:
                expect[r] = ref_row(row, temp[r], top_p[r], int(top_k[r]), u, check=2e-6)
                uni[r] = u
                break
            except Ambiguous:
                pass
    got = run(logits, temp, top_p, top_k, uni)
    np.testing.assert_array_equal(got, expect)
    assert len(set(got.tolist())) > 8  # actually sampling, not collapsing


def test_degenerate_filters_give_argmax(kernel):
    V, run = kernel
    rng = np.random.default_rng(11)
    rows = 48
    logits = (rng.standard_normal((rows, V)) * 3).astype(np.float32)
    temp = rng.choice([0.5, 1.0, 2.0, 5.0], rows).astype(np.float32)
    uni = rng.random(rows).astype(np.float32)
    uni[:4] = [0.0, np.float32(0.99999994), 0.5, 0.999]
    top_k = np.where(np.arange(rows) % 2 == 0, 1, 0).astype(np.int32)
    top_p = np.where(np.arange(rows) % 2 == 1, np.float32(1e-6), np.float32(1.0)).astype(np.float32)
    got = run(logits, temp, top_p, top_k, uni)
    np.testing.assert_array_equal(got, logits.argmax(1))


def test_uniform_extremes_stay_in_kept_set(kernel):
    """u = 0 picks the first kept token, u -> 1 the last kept token (no run-off)."""
    V, run = kernel
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(V) * 2).astype(np.float32)
    rows = 8
    logits = np.repeat(row[None], rows, 0)
    temp = np.ones(rows, np.float32)
    top_k = np.array([10, 10, 0, 0, 3, 3, 100, 100], np.int32)
    top_p = np.ones(rows, np.float32)
    uni = np.array([0.0, 0.99999994] * 4, np.float32)
    got = run(logits, temp, top_p, top_k, uni)
    for r in range(rows):
        k = int(top_k[r])
        kept = np.sort(np.argsort(-row.astype(np.float64))[:k]) if k else np.arange(V)
        assert got[r] == (kept[0] if uni[r] == 0 else kept[-1]), (r, got[r], kept[[0, -1]])


def test_threshold_is_exact_not_approximate(kernel):
    """The (k+1)-th token's probability sits ~16 ulps below the k-th one and has the highest
    index, so u -> 1 returns it iff the threshold is even slightly too low. A bisection with
    too few steps (or on the value instead of the bit pattern) fails here."""
    V, run = kernel
    rng = np.random.default_rng(19)
    k = 6
    row = (rng.standard_normal(V) - 20.0).astype(np.float32)  # negligible mass
    top_idx = np.sort(rng.choice(V - 1, k, replace=False))
    row[top_idx] = np.linspace(0.0, -0.5, k).astype(np.float32)
    row[V - 1] = np.float32(-0.5) - np.float32(1e-6)
    p64 = np.exp(row.astype(np.float64) - row.max())
    p64 /= p64.sum()
    s = np.sort(p64)[::-1]
    top_p = np.float32((s[: k - 1].sum() + 0.5 * s[k - 1]))
    rows = 4
    logits = np.repeat(row[None], rows, 0)
    temp = np.ones(rows, np.float32)
    top_k = np.array([k, 0, k, k + 1], np.int32)
    top_pp = np.array([1.0, top_p, top_p, 1.0], np.float32)
    uni = np.full(rows, 0.99999994, np.float32)
    got = run(logits, temp, top_pp, top_k, uni)
    np.testing.assert_array_equal(got, [top_idx[-1], top_idx[-1], top_idx[-1], V - 1])


def test_vocab_smaller_than_workgroup():
    V = 77
    run = Runner(compile_kernel(V))
    logits, temp, top_p, top_k, uni, expect = make_batch(V, 21, seed=5)
    logits[0] = -np.inf  # an all-masked greedy row still returns a valid index
    logits[0, 70] = -1e30
    expect[0] = 70
    got = run(logits, temp, top_p, top_k, uni)
    np.testing.assert_array_equal(got, expect)


def test_float16_logits():
    V = 1000
    c = compile_kernel(V, "float16")
    assert "f16" in c["wgsl"]
    if "shader-f16" not in device().features:
        pytest.skip("device lacks shader-f16")
    run = Runner(c)
    logits, temp, top_p, top_k, uni, _ = make_batch(V, 16, seed=3)
    l16 = np.where(np.isfinite(logits), logits, -np.inf).astype(np.float16)
    expect = []
    keep = []
    for r in range(16):
        try:
            expect.append(ref_row(l16[r].astype(np.float32), temp[r], top_p[r], int(top_k[r]),
                                  float(uni[r]), check=2e-6))
            keep.append(r)
        except Ambiguous:
            expect.append(-1)
    got = run(l16, temp, top_p, top_k, uni)
    assert len(keep) >= 8
    np.testing.assert_array_equal(got[keep], np.array(expect)[keep])
