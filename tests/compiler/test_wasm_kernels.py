"""The WebAssembly kernel set (compiler/targets/wasm.py) run under node: the q4 matmul (its
nibbles converted four lanes at a time there) against numpy on the dequantized weights, in the
plain modules and in the relaxed-SIMD ones (fused multiply-adds), a kernel's own argument check
coming back as a message, and a module that imports nothing."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from wick.compiler.targets.cpu import cpu_target
from wick.compiler.cpu_schedules import schedule
from wick.compiler.quantization import dequantize, get_quantization, quantize
from wick.compiler.targets.wasm import build_wasm_libraries, wasm_target

from .test_cpu_gemm import te_f32_matmul
from .test_cpu_gemv import expert_case, te_expert_matmul, te_matmul
from .wasm_call import RELAXED_PROBE, call, node_with_relaxed_simd

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is missing")
MADD, MUL = b"\xfd\x85\x02", b"\xfd\xe6\x01"  # f32x4.relaxed_madd, f32x4.mul


def relaxed_node() -> tuple[str, ...]:
    node = node_with_relaxed_simd()
    if node is None:
        pytest.skip("this node cannot run relaxed SIMD")
    return node


KERNELS = {"mm": (), "mm_add": ("residual",), "mm_bias_add": ("bias", "residual")}


@pytest.fixture(scope="module")
def q4_libraries(tmp_path_factory):
    """q4 matmuls alone, with a residual, and with a bias then a residual, compiled and
    linked for wasm32: {kind: (path, entry)} for the one-thread and the threaded module."""
    tmp = tmp_path_factory.mktemp("wasm")
    libraries = build_wasm_libraries({name: te_matmul(200, 320, adds=adds)
                                      for name, adds in KERNELS.items()})
    out = {}
    for kind, (data, entry) in libraries.items():
        path = tmp / f"kernels-{kind}.wasm"
        path.write_bytes(data)
        out[kind] = (path, entry)
    return out


@pytest.fixture(scope="module")
def q4_module(q4_libraries):
    return q4_libraries["wasm"]


@pytest.fixture(scope="module")
def q4_relaxed(tmp_path_factory):
    """The same kernels' one-thread module compiled with relaxed SIMD."""
    data, entry = build_wasm_libraries({name: te_matmul(200, 320, adds=adds)
                                        for name, adds in KERNELS.items()},
                                       relaxed=True)["wasm_relaxed"]
    path = tmp_path_factory.mktemp("relaxed") / "kernels-relaxed.wasm"
    path.write_bytes(data)
    return path, entry


def test_the_kinds_built_are_the_engines_list():
    from wick.compiler.targets.wasm import MODULES
    from wick.engine.artifact import WASM_KINDS

    assert tuple(MODULES) == WASM_KINDS
    assert [relaxed for _, relaxed, _ in MODULES.values()] == [False, False, True, True]


def test_relaxed_simd_fuses_the_q4_matmuls_multiply_adds(q4_module, q4_relaxed, tmp_path):
    """The relaxed module multiplies and adds in one instruction where the plain one takes two
    (the accumulation in vectors of the machine's 4 lanes, which LLVM fuses; 16-lane vectors it
    split were not), and only a browser with relaxed SIMD validates it. Its matmuls agree
    with numpy, and a row's result is the same bits alone, in a step of five and in one of nine
    (the chunked form)."""
    (plain, _), (relaxed, entry) = q4_module, q4_relaxed
    assert "+relaxed-simd" in entry["features"] and MADD in RELAXED_PROBE
    plain_bytes, relaxed_bytes = plain.read_bytes(), relaxed.read_bytes()
    muls = plain_bytes.count(MUL)
    assert muls > 100 and relaxed_bytes.count(MADD) >= 0.9 * muls
    assert relaxed_bytes.count(MUL) < 0.1 * muls
    node = relaxed_node()
    check = "process.exit(WebAssembly.validate(require('fs').readFileSync(process.argv[1])) ? 0 : 3)"
    assert subprocess.run([*node, "-e", check, str(relaxed)]).returncode == 0
    if node != ("node",):  # a node without relaxed SIMD by default: only the plain one validates,
        # and the executor's probe tells it so
        assert subprocess.run(["node", "-e", check, str(relaxed)]).returncode == 3
        probe = tmp_path / "probe.wasm"
        probe.write_bytes(RELAXED_PROBE)
        assert subprocess.run(["node", "-e", check, str(probe)]).returncode == 3
    assert subprocess.run(["node", "-e", check, str(plain)]).returncode == 0
    N, K = 200, 320
    rng = np.random.default_rng(11)
    packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32),
                                      get_quantization("q4f32_1"))
    weight = dequantize(packed, scale, minimum).astype(np.float64)
    x = rng.standard_normal((9, K)).astype(np.float32)
    res = rng.standard_normal((9, N)).astype(np.float32)
    rows = {}
    for b in (1, 5, 9):  # (9: past CHUNK_TILES' widest tiles, the chunk dequantized once)
        answer, out = call(relaxed, "mm_add", [x[:b], packed, scale, minimum, res[:b],
                                               np.zeros((b, N), np.float32)], tmp_path, node)
        assert answer["rc"] == 0, answer
        want = x[:b].astype(np.float64) @ weight.T + res[:b]
        np.testing.assert_allclose(out[-1], want, rtol=1e-5, atol=1e-4 * np.abs(want).max())
        rows[b] = out[-1]
    assert np.array_equal(rows[1][0], rows[5][0]) and np.array_equal(rows[1][0], rows[9][0])
    assert np.array_equal(rows[5], rows[9][:5])


def test_the_q4_matmul_is_wicks_kernel_converting_four_lanes_at_a_time():
    text = schedule(te_matmul(64, 96), wasm_target()).script()
    assert "q4_matmul" in text and "for c in T.unroll(4)" in text and "T.vectorized(4)" in text
    native = schedule(te_matmul(64, 96), cpu_target()).script()
    assert "for c in T.unroll(1)" in native  # (x86 converts all 16 lanes at once)


@pytest.mark.parametrize("name", list(KERNELS))
def test_q4_matmul_in_wasm_matches_numpy(q4_module, tmp_path, name):
    wasm, entry = q4_module
    assert entry["functions"] == sorted(KERNELS) and "+simd128" in entry["features"]
    adds = KERNELS[name]
    N, K = 200, 320
    rng = np.random.default_rng(7)
    packed, scale, minimum = quantize(rng.standard_normal((N, K)).astype(np.float32),
                                      get_quantization("q4f32_1"))
    weight = dequantize(packed, scale, minimum).astype(np.float64)
    for b in (1, 5):
        x = rng.standard_normal((b, K)).astype(np.float32)
        extra = {"bias": rng.standard_normal(N).astype(np.float32),
                 "residual": rng.standard_normal((b, N)).astype(np.float32)}
        want = x.astype(np.float64) @ weight.T + sum(extra[a] for a in adds)
        args = [x, packed, scale, minimum, *(extra[a] for a in adds), np.zeros((b, N), np.float32)]
        answer, out = call(wasm, name, args, tmp_path)
        assert answer["rc"] == 0, answer
        np.testing.assert_allclose(out[-1], want, rtol=1e-5, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("wide", [False, True])
def test_f32_matmul_in_wasm_matches_numpy(tmp_path, wide):
    """compiler/cpu_gemm.py's kernels in wasm32 (4 lanes: tiles of 4 rows x 2 columns, or 4
    rows in lanes x 8 columns)."""
    from wick.compiler.cpu_schedules import WIDE_BATCHES

    N, K, adds = 40, 48, ("bias", "residual")
    func = te_f32_matmul(N, K, adds=adds)
    if wide:
        func = func.with_attr(WIDE_BATCHES, True)
    text = schedule(func, wasm_target()).script()
    assert "f32_matmul" in text and ("f32_matmul_rows" in text) == wide
    data, _ = build_wasm_libraries({"mm": func})["wasm"]
    wasm = tmp_path / "f32.wasm"
    wasm.write_bytes(data)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((N, K)).astype(np.float32)
    for b in (1, 7):
        x = rng.standard_normal((b, K)).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32)
        res = rng.standard_normal((b, N)).astype(np.float32)
        want = x.astype(np.float64) @ w.T.astype(np.float64) + bias + res
        answer, out = call(wasm, "mm", [x, w, bias, res, np.zeros((b, N), np.float32)],
                           tmp_path)
        assert answer["rc"] == 0, answer
        np.testing.assert_allclose(out[-1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("per_slot", [False, True])
def test_expert_matmul_in_wasm_matches_numpy(tmp_path, per_slot):
    """A mixture-of-experts step's gathered q4 matmul (compiler/cpu_gemv.py's kernel, four
    lanes at a time) in wasm32."""
    func = te_expert_matmul(5, 40, 96, 3, per_slot)
    data, _ = build_wasm_libraries({"experts": func})["wasm"]
    wasm = tmp_path / "experts.wasm"
    wasm.write_bytes(data)
    args, want = expert_case(5, 40, 96, 3, 4, per_slot, 4)
    answer, out = call(wasm, "experts", args, tmp_path)
    assert answer["rc"] == 0, answer
    np.testing.assert_allclose(out[-1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_kernel_check_comes_back_as_its_message(q4_module, tmp_path):
    wasm, _ = q4_module
    x = np.zeros((1, 100), np.float32)  # K must be 320
    args = [x, np.zeros((200, 40), np.uint32), np.zeros((200, 10), np.float32),
            np.zeros((200, 10), np.float32), np.zeros((1, 200), np.float32)]
    answer, _ = call(wasm, "mm", args, tmp_path)
    assert answer["rc"] != 0
    assert "ValueError" in answer["error"] and "shape" in answer["error"], answer


def test_the_module_imports_nothing(q4_module, tmp_path):
    wasm, _ = q4_module
    script = ("const m = new WebAssembly.Module(require('fs').readFileSync(process.argv[1]));"
              "console.log(JSON.stringify([WebAssembly.Module.imports(m),"
              " WebAssembly.Module.exports(m).map((e) => e.name)]))")
    imports, exports = json.loads(subprocess.run(["node", "-e", script, str(wasm)],
                                                 capture_output=True, text=True,
                                                 check=True).stdout)
    assert imports == []
    assert {"memory", "wick_init", "wick_alloc", "wick_free", "wick_error",
            "__tvm_ffi_mm", "__tvm_ffi_mm_add"} <= set(exports)


@pytest.mark.parametrize("kind", ["wasm", "wasm_threads"])
def test_every_buffer_the_allocator_gives_is_zero(q4_libraries, kind):
    """wick_alloc clears only what may hold old bytes (memory below the size before the
    allocation); what memory.grow added is zero already. Reused memory, a buffer straddling
    the old end of memory, and fresh memory all come back as zeros (the one-thread module's
    own memory and the threaded module's imported shared one)."""
    wasm, entry = q4_libraries[kind]
    script = """
const entry = JSON.parse(process.argv[2]);
const memory = entry.threads ? new WebAssembly.Memory({initial: entry.initial_memory / 65536,
    maximum: entry.max_memory / 65536, shared: true}) : null;
const ex = new WebAssembly.Instance(new WebAssembly.Module(require('fs').readFileSync(process.argv[1])),
    memory ? {env: {memory}} : {}).exports;
ex._initialize?.(); ex.wick_init();
const mem = memory ?? ex.memory;
const bytes = () => new Uint8Array(mem.buffer);
const out = [];
const fill = (p, n) => bytes().fill(0xAB, p, p + n);
const zero = (p, n) => bytes().subarray(p, p + n).every((b) => b === 0);
let sizes = [1000, 70000, 5 << 20, 123, 40 << 20];
let ptrs = sizes.map((n) => { const p = ex.wick_alloc(n) >>> 0; out.push(zero(p, n)); fill(p, n); return p; });
for (const p of ptrs) ex.wick_free(p);
// the same sizes again (memory reused, dirty), then larger ones (straddling the old end, fresh)
for (const n of [...sizes, 60 << 20, 3000]) { const p = ex.wick_alloc(n) >>> 0; out.push(p % 64 === 0 && zero(p, n)); fill(p, n); }
console.log(JSON.stringify(out));
"""
    got = json.loads(subprocess.run(["node", "-e", script, str(wasm), json.dumps(entry)],
                                    capture_output=True, text=True, check=True).stdout)
    assert got == [True] * 12
