"""compiler/models/cpu_rope.py: the CPU twin of TVM's fused_rope gives TVM's kernel's values
(both built for this CPU), for each scaling wick uses, f32 and f16, partial rotary dims."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import tirx  # noqa: E402
from tvm.relax.frontend.nn.llm.position_embedding import (  # noqa: E402
    llama_rope_with_position_map,
)

from wick.compiler.targets.cpu import cpu_target  # noqa: E402
from wick.compiler.cpu_schedules import schedule  # noqa: E402
from wick.compiler.models.cpu_rope import cpu_rope_prim_func  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def build(func):
    return tvm.tirx.build(tvm.IRModule({"f": schedule(func, cpu_target())
                                        .with_attr("global_symbol", "f")}),
                          target=cpu_target())["f"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scale,scaling,rotary", [
    (1.0, {}, None), (0.25, {}, None), (1.0, LLAMA3, None), (1.0, {}, 32)])
def test_twin_equals_tvms_kernel(dtype, scale, scaling, rotary):
    hq, hkv, d, theta = 6, 2, 64, 500000.0
    args = (theta, scale, d, hq, hkv, dtype, scaling, rotary)
    gpu = llama_rope_with_position_map(*args)
    gpu = gpu.specialize({gpu.params[-1]: tirx.IntImm("int64", 1)})
    want_f, got_f = build(gpu), build(cpu_rope_prim_func(*args))
    rng = np.random.default_rng(7)
    n = 5
    qkv = rng.standard_normal((n, hq + 2 * hkv, d)).astype(dtype)
    positions = np.array([0, 1, 17, 4095, 130000], np.int32)

    def run(f):
        out = [np.zeros((n, h, d), dtype) for h in (hq, hkv, hkv)]
        tensors = [tvm.runtime.tensor(a) for a in [qkv, positions, *out]]
        f(*tensors)
        return [t.numpy() for t in tensors[2:]]

    want, got = run(want_f), run(got_f)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    # (and it rotates: q of a token at position > 0 is not its input)
    assert not np.array_equal(got[0][2], qkv[2, :hq])
    np.testing.assert_array_equal(got[2], qkv[:, hq + hkv:])
