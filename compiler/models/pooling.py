"""Embedding models: how a step's hidden states become one vector per input.

An embedding model's ``forward`` returns ``(b, hidden)`` float32, one pooled (and, where the
model says so, L2-normalized) vector per sequence of the step, instead of logits. The pooling
comes from the checkpoint's own sentence-transformers files (``modules.json``,
``1_Pooling/config.json``, ``2_Normalize``, ``sentence_bert_config.json``), read by
compiler/embedding_files.py; the engine gets it in the manifest's ``model.embedding``.

A sequence's rows in the step are ``qo_indptr[s] .. qo_indptr[s+1]`` (its whole input: the
engine gives an embedding input one step, engine/scheduler.py), so every mode is one small
kernel over the step's rows:

* ``mean``: the mean of its rows (a sum over all n rows, masked to its own: b x n x hidden
  multiply-adds, a few hundred thousand for a batch of short inputs);
* ``max``: the largest value per dimension over its rows;
* ``cls``: its first row; ``lasttoken``: its last row (decoder embedding models).
"""

from __future__ import annotations

from tvm import te, tirx
from tvm.relax.frontend.nn import Tensor, op

from ..embedding_files import POOLING_MODES


def pool(hidden: Tensor, qo_indptr: Tensor, last_rows: Tensor, mode: str,
         normalize: bool) -> Tensor:
    """``hidden`` (n, H) -> (b, H) float32: each sequence's rows pooled by ``mode``, then
    L2-normalized when ``normalize`` (sentence-transformers' Normalize: x / max(|x|, 1e-12)).
    ``last_rows`` (b,): each sequence's last row (it also gives the b dimension)."""
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling mode {mode!r}; wick has {', '.join(POOLING_MODES)}")

    # each sequence's first row, (b,): a kernel of its own, so that no pooling kernel reads two
    # entries of qo_indptr per sequence (dlight's analysis takes a read of 2 as a vector)
    first_rows = op.tensor_expr_op(
        lambda qo, last: te.compute(last.shape, lambda i: qo[i], name="first_rows"),
        "first_rows", [qo_indptr, last_rows])

    def compute(h: te.Tensor, first: te.Tensor, last: te.Tensor):
        n, size = h.shape
        b = last.shape[0]
        f32 = "float32"

        def row(j, k):
            return h[j, k].astype(f32)

        if mode == "cls":
            return te.compute((b, size), lambda i, k: row(first[i], k), name="pool")
        if mode == "lasttoken":
            return te.compute((b, size), lambda i, k: row(last[i], k), name="pool")
        j = te.reduce_axis((0, n), name="j")

        def mine(i):
            return tirx.all(j >= first[i], j <= last[i])

        if mode == "max":
            return te.compute((b, size), lambda i, k: te.max(
                tirx.Select(mine(i), row(j, k), tirx.min_value(f32)), axis=j), name="pool")
        total = te.compute((b, size), lambda i, k: te.sum(
            tirx.Select(mine(i), row(j, k), tirx.const(0, f32)), axis=j), name="pool_sum")
        return te.compute((b, size), lambda i, k: total[i, k] / (
            last[i] - first[i] + 1).astype(f32), name="pool")

    pooled = op.tensor_expr_op(compute, "pool", [hidden, first_rows, last_rows])
    if not normalize:
        return pooled

    def l2(p: te.Tensor):
        b, size = p.shape
        k = te.reduce_axis((0, size), name="k")
        squares = te.compute((b,), lambda i: te.sum(p[i, k] * p[i, k], axis=k), name="squares")
        return te.compute((b, size), lambda i, d: p[i, d] / tirx.max(
            tirx.sqrt(squares[i]), tirx.const(1e-12, "float32")), name="normalize")

    return op.tensor_expr_op(l2, "normalize", [pooled])
