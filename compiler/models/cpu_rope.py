"""RoPE for CPUs: a drop-in twin of TVM's ``fused_rope`` (``llama_rope_with_position_map``).

TVM's kernel computes, for every element of q and k, the cosine and sine of its position's
frequency: ``(q heads + kv heads) x head_dim`` trigonometric calls per token, though a token
has only ``rotary_dim`` distinct values (they depend on the position and the dimension, not
the head). On a GPU that is free; on a CPU each call is a scalar libm call, and the kernel
cost more than a layer's attention in a decode step of 8 rows (3 ms of a 40 ms step, SmolLM2)
and 8% of a prefill. This twin computes each token's ``rotary_dim`` cosines and sines once,
with TVM's own frequency expression (``switch_rope_freq_func``: the same value, bit for bit),
and rotates every head with them; tokens run in parallel.

Same parameters as the GPU kernel after ``apply_rope`` is specialized to 1: (qkv (n, hq + 2 *
hkv, d), position_map (n,) i32, q (n, hq, d), k (n, hkv, d), v (n, hkv, d)). Scalings: none,
linear (``position_scale``) and llama3; longrope has its own kernel (longrope.py).
"""

from __future__ import annotations

from typing import Any

from tvm import tirx
from tvm.relax.frontend.nn.llm.position_embedding import switch_rope_freq_func
from tvm.script import tirx as T

from ..kernel_memo import built_once


@built_once
def cpu_rope_prim_func(theta: float, position_scale: float, head_dim: int, num_q_heads: int,
                       num_kv_heads: int, dtype: str, rope_scaling: dict[str, Any],
                       rotary_dim: int | None = None) -> tirx.PrimFunc:
    """The twin of ``llama_rope_with_position_map(theta, position_scale, head_dim,
    num_q_heads, num_kv_heads, dtype, rope_scaling, rotary_dim)`` with ``apply_rope`` 1."""
    if rope_scaling.get("rope_type") in ("longrope", "gptj"):
        raise ValueError(f"no CPU twin for rope_type {rope_scaling['rope_type']!r}")
    HQ, HKV, D = int(num_q_heads), int(num_kv_heads), int(head_dim)
    R = int(rotary_dim or D)
    HALF = R // 2
    fused = HQ + 2 * HKV
    freq = switch_rope_freq_func(rope_scaling)
    scale = tirx.const(position_scale, "float32")

    def cos_sin(pos, d, which: int):
        """TVM's expression for the cosine (0) or sine (1) at position ``pos``, dim ``d``."""
        values = freq(pos * scale, d, R, theta, "float32")
        expr = values[which]
        for var, value in values[2].items():  # (bound as TVM's kernel binds them)
            expr = tirx.Let(var, value, expr)
        return expr

    def rotated(c, s, x, other):
        """TVM's rotation of one element: cos * x + sin * (the partner element, negated in
        the first half)."""
        return (c * x.astype("float32") + s * other.astype("float32")).astype(dtype)

    @T.prim_func(s_tir=True)
    def fused_rope(var_qkv: T.handle, var_position_map: T.handle, var_q: T.handle,
                   var_k: T.handle, var_v: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        seq_len = T.int32()
        position_map_elem_offset = T.int32()
        qkv = T.match_buffer(var_qkv, (seq_len, fused, D), dtype)
        q = T.match_buffer(var_q, (seq_len, HQ, D), dtype)
        k = T.match_buffer(var_k, (seq_len, HKV, D), dtype)
        v = T.match_buffer(var_v, (seq_len, HKV, D), dtype)
        position_map = T.match_buffer(var_position_map, (seq_len,), "int32",
                                      elem_offset=position_map_elem_offset)
        for t in T.parallel(seq_len):
            # (inside the parallel body: each worker's own) the token's cosines and sines
            cs = T.alloc_buffer((R,), "float32")
            sn = T.alloc_buffer((R,), "float32")
            for d in range(R):
                cs[d] = cos_sin(position_map[t], d, 0)
                sn[d] = cos_sin(position_map[t], d, 1)
            for h, d in T.grid(HQ, HALF):
                q[t, h, d] = rotated(cs[d], sn[d], qkv[t, h, d], -qkv[t, h, d + HALF])
                q[t, h, d + HALF] = rotated(cs[d + HALF], sn[d + HALF], qkv[t, h, d + HALF],
                                            qkv[t, h, d])
            for h, d in T.grid(HKV, HALF):
                k[t, h, d] = rotated(cs[d], sn[d], qkv[t, HQ + h, d],
                                     -qkv[t, HQ + h, d + HALF])
                k[t, h, d + HALF] = rotated(cs[d + HALF], sn[d + HALF],
                                            qkv[t, HQ + h, d + HALF], qkv[t, HQ + h, d])
            for h, d in T.grid(HQ, D - R):  # (dims past rotary_dim: as they are)
                q[t, h, R + d] = qkv[t, h, R + d]
            for h, d in T.grid(HKV, D - R):
                k[t, h, R + d] = qkv[t, HQ + h, R + d]
            for h, d in T.grid(HKV, D):
                v[t, h, d] = qkv[t, HQ + HKV + h, d]

    return fused_rope
