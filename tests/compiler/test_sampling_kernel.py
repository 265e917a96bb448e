"""The GPU sampling kernel (compiler/sampling.py): TIR -> WGSL the way wick lowers kernels, run on
wgpu (lavapipe here), compared token-for-token with an exact numpy (float64, sort-based) reference."""

from __future__ import annotations

import importlib
import json
import re
import time

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
wgpu = pytest.importorskip("wgpu")

from tvm import tirx  # noqa: E402

try:
    from wick.compiler.sampling import PARAM_ORDER, sampling_prim_func
except ImportError:  # plain checkout without `pip install -e .`
    import importlib.util as _ilu
    from pathlib import Path as _Path

    _spec = _ilu.spec_from_file_location(
        "wick_compiler_sampling", _Path(__file__).resolve().parents[2] / "compiler" / "sampling.py"
    )
    _sampling = _ilu.module_from_spec(_spec)
    _spec.loader.exec_module(_sampling)
    PARAM_ORDER, sampling_prim_func = _sampling.PARAM_ORDER, _sampling.sampling_prim_func

GREEDY_EPS = 1e-5


# --------------------------------------------------------------------------------------------
# compile: TIR -> (host call order, WGSL) exactly as wick's lowering does it
# --------------------------------------------------------------------------------------------
def compile_kernel(vocab_size: int, logits_dtype: str = "float32") -> dict:
    func = sampling_prim_func(vocab_size, logits_dtype)
    assert func.attrs["global_symbol"] == "sample_token"
    assert [p.name for p in func.params] == list(PARAM_ORDER)
    mod = tvm.IRModule({"sample_token": func})
    target = tvm.target.Target({"kind": "webgpu"}, host={"kind": "llvm"})
    mod = tirx.transform.BindTarget(target)(mod)
    pipe, _fin_host, fin_dev = tirx.get_tir_pipeline("s_tir")
    identity = tvm.transform.module_pass(lambda m, _ctx: m, opt_level=0, name="WickIdentity")
    replaced = ("MakePackedAPI", "FP8StorageLegalize", "BF16StorageLegalize")
    saved = {n: getattr(tirx.transform, n) for n in replaced}
    try:
        for n in replaced:
            setattr(tirx.transform, n, lambda: identity)
        lowered = pipe(mod)
    finally:
        for n, f in saved.items():
            setattr(tirx.transform, n, f)
    build = importlib.import_module("tvm.tirx.build")
    host_mod, dev_mods = build.split_host_device_mods(lowered)
    host_funcs, kernels = {}, {}
    for m in [host_mod, *dev_mods.values()]:
        for gv, f in m.functions.items():
            cc = f.attrs.get("calling_conv", None) if f.attrs is not None else None
            (kernels if cc is not None and int(cc) == 2 else host_funcs)[gv] = f
    assert [gv.name_hint for gv in kernels] == ["sample_token_kernel"]
    assert [gv.name_hint for gv in host_funcs] == ["sample_token"]
    dev_mod = fin_dev()(tvm.IRModule(kernels))
    rt = tvm.get_global_func("target.build.webgpu")(dev_mod, tvm.target.Target({"kind": "webgpu"}))
    wgsl = rt.inspect_source()
    info = json.loads(rt.inspect_source("func_info"))["sample_token_kernel"]

    # host call: T.call_ffi_kernel("sample_token_kernel", bufs.data..., scalars..., extents...)
    host_text = list(host_funcs.values())[0].script()
    call = re.search(r'T\.call_ffi_kernel\("sample_token_kernel", (.*?), launch_params=', host_text)
    assert call, host_text
    args = [a.strip() for a in call.group(1).split(",")]
    buffers = [re.sub(r"(_\d+)?\.data$", "", a) for a in args if a.endswith(".data")]
    scalars = [a for a in args if not a.endswith(".data")]
    n_pod = sum(1 for t in info["arg_types"] if t != "handle")
    assert len(buffers) == info["arg_types"].count("handle") == len(PARAM_ORDER)
    assert sorted(buffers) == sorted(PARAM_ORDER)
    tags = info["launch_param_tags"]
    assert tags[:2] == ["blockIdx.x", "threadIdx.x"]
    write = json.loads(tags[2].split(":", 1)[1])
    access = ["read_write" if w else "read" for w in write]
    # WGSL declarations agree with the host binding order and access modes
    decl = re.findall(r"@binding\((\d+)\) var<storage, (read|read_write)> (\w+)_ptr", wgsl)
    assert [(int(i), acc, name) for i, acc, name in decl] == [
        (i, access[i], buffers[i]) for i in range(len(buffers))
    ]
    assert f"@binding({len(buffers)}) var<uniform> podArgs" in wgsl
    assert "@workgroup_size(256, 1, 1)" in wgsl
    return {
        "wgsl": wgsl,
        "buffers": buffers,  # kernel binding order
        "access": access,
        "pod": scalars[:n_pod],  # e.g. ["b"]
        "launch": scalars[n_pod:],  # one per launch param: ["b", "256"]
    }


# --------------------------------------------------------------------------------------------
# a minimal wgpu runner (one dispatch)
# --------------------------------------------------------------------------------------------
_DEVICE = None


def _device():
    global _DEVICE
    if _DEVICE is None:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            pytest.skip("no wgpu adapter")
        feats = ["shader-f16"] if "shader-f16" in adapter.features else []
        _DEVICE = adapter.request_device_sync(required_features=feats)
    return _DEVICE


class Runner:
    def __init__(self, compiled: dict):
        dev = _device()
        self.c = compiled
        usage = wgpu.BufferBindingType
        entries = [
            {
                "binding": i,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {
                    "type": usage.storage if acc == "read_write" else usage.read_only_storage
                },
            }
            for i, acc in enumerate(compiled["access"])
        ]
        entries.append(
            {
                "binding": len(entries),
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {"type": usage.uniform},
            }
        )
        self.bgl = dev.create_bind_group_layout(entries=entries)
        shader = dev.create_shader_module(code=compiled["wgsl"])
        self.pipeline = dev.create_compute_pipeline(
            layout=dev.create_pipeline_layout(bind_group_layouts=[self.bgl]),
            compute={"module": shader, "entry_point": "sample_token_kernel"},
        )

    def __call__(self, logits, temperature, top_p, top_k, uniform, repeat: int = 1):
        dev = _device()
        b = logits.shape[0]
        host = {
            "logits": logits,
            "temperature": np.ascontiguousarray(temperature, np.float32),
            "top_p": np.ascontiguousarray(top_p, np.float32),
            "top_k": np.ascontiguousarray(top_k, np.int32),
            "uniform": np.ascontiguousarray(uniform, np.float32),
            "token": np.full(b, -7, np.int32),
        }
        BU = wgpu.BufferUsage
        bufs = [
            dev.create_buffer_with_data(
                data=np.ascontiguousarray(host[n]).tobytes(),
                usage=BU.STORAGE | BU.COPY_SRC | BU.COPY_DST,
            )
            for n in self.c["buffers"]
        ]
        env = {"b": b}
        pod = [int(env[s]) if s in env else int(s) for s in self.c["pod"]]
        grid_x = int(env.get(self.c["launch"][0], self.c["launch"][0]))
        assert grid_x < 65536
        ubytes = np.array(pod, np.int32).tobytes() + np.array([grid_x], np.uint32).tobytes()
        ubuf = dev.create_buffer_with_data(data=ubytes, usage=BU.UNIFORM)
        bg = dev.create_bind_group(
            layout=self.bgl,
            entries=[
                {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
                for i, buf in enumerate([*bufs, ubuf])
            ],
        )
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(self.pipeline)
        cp.set_bind_group(0, bg)
        for _ in range(repeat):
            cp.dispatch_workgroups(grid_x, 1, 1)
        cp.end()
        dev.queue.submit([enc.finish()])
        out = bufs[self.c["buffers"].index("token")]
        return np.frombuffer(dev.queue.read_buffer(out), np.int32).copy()


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
    if "shader-f16" not in _device().features:
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


def test_timing_report(kernel, capsys):
    """Not an assertion on speed: prints ms/row on this device for the report."""
    V, run = kernel
    rows = 32
    logits, temp, top_p, top_k, uni, _ = make_batch(V, rows, seed=1, tol=0)
    run(logits, temp, top_p, top_k, uni)  # warm
    t0 = time.perf_counter()
    run(logits, temp, top_p, top_k, uni, repeat=1)
    t1 = time.perf_counter()
    run(logits, temp, top_p, top_k, uni, repeat=3)
    t2 = time.perf_counter()
    per_row = ((t2 - t1) - (t1 - t0)) / 2 / rows * 1e3
    with capsys.disabled():
        print(f"\n[sample_token V={V}] {per_row:.3f} ms/row ({rows} rows/dispatch, "
              f"{(t1 - t0) * 1e3:.1f} ms one dispatch incl. upload+readback)")
