"""The two layouts of RoPE over a head's dimensions, and the reordering between them.

HF's Llama rotates a head's two halves (dimension ``i`` with ``i + d/2``); GPT-J, GLM, ERNIE 4.5
and llama.cpp's own kernels rotate adjacent pairs (``2i`` with ``2i + 1``). The same frequency
goes to pair ``i`` either way, so a q/k projection whose rows are reordered, each head's even
rows first and then its odd ones, gives under the halves' rotation what the original gives
under the pairs' (attention scores, sums over a head's dimensions, do not see the order).
llama.cpp's converter makes that reordering's inverse to Llama's q/k rows, which is how a
Llama GGUF's rows come back: with this one.
"""

from __future__ import annotations

import numpy as np


def pairs_to_halves(w: np.ndarray, n_heads: int, rotary_dim: int | None = None) -> np.ndarray:
    """Rows (or a bias) of a q/k projection, ``n_heads`` heads of ``head_dim``, from RoPE on
    adjacent pairs to RoPE on halves: each head's even rows, then its odd ones. With
    ``rotary_dim`` (partial rotary: GLM, GPT-J), only a head's first ``rotary_dim`` rows rotate
    and are reordered; the rest stay where they are."""
    head_dim = w.shape[0] // n_heads
    r = rotary_dim or head_dim
    rest = w.shape[1:]
    heads = w.reshape(n_heads, head_dim, *rest)
    rotated = heads[:, :r].reshape(n_heads, r // 2, 2, *rest).swapaxes(1, 2)
    return np.concatenate([rotated.reshape(n_heads, r, *rest), heads[:, r:]],
                          axis=1).reshape(w.shape).copy()


def qk_pairs_to_halves(weights: dict[str, np.ndarray], num_q: int, num_kv: int,
                       rotary_dim: int | None = None) -> dict[str, np.ndarray]:
    """A checkpoint with RoPE on adjacent pairs (ERNIE 4.5, Cohere, GLM) with its q/k
    projections' rows and biases reordered for RoPE on halves (``pairs_to_halves``, over the
    first ``rotary_dim`` of each head where only those rotate), and the weights of a norm over
    each q or k head (Cohere's ``q_norm``/``k_norm``, (heads, head_dim)) with them: the
    dimensions they weigh move."""
    out = dict(weights)
    for name, array in weights.items():
        heads = (num_q if ".self_attn.q_proj." in name or ".self_attn.q_norm." in name
                 else num_kv if ".self_attn.k_proj." in name or ".self_attn.k_norm." in name
                 else 0)
        if heads:
            flat = array.reshape(-1) if "_norm." in name else array
            out[name] = pairs_to_halves(flat, heads, rotary_dim).reshape(array.shape)
    return out
