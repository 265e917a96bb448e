"""Synthetic artifacts (``wick compile --synthetic CONFIG``): real shapes, weights generated on
the device at load (issue #14).

The fill kernels' values are checked against an independent numpy implementation of the same
hash on both backends that run here (the CPU kernels and lavapipe's Vulkan), and their CUDA
launches against the kernels' signatures (the fake driver runs nothing); the model then runs,
and both real backends agree on its tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import wick_process_env
from tests.e2e.helpers import greedy, ids_of, load_artifact, make_core, prefill_logits, run_core
from wick.engine.backend import Read


def numpy_fill(dtype: str, count: int, seed: float, low: float, high: float) -> np.ndarray:
    """compiler/synthetic.py's fill, written again in numpy: lowbias32 of
    (i * 0x9E3779B1 + seed * 0x85EBCA77) mod 2^32; floats from its top 24 bits."""
    mask = np.uint64(0xFFFFFFFF)
    x = (np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B1)
         + np.uint64(int(seed)) * np.uint64(0x85EBCA77)) & mask
    x = ((x ^ (x >> np.uint64(16))) * np.uint64(0x7FEB352D)) & mask
    x = ((x ^ (x >> np.uint64(15))) * np.uint64(0x846CA68B)) & mask
    x = x ^ (x >> np.uint64(16))
    if dtype == "uint32":
        return x.astype(np.uint32)
    u = (x >> np.uint64(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return (np.float32(low) + (np.float32(high) - np.float32(low)) * u).astype(dtype)


@pytest.fixture(scope="module")
def cpu():
    from wick.native.cpu_backend import CpuBackend

    return CpuBackend.create()


@pytest.fixture(scope="module")
def synthetic(tiny_llama_dir, wick_home) -> Path:
    """The tiny Llama's config.json compiled through the CLI, as a user would."""
    out = subprocess.run(
        [sys.executable, "-m", "wick.server.cli", "compile", "--synthetic",
         str(tiny_llama_dir / "config.json"), "-q", "q4f16_1", "--prefill-chunk-size", "64",
         "--max-batch-size", "4"],
        capture_output=True, text=True, env=wick_process_env(WICK_HOME=str(wick_home)),
        timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip().splitlines()[-1])


def test_synthetic_artifact_stores_no_weights(synthetic, tiny_llama_dir):
    manifest = json.loads((synthetic / "wick-artifact.json").read_text())
    assert manifest["shards"] == []
    assert sum(f.stat().st_size for f in (synthetic / "params").glob("*")) == 0
    params = manifest["params"]
    assert params and all("fill" in p and "shard" not in p for p in params)
    # the same shapes as the real model's artifact would have
    real_cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    embed = next(p for p in params if "embed_tokens" in p["name"] and p["name"].endswith("_q"))
    assert embed["shape"][0] == real_cfg["vocab_size"]
    assert manifest["model"]["num_layers"] == real_cfg["num_hidden_layers"]
    norms = [p for p in params if len(p["shape"]) == 1 and "norm" in p["name"]]
    assert norms and all(p["fill"][1:] == [1.0, 1.0] for p in norms)


def _device_params(core, art) -> dict[str, np.ndarray]:
    backend, params = core.runner.backend, core.runner.forward.params
    out = {}
    for p in art.params:
        (raw,) = backend.run([], [], [Read(params[p.name].buffer, 0, p.nbytes)])
        out[p.name] = np.frombuffer(raw, dtype=p.dtype)
    return out


def test_fills_match_numpy_on_cpu_and_vulkan_and_the_model_runs(synthetic, cpu, backend):
    art = load_artifact(synthetic)
    tokens, logits = [], []
    for device in (cpu, backend):
        core = make_core(synthetic, device, num_pages=16)
        filled = _device_params(core, art)
        for p in art.params:
            want = numpy_fill(p.dtype, p.nbytes // np.dtype(p.dtype).itemsize, *p.fill)
            assert np.array_equal(filled[p.name], want), f"{device.name}: {p.name}"
        logits.append(prefill_logits(core.runner, [ids_of(30, 3)]))
        tokens.append(run_core(core, [ids_of(30, 3)], greedy(8)))
    assert np.isfinite(logits[0]).all() and logits[0].std() > 1e-3  # activations sane
    assert np.abs(logits[0] - logits[1]).max() < 2e-2 * max(1.0, np.abs(logits[1]).max())
    assert tokens[0] == tokens[1]


def test_fill_kernels_launch_on_the_cuda_backend(synthetic):
    """The CUDA set has the fill kernels too; their launches match their signatures."""
    from tests.native.test_cuda_backend import FakeDriver
    from wick.native.cuda_backend import CudaBackend

    manifest = json.loads((synthetic / "wick-artifact.json").read_text())
    drv = FakeDriver((synthetic / manifest["kernel_sets"]["cuda"]["file"]).read_text())
    make_core(synthetic, CudaBackend(drv), num_pages=16)
    filled = [args for name, _, _, _, args in drv.launches if name.startswith("synthetic_fill_")]
    assert len(filled) == len(manifest["params"])


def test_synthetic_config_errors_are_named(tmp_path, wick_home):
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 8}')
    for target, message in ((tmp_path / "missing.json", "needs an HF config.json"),
                            (bad, "not an HF model config")):
        out = subprocess.run([sys.executable, "-m", "wick.server.cli", "compile", "--synthetic",
                              str(target)], capture_output=True, text=True, timeout=120,
                             env=wick_process_env(WICK_HOME=str(wick_home)))
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr
        assert "wick bug" not in out.stderr
