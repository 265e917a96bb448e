"""Paged attention for every family, built from TVM's own TIR kernels.

MLC-LLM hides these kernels behind a C++ ``PagedAttentionKVCache`` object that the browser cannot
run. wick calls them directly as TIR functions instead, and the engine's ``KVCache`` produces the
index arrays they read (engine/batch.py ``KVIndex``). One layer's attention is three kernels:

1. ``fused_rope``: split fused qkv (n, hq + 2*hkv, d) into q, k, v with RoPE on q and k;
2. ``tir_kv_cache_transpose_append``: write k, v into the layer's pages at ``append_slots``;
3. ``batch_prefill_paged_kv``: causal attention of the new tokens over each sequence's pages
   (it serves prefill chunks and one-token decodes alike, in one ragged batch).

Scalar kernel arguments (causal, rope mode, theta, softmax scale) are baked in with
``PrimFunc.specialize`` so that the kernels take tensors only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm import _page_kernels, _prefill_kernels, position_embedding

from ..kernel_memo import built_once
from .kv_layout import PAGE_SIZE

# TVM's kernels, each built once per shape (compiler/kernel_memo.py)
_kv_cache_transpose_append = built_once(_page_kernels._kv_cache_transpose_append)
_attention_prefill = built_once(_prefill_kernels._attention_prefill)
llama_rope_with_position_map = built_once(position_embedding.llama_rope_with_position_map)


@dataclass(frozen=True)
class AttentionSpec:
    """What one layer's attention computes; layers with equal specs share their kernels.

    ``scale`` multiplies q.k (HF: ``head_dim ** -0.5``, Gemma ``query_pre_attn_scalar ** -0.5``).
    ``window``: a key is visible to a query at most ``window - 1`` positions back (HF's
    sliding window); None for global attention. ``sinks``: each head has a sink logit in its
    softmax (GPT-OSS; the layer passes the weights). Windowed, soft-capped or sunk layers run
    window_attention.py's kernel, the others TVM's paged prefill kernel.
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    rope_theta: float
    rope_scaling: Any = None  # HF rope_scaling (rope_type + its keys) as pairs; None = plain RoPE
    scale: float | None = None  # None -> head_dim ** -0.5
    window: int | None = None
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma 2)
    rotary_dim: int | None = None  # dimensions RoPE rotates (partial rotary); None = head_dim
    # an encoder (BERT): every token of a sequence sees all of its tokens, so a sequence's
    # whole input must be one step's (the engine schedules it so); no RoPE (absolute
    # positions are added to the embeddings instead)
    causal: bool = True
    rope: bool = True
    sinks: bool = False

    def __post_init__(self) -> None:
        # hashable (equal specs share kernels): the scaling dict as sorted (key, value) pairs
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5 if self.scale is None else self.scale


class PagedAttention:
    """The TIR kernels of one attention shape, specialized once and shared by all layers."""

    def __init__(self, spec: AttentionSpec, target, tag: str = "",
                 shared: dict | None = None) -> None:
        """``tag`` makes kernel names distinct when a model has several specs; ``shared``
        holds kernels that depend on the KV shape only (the append), one per model."""
        self.shape = spec
        self.tag = tag
        s = spec
        shared = {} if shared is None else shared
        self.windowed = s.window is not None or s.softcap is not None or s.sinks
        if self.windowed:
            from .window_attention import kernel_name, window_attention_prim_func

            self.window_name = kernel_name(s.window, s.softcap, s.sinks) + tag
            self.window_kernel = window_attention_prim_func(
                s.num_q_heads, s.num_kv_heads, s.head_dim, s.dtype, s.softmax_scale, s.window,
                s.softcap, sinks=s.sinks).with_attr("global_symbol", self.window_name)
        scaling = dict(s.rope_scaling or {})
        rotary_dim = s.rotary_dim or s.head_dim
        if not s.rope:
            rope = None
            self._rope_args = None
        elif scaling.get("rope_type") in ("longrope", "yarn"):  # (factor tables: longrope.py)
            from .longrope import longrope_prim_func

            rope = longrope_prim_func(s.num_q_heads, s.num_kv_heads, s.head_dim, s.dtype,
                                      s.rope_theta, rotary_dim, scaling)
            scaling = {}  # (the prefill kernel below does not rotate: rotary_mode 0)
            self._rope_args = None  # (its own kernel serves CPUs too)
        else:
            # linear scaling (transformers: inv_freq / factor) is positions / factor, which is
            # the kernel's own ``scale``; TVM has no "linear" rope_type
            position_scale = 1.0
            if scaling.get("rope_type") == "linear":
                position_scale, scaling = 1.0 / float(scaling["factor"]), {}
            rope_args = (s.rope_theta, position_scale, s.head_dim, s.num_q_heads,
                         s.num_kv_heads, s.dtype, scaling, rotary_dim)
            rope = llama_rope_with_position_map(*rope_args)
            self._rope_args = rope_args  # (the CPU twin's: cpu_twins)
            rope = rope.specialize({rope.params[-1]: tirx.IntImm("int64", 1)})  # apply_rope = 1
        self.rope = None if rope is None else rope.with_attr("global_symbol", "fused_rope" + tag)
        kv = (s.num_kv_heads, s.head_dim, s.dtype)
        if kv not in shared:
            shared[kv] = _kv_cache_transpose_append(*kv, PAGE_SIZE)
        self.append = shared[kv]
        self._prefill_scaling = scaling
        self.prefill = self._prefill_kernel(target)

    def _prefill_kernel(self, target) -> tirx.PrimFunc:
        """TVM's paged prefill kernel, tiled for ``target``, with this shape's constants."""
        s = self.shape
        prefill = _attention_prefill(s.num_kv_heads, s.num_q_heads, s.head_dim, s.dtype, False,
                                     self._prefill_scaling, target, PAGE_SIZE)
        causal, rotary_mode, rope_scale, rope_theta, sm_scale = prefill.params[-5:]
        return prefill.specialize(
            {
                causal: tirx.IntImm("int32", 1 if s.causal else 0),
                rotary_mode: tirx.IntImm("int32", 0),  # RoPE already applied by fused_rope
                rope_scale: tirx.FloatImm("float32", 1.0),
                rope_theta: tirx.FloatImm("float32", float(s.rope_theta)),
                sm_scale: tirx.FloatImm("float32", s.softmax_scale),
            }
        ).with_attr("global_symbol", "batch_prefill_paged_kv" + self.tag)

    def gpu_twins(self, target, decode: bool = False) -> dict[str, Any]:
        """This shape's attention kernel for another GPU ``target``, same parameters: TVM's
        tiled for it (CUDA: larger tiles than WebGPU's), or for ``decode`` plans (one row per
        sequence) wick's row-per-workgroup kernel (window_attention.paged_decode_prim_func):
        TVM's runs a fixed few workgroups per KV head, too few for a one-row step on a large
        GPU. The windowed kernel (wick's own) serves any GPU."""
        if self.windowed:
            return {}
        name = "batch_prefill_paged_kv" + self.tag
        if decode and self.shape.causal:
            from .window_attention import paged_decode_prim_func

            s = self.shape
            kernel = paged_decode_prim_func(s.num_q_heads, s.num_kv_heads, s.head_dim, s.dtype,
                                            s.softmax_scale)
            return {name: kernel.with_attr("global_symbol", name)}
        return {name: self._prefill_kernel(target)}

    def cpu_twins(self) -> dict[str, Any]:
        """The CPU kernel set's replacements for this shape's GPU-only attention kernel (the
        other kernels are plain TIR that any target schedules) and for its RoPE kernel (TVM's
        computes each cosine once per head): TIR function name -> PrimFunc with the same
        parameters (compiler/models/cpu_attention.py, cpu_rope.py)."""
        from .cpu_attention import cpu_attention_prim_func

        s = self.shape
        args = (s.num_q_heads, s.num_kv_heads, s.head_dim, s.dtype, s.softmax_scale, s.window,
                s.softcap)
        name, signature = ((self.window_name, "window") if self.windowed
                           else ("batch_prefill_paged_kv" + self.tag, "paged"))
        twins = {name: cpu_attention_prim_func(*args, signature=signature, causal=s.causal,
                                               sinks=s.sinks)
                 .with_attr("global_symbol", name)}
        if self._rope_args is not None:  # (compiler/models/cpu_rope.py: each cosine once)
            from .cpu_rope import cpu_rope_prim_func

            rope = "fused_rope" + self.tag
            twins[rope] = cpu_rope_prim_func(*self._rope_args).with_attr("global_symbol", rope)
        return twins

    def page_spec(self, pages: str = "num_pages") -> nn.spec.Tensor:
        """One layer's KV tensor: (pages, 2 = k|v, kv_heads, page_size, head_dim); ``pages``
        names the pool whose page count it has."""
        s = self.shape
        return nn.spec.Tensor([pages, 2, s.num_kv_heads, PAGE_SIZE, s.head_dim], s.dtype)

    def _rotate(self, qkv: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """fused qkv -> q, k, v with RoPE on q and k (one kernel)."""
        s = self.shape
        n = qkv.shape[0]
        return op.tensor_ir_op(
            self.rope,
            "fused_rope" + self.tag,
            [qkv, positions],
            [
                Tensor.placeholder((n, s.num_q_heads, s.head_dim), s.dtype),
                Tensor.placeholder((n, s.num_kv_heads, s.head_dim), s.dtype),
                Tensor.placeholder((n, s.num_kv_heads, s.head_dim), s.dtype),
            ],
        )

    def __call__(self, qkv: Tensor, pages: Tensor, step: dict[str, Tensor],
                 after_rope: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
                 sinks: Tensor | None = None) -> Tensor:
        """qkv (n, hq + 2*hkv, d) -> attention output (n, hq * d); appends k, v to ``pages``.
        ``after_rope``: (q, k) -> (q, k) between RoPE and attention (Hunyuan's q/k norms);
        ``sinks`` (hq,): the heads' sink logits, where the spec has them."""
        if (sinks is not None) != self.shape.sinks:
            raise ValueError("attention sinks are given exactly when the spec has them")
        s = self.shape
        n = qkv.shape[0]
        if self.rope is None:  # (no RoPE: q, k, v as they are)
            q, k, v = op.split(qkv, [s.num_q_heads, s.num_q_heads + s.num_kv_heads], axis=1)
        else:
            q, k, v = self._rotate(qkv, step["q_positions"])
        if after_rope is not None:
            q, k = after_rope(q, k)
        pages = op.tensor_ir_inplace_op(
            self.append,
            "tir_kv_cache_transpose_append",
            [pages, k, v, step["append_slots"]],
            0,
            Tensor.placeholder(pages.shape, s.dtype),
        )
        if self.windowed:
            out = op.tensor_ir_op(
                self.window_kernel, self.window_name,
                [q, pages, step["qo_indptr"], step["page_indptr"], step["page_values"],
                 step["last_page_len"], step["k_rope_pos_offset"], step["q_positions"],
                 *([sinks] if s.sinks else [])],
                Tensor.placeholder((n, s.num_q_heads, s.head_dim), s.dtype))
            return op.reshape(out, (n, s.num_q_heads * s.head_dim))
        out, _lse = op.tensor_ir_op(
            self.prefill,
            "batch_prefill_paged_kv" + self.tag,
            [
                q,
                step["qo_indptr"],
                pages,
                step["page_indptr"],
                step["page_values"],
                step["last_page_len"],
                step["k_rope_pos_offset"],
                step["q_positions"],
            ],
            [
                Tensor.placeholder((n, s.num_q_heads, s.head_dim), s.dtype),
                Tensor.placeholder((n, s.num_q_heads), "float32"),
            ],
        )
        return op.reshape(out, (n, s.num_q_heads * s.head_dim))
