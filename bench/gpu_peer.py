"""bench/gpu.py's peer: the same Llama shapes in PyTorch, written the way gpt-fast writes it.

A static KV cache per layer ([batch, kv_heads, max_len, head_dim]), fused qkv and gate/up
projections, ``scaled_dot_product_attention`` over the cache with a causal mask row per
position, greedy argmax; on CUDA the one-token decode step is ``torch.compile``d with
``mode="reduce-overhead"`` (CUDA graphs), as gpt-fast does. Weights are random, of the same
shapes as the synthetic artifact's.

* ``q0f16``'s peer: float16 weights.
* ``q4f16_1``'s peer: 4-bit weights through PyTorch's int4 weight-only matmul
  (``aten._weight_int4pack_mm``, the tinygemm kernel gpt-fast uses; bfloat16 activations,
  group size 32), where this PyTorch and GPU have it; else the f16 peer alone is reported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

GROUP_SIZE = 32


@dataclass
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float
    eps: float

    @classmethod
    def from_hf(cls, hf: dict) -> "Shape":
        return cls(hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"],
                   hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"],
                   hf["vocab_size"], float(hf.get("rope_theta", 10000.0)),
                   float(hf.get("rms_norm_eps", 1e-5)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def build(shape: Shape, batch: int, max_len: int, device: str, int4: bool):
    """The model, its caches set up for ``batch`` sequences of up to ``max_len`` tokens."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dtype = torch.bfloat16 if int4 else (torch.float16 if device != "cpu" else torch.float32)

    class Int4Linear(nn.Module):
        """Random 4-bit weights packed for tinygemm; y = x @ dequant(w).T."""

        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            codes = torch.randint(0, 256, (n_out, n_in // 2), dtype=torch.uint8, device=device)
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack(codes, 8))
            scale = torch.full((n_in // GROUP_SIZE, n_out, 1), 1 / (4.6 * math.sqrt(n_in)),
                               dtype=dtype, device=device)
            zero = torch.zeros_like(scale)
            self.register_buffer("scales_zeros", torch.cat([scale, zero], dim=2).contiguous())
            self.n_out = n_out

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            y = torch.ops.aten._weight_int4pack_mm(flat, self.packed, GROUP_SIZE, self.scales_zeros)
            return y.reshape(*x.shape[:-1], self.n_out)

    def linear(n_in: int, n_out: int) -> nn.Module:
        if int4:
            return Int4Linear(n_in, n_out)
        layer = nn.Linear(n_in, n_out, bias=False, device=device, dtype=dtype)
        nn.init.uniform_(layer.weight, -math.sqrt(3 / n_in), math.sqrt(3 / n_in))
        return layer

    class RMSNorm(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

        def forward(self, x):
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + shape.eps)).to(x.dtype) * self.weight

    s = shape
    d = s.head_dim

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm, self.ffn_norm = RMSNorm(s.hidden), RMSNorm(s.hidden)
            self.wqkv = linear(s.hidden, (s.heads + 2 * s.kv_heads) * d)
            self.wo = linear(s.heads * d, s.hidden)
            self.w13 = linear(s.hidden, 2 * s.intermediate)
            self.w2 = linear(s.intermediate, s.hidden)
            cache = (batch, s.kv_heads, max_len, d)
            self.register_buffer("k_cache", torch.zeros(cache, dtype=dtype, device=device))
            self.register_buffer("v_cache", torch.zeros(cache, dtype=dtype, device=device))

        def forward(self, x, cos, sin, mask, pos):
            b, n, _ = x.shape
            q, k, v = self.wqkv(self.attn_norm(x)).split(
                [s.heads * d, s.kv_heads * d, s.kv_heads * d], dim=-1)
            q = rope(q.view(b, n, s.heads, d), cos, sin).transpose(1, 2)
            k = rope(k.view(b, n, s.kv_heads, d), cos, sin).transpose(1, 2)
            v = v.view(b, n, s.kv_heads, d).transpose(1, 2)
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
            keys = self.k_cache.repeat_interleave(s.heads // s.kv_heads, dim=1)
            values = self.v_cache.repeat_interleave(s.heads // s.kv_heads, dim=1)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + self.wo(y.transpose(1, 2).reshape(b, n, s.heads * d))
            gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
            return x + self.w2(F.silu(gate) * up)

    def rope(x, cos, sin):
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(s.vocab, s.hidden, device=device, dtype=dtype)
            nn.init.uniform_(self.embed.weight, -0.035, 0.035)
            self.blocks = nn.ModuleList(Block() for _ in range(s.layers))
            self.norm = RMSNorm(s.hidden)
            self.output = linear(s.hidden, s.vocab)
            inv = 1.0 / (s.rope_theta ** (torch.arange(0, d, 2, device=device).float() / d))
            angles = torch.outer(torch.arange(max_len, device=device).float(), inv)
            self.register_buffer("cos", angles.cos().to(dtype))
            self.register_buffer("sin", angles.sin().to(dtype))
            self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool,
                                                                 device=device)))

        def forward(self, ids, pos):
            """ids (b, n) at positions ``pos`` (n,) -> the next token of each sequence (b,)."""
            x = self.embed(ids)
            cos, sin = self.cos[pos][None, :, None, :], self.sin[pos][None, :, None, :]
            mask = self.causal[pos][None, None]
            for block in self.blocks:
                x = block(x, cos, sin, mask, pos)
            return self.output(self.norm(x[:, -1])).argmax(-1)

    with torch.no_grad():
        return Model().eval()


def graphed(model, batch: int, device: str):
    """The one-token decode step captured as a CUDA graph (static inputs, replayed per call):
    PyTorch's own kernels without the host's launch cost, and no compile time."""
    import torch

    ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
    pos = torch.zeros((1,), dtype=torch.long, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (warm up off the capture stream, as PyTorch asks)
        for _ in range(2):
            model(ids, pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(ids, pos)

    def step(new_ids, new_pos):
        ids.copy_(new_ids)
        pos.copy_(new_pos)
        graph.replay()
        return out

    return step


def bench(hf: dict, batches: list[int], prompt: int, tokens: int, prefill: int, device: str,
          int4: bool, mode: str = "eager") -> dict:
    """{"decode": {b: tok/s}, "prefill": tok/s} of the peer, or {"error": why}. ``mode``: the
    decode step as it is ("eager"), replayed as a CUDA graph ("graph") or ``torch.compile``d
    with CUDA graphs ("compile", as gpt-fast runs it)."""
    import torch

    shape = Shape.from_hf(hf)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out: dict = {"decode": {}}
    try:
        with torch.no_grad():
            model = build(shape, 1, prefill + 8, device, int4)
            ids = torch.randint(0, shape.vocab, (1, prefill), device=device)
            pos = torch.arange(prefill, device=device)
            model(ids, pos)  # warm up
            sync()
            t0 = time.perf_counter()
            model(ids, pos)
            sync()
            out["prefill"] = prefill / (time.perf_counter() - t0)
            del model
            for b in batches:
                model = build(shape, b, prompt + tokens + 8, device, int4)
                ids = torch.randint(0, shape.vocab, (b, prompt), device=device)
                nxt = model(ids, torch.arange(prompt, device=device))[:, None]
                step = torch.compile(model, mode="reduce-overhead", fullgraph=True) \
                    if mode == "compile" else graphed(model, b, device) if mode == "graph" \
                    else model
                for i in range(3):  # warm up (and compile) on the first positions
                    nxt = step(nxt, torch.tensor([prompt + i], device=device))[:, None]
                sync()
                t0 = time.perf_counter()
                for i in range(3, tokens):
                    nxt = step(nxt, torch.tensor([prompt + i], device=device))[:, None].clone()
                sync()
                out["decode"][b] = b * (tokens - 3) / (time.perf_counter() - t0)
                del model, step
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
    except Exception as e:  # (no int4 kernel on this GPU / PyTorch, out of memory, ...)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        if int4:  # the f16 peer then, said as such
            out = bench(hf, batches, prompt, tokens, prefill, device, False, mode)
            out["error"] = f"int4 peer unavailable ({why}); the peer figures are float16's"
        else:
            out["error"] = why
    return out
