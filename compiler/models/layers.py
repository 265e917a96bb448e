"""Linear and embedding layers that hold either plain or q4-packed weights.

With q4 the weight is ``weight_q`` (out, in/8) uint32 + ``weight_scale`` and ``weight_min``
(out, in/32);
the dequantization is a TE op that TVM fuses into the consuming GEMV/GEMM kernel, so full
precision weights never exist in device memory. Packing: compiler/quantization.py.

A weight larger than one storage binding may hold (WebGPU's default maxStorageBufferBindingSize
is 128 MiB) is split by rows into ``parts.K`` sub-layers whose outputs are concatenated.
"""

from __future__ import annotations

from tvm import relax, te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.core import wrap_nested

from ..quantization import GROUP_SIZE, Quantization

MAX_BINDING_BYTES = 128 << 20  # WebGPU's default maxStorageBufferBindingSize
# Matmul sums accumulate in float32 even in f16 variants. The kernels that run a step differ
# with the batch (one sequence: GEMV; a few: batched GEMV; prefill: tiled GEMM) and so sum in
# different orders; in f16 those orders round apart often enough to change greedy tokens, so a
# request's output would depend on what else runs beside it. In f32 the orders agree to ~1e-7.
_DTYPE_BYTES = {"float32": 4, "float16": 2}
ACCUMULATE = "float32"


def row_splits(out_features: int, in_features: int, quant: Quantization,
               max_bytes: int = MAX_BINDING_BYTES, experts: int = 1) -> list[tuple[int, int]]:
    """[start, stop) row ranges so that each part's largest tensor fits one binding (with
    ``experts``: a row of each of that many stacked matrices, ``ExpertLinears``)."""
    row_bytes = experts * (in_features * quant.weight_bits // 8 if quant.quantized
                           else in_features * _DTYPE_BYTES[quant.dtype])
    rows = max(1, max_bytes // row_bytes)
    return [(start, min(start + rows, out_features)) for start in range(0, out_features, rows)]


def _dequantize_te(w: te.Tensor, s: te.Tensor, m: te.Tensor, rows, in_features: int,
                   quant: Quantization) -> te.Tensor:
    """The float weight (*rows, in_features) of packed ``w`` with its scales and minimums;
    ``rows``: the leading extent(s) (out, or experts and out)."""
    per_word, bits, dtype = quant.values_per_word, quant.weight_bits, quant.dtype

    def value(*index):
        *lead, i = index
        word = w[(*lead, i // per_word)]
        q = (word >> ((i % per_word) * bits).astype("uint32")) & tirx.const(quant.levels, "uint32")
        g = i // GROUP_SIZE
        return q.astype(dtype) * s[(*lead, g)].astype(dtype) + m[(*lead, g)].astype(dtype)

    lead = rows if isinstance(rows, tuple) else (rows,)
    return te.compute((*lead, in_features), value, name="dequantize")


def _dequantize(packed: Tensor, scale: Tensor, minimum: Tensor, out_features: int,
                in_features: int, quant: Quantization):
    return op.tensor_expr_op(
        lambda w, s, m: _dequantize_te(w, s, m, out_features, in_features, quant), "dequantize",
        [packed, scale, minimum])


def _dequantize_matmul(x: Tensor, packed: Tensor, scale: Tensor, minimum: Tensor,
                       out_features: int, in_features: int, quant: Quantization) -> Tensor:
    """x (n, in) @ dequantize(W)^T in ONE kernel: Relax's FuseOps would not fuse an injective
    producer into a reduction, and a separate dequantize kernel would write the whole f16/f32
    weight to memory every step. dlight's GEMV/GEMM rules recognise the "dequantize" block.

    The sum is accumulated in float32 whatever ``dtype`` is (see ``ACCUMULATE``)."""

    def compute(xt: te.Tensor, w: te.Tensor, s: te.Tensor, m: te.Tensor):
        weight = _dequantize_te(w, s, m, out_features, in_features, quant)
        k = te.reduce_axis((0, in_features), name="k")
        acc = te.compute((xt.shape[0], out_features),
                         lambda i, j: te.sum(xt[i, k].astype(ACCUMULATE)
                                             * weight[j, k].astype(ACCUMULATE), axis=k),
                         name="matmul")
        if quant.dtype == ACCUMULATE:
            return acc
        return te.compute(acc.shape, lambda i, j: acc[i, j].astype(quant.dtype), name="cast")

    return op.tensor_expr_op(compute, "dequantize_matmul", [x, packed, scale, minimum])


def take_rows(x: Tensor, indices: Tensor) -> Tensor:
    """``x[indices]`` along axis 0, indices clamped into range ("clip"). nn's ``op.take`` uses
    TVM's "fast" mode, which reads out of bounds on a bad index and prints a warning about
    exactly that on every compile; a clamp costs nothing here."""
    return wrap_nested(relax.op.take(x._expr, indices._expr, axis=0, mode="clip"), "take")


class QLinear(nn.Module):
    """y = x @ W^T (+ b) with W (out, in), stored plain or packed (q4/q8); a bias stays unquantized
    in the variant's dtype."""

    def __init__(self, in_features: int, out_features: int, quant: Quantization,
                 max_bytes: int = MAX_BINDING_BYTES, bias: bool = False) -> None:
        self.in_features, self.out_features, self.quant = in_features, out_features, quant
        self.max_bytes = max_bytes
        self.splits = row_splits(out_features, in_features, quant, max_bytes)
        self.has_bias = bias
        if len(self.splits) > 1:
            self.parts = nn.ModuleList([QLinear(in_features, stop - start, quant, max_bytes, bias)
                                        for start, stop in self.splits])
            return
        elif quant.quantized:
            self.weight_q = nn.Parameter((out_features, in_features // quant.values_per_word),
                                         "uint32")
            self.weight_scale = nn.Parameter((out_features, in_features // GROUP_SIZE), quant.dtype)
            self.weight_min = nn.Parameter((out_features, in_features // GROUP_SIZE), quant.dtype)
        else:
            self.weight = nn.Parameter((out_features, in_features), quant.dtype)
        if bias:
            self.bias = nn.Parameter((out_features,), quant.dtype)

    def forward(self, x: Tensor) -> Tensor:
        if len(self.splits) > 1:
            return op.concat([part(x) for part in self.parts], dim=-1)
        if self.quant.quantized:
            y = _dequantize_matmul(x, self.weight_q, self.weight_scale, self.weight_min,
                                   self.out_features, self.in_features, self.quant)
        elif self.quant.dtype == ACCUMULATE:
            y = op.matmul(x, op.permute_dims(self.weight))
        else:
            y = op.astype(op.matmul(x, op.permute_dims(self.weight), out_dtype=ACCUMULATE),
                          self.quant.dtype)
        return y + self.bias if self.has_bias else y


class QEmbedding(nn.Module):
    """Token embedding table (vocab, hidden); also the tied LM head."""

    def __init__(self, vocab_size: int, hidden_size: int, quant: Quantization,
                 max_bytes: int = MAX_BINDING_BYTES) -> None:
        self.table = QLinear(hidden_size, vocab_size, quant, max_bytes)  # rows = tokens

    def forward(self, ids: Tensor) -> Tensor:
        t = self.table
        if len(t.splits) == 1:
            return self._lookup(t, ids)
        # rows of a split table: look each id up in every part, keep the part that owns it
        out = None
        for (start, stop), part in zip(t.splits, t.parts):
            local = (ids - start).minimum(stop - start - 1).maximum(0)
            owned = (ids >= start).astype(t.quant.dtype) * (ids < stop).astype(t.quant.dtype)
            owned = op.reshape(owned, (ids.shape[0], 1))
            rows = self._lookup(part, local) * owned
            out = rows if out is None else out + rows
        return out

    @staticmethod
    def _lookup(t: QLinear, ids: Tensor) -> Tensor:
        if not t.quant.quantized:
            return take_rows(t.weight, ids)
        rows_q = take_rows(t.weight_q, ids)
        rows_s = take_rows(t.weight_scale, ids)
        rows_m = take_rows(t.weight_min, ids)
        return _dequantize(rows_q, rows_s, rows_m, ids.shape[0], t.in_features, t.quant)

    def lm_head(self, x: Tensor) -> Tensor:
        return self.table(x)


class ExpertLinears(nn.Module):
    """``num_experts`` linears of one shape (out, in), stored as one stacked weight (experts,
    out, in), plain or packed as ``QLinear``'s (each expert's rows packed alike); split by rows
    into ``parts`` as QLinear where the stack outgrows a binding.

    ``forward(x, experts)``: for each token row r and each of its slots s, ``y[r, s] =
    W[experts[r, s]] @ x[r]`` (x (n, in): every slot reads the token's input) or ``@ x[r, s]``
    (x (n, slots, in): each slot its own). One kernel, the expert's weight dequantized inside
    it as QLinear's is: a step reads only the chosen experts' weights, each chosen row once a
    slot (a mixture-of-experts model's point: compiler/models/moe.py)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int,
                 quant: Quantization, max_bytes: int = MAX_BINDING_BYTES) -> None:
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        self.quant, self.max_bytes = quant, max_bytes
        self.splits = row_splits(out_features, in_features, quant, max_bytes, num_experts)
        if len(self.splits) > 1:
            self.parts = nn.ModuleList([ExpertLinears(num_experts, in_features, stop - start,
                                                      quant, max_bytes)
                                        for start, stop in self.splits])
        elif quant.quantized:
            self.weight_q = nn.Parameter(
                (num_experts, out_features, in_features // quant.values_per_word), "uint32")
            self.weight_scale = nn.Parameter(
                (num_experts, out_features, in_features // GROUP_SIZE), quant.dtype)
            self.weight_min = nn.Parameter(
                (num_experts, out_features, in_features // GROUP_SIZE), quant.dtype)
        else:
            self.weight = nn.Parameter((num_experts, out_features, in_features), quant.dtype)

    def forward(self, x: Tensor, experts: Tensor) -> Tensor:
        if len(self.splits) > 1:
            return op.concat([part(x, experts) for part in self.parts], dim=-1)
        weights = ([self.weight_q, self.weight_scale, self.weight_min] if self.quant.quantized
                   else [self.weight])
        # (a kernel of its own, op_pattern 8: opaque to FuseOps, which would otherwise fuse the
        # gate's activation into the down projection and recompute it for every output)
        return op.tensor_expr_op(self._compute, "expert_matmul", [x, experts, *weights],
                                 attrs={"op_pattern": 8})

    def _compute(self, x: te.Tensor, experts: te.Tensor, *stored: te.Tensor) -> te.Tensor:
        quant = self.quant
        weight = (_dequantize_te(*stored, (self.num_experts, self.out_features),
                                 self.in_features, quant) if quant.quantized else stored[0])
        per_slot = len(x.shape) == 3
        k = te.reduce_axis((0, self.in_features), name="k")
        last = tirx.const(self.num_experts - 1, "int32")

        def output(r, s, j):
            xv = x[r, s, k] if per_slot else x[r, k]
            expert = tirx.min(experts[r, s], last)  # (never outside the weights, whatever came)
            return te.sum(xv.astype(ACCUMULATE) * weight[expert, j, k].astype(ACCUMULATE),
                          axis=k)

        acc = te.compute((experts.shape[0], experts.shape[1], self.out_features), output,
                         name="matmul")
        if quant.dtype == ACCUMULATE:
            return acc
        return te.compute(acc.shape, lambda r, s, j: acc[r, s, j].astype(quant.dtype), name="cast")


def requantize(module: nn.Module, quant_of, prefix: str = "") -> None:
    """Rebuild every ``QLinear`` and ``ExpertLinears`` under ``module`` in the packing
    ``quant_of(its name)`` gives (a mixed scheme: compiler/quantization.mixed_plan), names as
    ``named_parameters`` has them (``model.layers.0.mlp.down_proj``). Models are built in one
    scheme; this re-packs them."""
    children = (enumerate(module) if isinstance(module, nn.ModuleList)
                else list(vars(module).items()))
    for attr, child in children:
        name = f"{prefix}{attr}"
        if isinstance(child, (QLinear, ExpertLinears)):
            want = quant_of(name)
            if want != child.quant:
                rebuilt = (QLinear(child.in_features, child.out_features, want, child.max_bytes,
                                   child.has_bias) if isinstance(child, QLinear) else
                           ExpertLinears(child.num_experts, child.in_features,
                                         child.out_features, want, child.max_bytes))
                if isinstance(module, nn.ModuleList):
                    module[attr] = rebuilt
                else:
                    setattr(module, attr, rebuilt)
        elif isinstance(child, nn.Module):  # (a ModuleList too)
            requantize(child, quant_of, name + ".")
