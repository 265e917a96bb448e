"""Weight quantization schemes: q0f32, q0f16, q4f32_1, q4f16_1, q8f32_1, q8f16_1, q4f32_m,
q4f16_m.

``qAfB_1``: A-bit weights, B-bit activations. The packing of the 4- and 8-bit schemes is
documented in docs/quantization.md; this module is its one implementation (numpy packing at
compile time, TE dequantization fused by TVM into the GEMV/GEMM kernels at run time).
``q4fB_m`` (mixed) packs each weight in 4 or 8 bits: ``mixed_plan`` says which.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

GROUP_SIZE = 32  # weights sharing one scale and one minimum
WORD_BITS = 32  # values are packed into uint32 words


@dataclass(frozen=True, slots=True)
class Quantization:
    name: str
    weight_bits: int  # 0 = not quantized, else 4 or 8 (a mixed scheme: its smallest)
    dtype: str  # activation / compute dtype: "float32" | "float16"
    mixed: bool = False  # some weights in 8 bits (mixed_plan)

    @property
    def quantized(self) -> bool:
        return self.weight_bits > 0

    @property
    def needs_f16(self) -> bool:
        return self.dtype == "float16"

    @property
    def values_per_word(self) -> int:
        return WORD_BITS // self.weight_bits

    @property
    def levels(self) -> int:
        """The largest stored value: q encodes q * scale + minimum, q in 0..levels."""
        return (1 << self.weight_bits) - 1


QUANTIZATIONS = {
    "q0f32": Quantization("q0f32", 0, "float32"),
    "q0f16": Quantization("q0f16", 0, "float16"),
    "q4f32_1": Quantization("q4f32_1", 4, "float32"),
    "q4f16_1": Quantization("q4f16_1", 4, "float16"),
    "q8f32_1": Quantization("q8f32_1", 8, "float32"),
    "q8f16_1": Quantization("q8f16_1", 8, "float16"),
    "q4f32_m": Quantization("q4f32_m", 4, "float32", mixed=True),
    "q4f16_m": Quantization("q4f16_m", 4, "float16", mixed=True),
}


def plain(bits: int, dtype: str) -> Quantization:
    """The one-width scheme of ``bits`` and activation ``dtype`` (what a mixed scheme packs
    each weight in)."""
    return next(q for q in QUANTIZATIONS.values()
                if q.weight_bits == bits and q.dtype == dtype and not q.mixed)


def f32_twin(name: str) -> str | None:
    """The variant with the same weights in float32 activations (runs without shader-f16), or
    None when ``name`` is already one."""
    quant = get_quantization(name)
    if not quant.needs_f16:
        return None
    return next(q.name for q in QUANTIZATIONS.values() if q.weight_bits == quant.weight_bits
                and q.mixed == quant.mixed and not q.needs_f16)


def get_quantization(name: str) -> Quantization:
    try:
        return QUANTIZATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown quantization {name!r}; choose one of {', '.join(QUANTIZATIONS)}"
        ) from None


def quantize(weight: np.ndarray, quant: Quantization) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, in) float weights -> packed (out, in * bits / 32) uint32, scale and minimum
    (out, in / 32), the scale and minimum in ``quant``'s activation dtype.

    Asymmetric per-group quantization along the input dimension: a group's codes 0..levels
    (15 for 4 bits, 255 for 8) stand for minimum + code * scale. Where a group's values
    already lie on an evenly spaced grid of at most ``levels`` steps (a block of a quantized
    source: GGUF Q4_0, Q4_1 and Q4_K for 4 bits, also Q5_0 and Q8_0 for 8), the scale is that
    grid's step and the group is kept exactly (up to the rounding of a float16 scale). Other
    groups: in 8 bits, minimum and maximum span the range (min-max); in 4 bits, the range
    ``fitted_ranges`` finds.
    Value ``k`` of word ``j`` (bits ``k*bits ..``) holds input column ``j * values_per_word + k``.
    """
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"{quant.name} needs the input dimension divisible by {GROUP_SIZE}: "
                         f"{weight.shape}")
    # Rows a block at a time: every group is one row's, so the blocks' results are the whole's,
    # and the temporaries (about 6x the floats) stay a block's, not an LM head's (an 8 B
    # model's head is 2 GB of floats).
    rows = max(1, QUANTIZE_BLOCK_BYTES // (4 * in_features))
    if out_features > rows:
        parts = [_quantize_rows(weight[i:i + rows], quant) for i in range(0, out_features, rows)]
        return tuple(np.concatenate(arrays) for arrays in zip(*parts))
    return _quantize_rows(weight, quant)


# the floats quantize takes at a time: 64 MiB is 32 of fitted_ranges' chunks, enough for a
# many-core machine's threads; its temporaries stay near 0.4 GiB
QUANTIZE_BLOCK_BYTES = 64 << 20


def _quantize_rows(weight: np.ndarray, quant: Quantization
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out_features, in_features = weight.shape
    per_word, levels = quant.values_per_word, quant.levels
    w = weight.astype(np.float32).reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low = w.min(axis=2, keepdims=True)
    span = w.max(axis=2, keepdims=True) - low
    steps = source_grid_steps(w, low, span, levels)
    scale = span / np.where(steps > 0, steps, levels)
    off_grid = np.nonzero(steps[..., 0] == 0)
    if levels <= FITTED_LEVELS and off_grid[0].size:  # those groups: a fitted range
        scale[off_grid], low[off_grid] = fitted_ranges(w[off_grid], levels)
    # quantize against the stored (possibly float16) scale and minimum
    low = low.astype(quant.dtype).astype(np.float32)
    scale = scale.astype(quant.dtype).astype(np.float32)
    safe = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.rint((w - low) / safe), 0, levels).astype(np.uint32)
    q = q.reshape(out_features, in_features // per_word, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * quant.weight_bits)[None, None, :]
    packed = np.bitwise_or.reduce(q << shifts, axis=2).astype(np.uint32)
    return (packed, scale.reshape(out_features, -1).astype(quant.dtype),
            low.reshape(out_features, -1).astype(quant.dtype))


# Fitted 4-bit ranges. Min-max steps spend a 4-bit group's 16 codes on its two extremes, and
# round every weight alike. Fitting the range to the group, with each weight's error weighted
# by its importance (the group's RMS plus the weight's magnitude, the heuristic llama.cpp's
# K-quants use without an importance matrix), costs 4 bits less where the source is finer:
# all of gemma-3-270m in 4 bits went from 1.673x to 1.403x the source's perplexity, its tied
# LM head alone from 1.075x to 1.051x, SmolLM2-135M's Q8_0 vocabulary table from 1.065x to
# 1.058x (transformers on the re-quantized weights, 4,096 KJV tokens; docs/quantization.md).
# Eight bits stay min-max: their steps are 17x finer and cost no measurable perplexity.
FITTED_LEVELS = 15  # the widest code range fitted (4 bits)
FIT_SHRINKS = (0.0, 0.05, 0.10)  # starts: min-max, and the range cut by 5 % / 10 % at each end
FIT_ROUNDS = 3  # per start: codes for the range, then the range refitted to the codes


def fitted_ranges(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """For groups ``w`` (groups, GROUP_SIZE): the scale and minimum (groups, 1) with the
    smallest importance-weighted squared error found. From each start in ``FIT_SHRINKS``,
    ``FIT_ROUNDS`` times: round every weight to its nearest code, then fit scale and minimum
    to those codes by weighted least squares. Each step is the best for what the other holds
    fixed, so the error never grows from one round to the next: a start's last range is
    scored, and the one from min-max is no worse than min-max. In chunks of groups on every
    core (numpy's loops release the GIL): a 7B model has 2e8 groups, about 1 us each a core."""
    chunk = 16384  # groups: bounded temporaries
    starts = range(0, w.shape[0], chunk)
    with ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, len(starts)) or 1) as pool:
        parts = list(pool.map(lambda r: _fitted_ranges(w[r:r + chunk], levels), starts))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _fitted_ranges(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    def dot(a, b):  # each group's sum of a * b, in one pass
        return np.einsum("gk,gk->g", a, b)[:, None]

    w = np.ascontiguousarray(w, dtype=np.float32)
    weight = np.sqrt(dot(w, w) / w.shape[1]) + np.abs(w)
    weighted = weight * w
    # the weighted sums every fit and score is made of (float64 per group: the score is a
    # difference of them)
    s_a = weight.sum(axis=1, keepdims=True, dtype=np.float64)
    s_a = np.where(s_a > 0, s_a, 1.0)
    s_aw = weighted.sum(axis=1, keepdims=True, dtype=np.float64)
    s_aww = dot(weighted, w).astype(np.float64)
    low0 = w.min(axis=1, keepdims=True)
    span0 = w.max(axis=1, keepdims=True) - low0
    best_err = np.full(s_a.shape, np.inf)
    best_scale = best_low = np.zeros(s_a.shape)
    q = np.empty_like(w)
    for shrink in FIT_SHRINKS:
        scale = (span0 * np.float32((1 - 2 * shrink) / levels)).astype(np.float64)
        low = (low0 + np.float32(shrink) * span0).astype(np.float64)
        for round_ in range(FIT_ROUNDS + 1):
            inverse = np.where(scale > 0, 1 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
            np.subtract(w, low.astype(np.float32), out=q)
            np.multiply(q, inverse, out=q)
            np.rint(q, out=q)
            np.clip(q, 0, levels, out=q)
            s_aq = dot(weight, q).astype(np.float64)
            s_aqq = np.einsum("gk,gk,gk->g", weight, q, q)[:, None].astype(np.float64)
            s_awq = dot(weighted, q).astype(np.float64)
            if round_ == FIT_ROUNDS:
                break
            # weighted least squares of w on the codes (a group whose codes are all equal
            # keeps its range: no line to fit)
            var = s_aqq - s_aq * s_aq / s_a
            fit = (s_awq - s_aq * s_aw / s_a) / np.where(var > 0, var, 1)
            ok = (var > 1e-9 * s_aqq) & (fit > 0)
            scale = np.where(ok, fit, scale)
            low = np.where(ok, (s_aw - fit * s_aq) / s_a, low)
        # sum of weight * (w - scale * q - low)^2, expanded
        err = (s_aww - 2 * scale * s_awq - 2 * low * s_aw + scale * scale * s_aqq
               + 2 * scale * low * s_aq + low * low * s_a)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_low = np.where(better, low, best_low)
    return best_scale.astype(np.float32), best_low.astype(np.float32)


GRID_TOLERANCE = 1e-3  # in steps: how far a value may sit from a grid point and still be on it


def source_grid_steps(w: np.ndarray, low: np.ndarray, span: np.ndarray, levels: int
                      ) -> np.ndarray:
    """For groups ``w`` (..., GROUP_SIZE) with their minimum and span: the number of steps n
    (1..levels) of an evenly spaced grid from minimum to maximum that holds every value, or 0
    where there is none.

    Why: re-quantizing a block that already is ``d * q + m`` with min-max steps of span/levels
    moves every value whose codes do not reach both ends (a Q4_0 block rarely uses code 15, a
    Q4_K one often neither end) by up to half a step: rounding twice. The step ``d`` is found as
    the smallest gap between sorted values, which is k·d: n = k·span/gap for k = 1, 2, …."""
    rows = 4096  # in chunks of rows: bounded temporaries for a 262k-row embedding
    return np.concatenate([_grid_steps(w[r:r + rows], low[r:r + rows], span[r:r + rows], levels)
                           for r in range(0, w.shape[0], rows)])


def _grid_steps(w: np.ndarray, low: np.ndarray, span: np.ndarray, levels: int) -> np.ndarray:
    ordered = np.sort(w, axis=-1)
    gaps = np.diff(ordered, axis=-1)
    tiny = span * (GRID_TOLERANCE / levels)
    smallest = np.where(gaps > tiny, gaps, np.inf).min(axis=-1, keepdims=True)
    found = np.zeros(span.shape, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isfinite(smallest), span / smallest, 0.0)  # n / k
    todo = (ratio > 0.5) & (ratio <= levels + 0.5)
    k = 1
    while todo.any() and k <= levels:
        n = np.rint(ratio * k).astype(np.int64)
        todo &= n <= levels
        idx = np.nonzero(todo[..., 0])
        if not idx[0].size:
            break
        step = span[idx] / n[idx]
        pos = (w[idx] - low[idx]) / step
        on_grid = (np.abs(pos - np.rint(pos)) <= GRID_TOLERANCE).all(axis=-1)
        hit = tuple(i[on_grid] for i in idx)
        found[hit] = n[hit]
        todo[hit] = False
        k += 1
    return found


def dequantize(packed: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """Inverse of ``quantize`` in float32 (the reference for tests); the bit width follows
    from the shapes (words per group)."""
    out_features, words = packed.shape
    bits = WORD_BITS * words // (scale.shape[1] * GROUP_SIZE)
    per_word = WORD_BITS // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    q = (packed[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)
    values = q.reshape(out_features, words * per_word).astype(np.float32)
    return (values * np.repeat(scale.astype(np.float32), GROUP_SIZE, axis=1)
            + np.repeat(minimum.astype(np.float32), GROUP_SIZE, axis=1))


# -- mixed schemes

def ggml_bits(type_name: str) -> int | None:
    """Bits per weight of a GGML tensor type by its name (Q4_K -> 4, Q6_K -> 6, IQ4_XS -> 4,
    Q8_0 -> 8, MXFP4 -> 4); None for a float type (F32, F16, BF16) or an unknown name."""
    m = re.fullmatch(r"I?Q(\d)_.*|MXFP(\d)", type_name)
    return int(m.group(1) or m.group(2)) if m else None


# a fused wick linear and the checkpoint's linears it is made of (decoder.fuse_layer_weights)
FUSED_FROM = {"qkv_proj": ("q_proj", "k_proj", "v_proj", "qkv_proj"),
              "gate_up_proj": ("gate_proj", "up_proj", "gate_up_proj")}
WIDE_LINEARS = ("model.embed_tokens.table", "lm_head")  # 8 bits in a mixed scheme, always


def mixed_plan(quant: Quantization, source_types: dict[str, str]
               ) -> Callable[[str], Quantization]:
    """For a mixed scheme: linear name (``model.layers.3.mlp.down_proj``) -> its packing.

    8 bits for the token embedding and the LM head (a vocabulary's rows are where 4 bits
    cost most: SmolLM2 loses 6 % perplexity there alone); and, where the checkpoint itself
    mixes widths (a GGUF Q4_K_M keeps some tensors in Q5_0/Q6_K/Q8_0), 8 bits for a linear any
    of whose source tensors has more than 4 bits: llama.cpp's own judgement of which tensors
    need them. MXFP4 (gpt-oss's experts, in a GGUF or OpenAI's ``*_blocks``/``*_scales``):
    8 bits, always, since its values (multiples of half a block's power of two, at most 6 of
    them) lie on an 8-bit group's grid and are kept exactly, where 4 affine bits cannot hold
    them (zero is not on that grid: 6.7 % RMS error on Gaussian-like blocks). Everything else
    4 bits (a 4-bit source block is kept exactly, see ``quantize``). ``source_types``:
    checkpoint weight name -> GGML type or safetensors dtype."""
    narrow, wide = plain(4, quant.dtype), plain(8, quant.dtype)
    widths = {ggml_bits(t) for t in source_types.values()} - {None}
    mixed_source = any(b <= 4 for b in widths) and any(b > 4 for b in widths)

    def source_type(weight: str) -> str | None:
        if f"{weight}_blocks" in source_types:  # OpenAI's MXFP4 layout (bytes of codes)
            return "MXFP4"
        return source_types.get(f"{weight}.weight")

    def quant_of(linear: str) -> Quantization:
        if linear in WIDE_LINEARS:
            return wide
        parent, _, leaf = linear.rpartition(".")
        sources = [source_type(f"{parent}.{name}") for name in FUSED_FROM.get(leaf, (leaf,))]
        if "MXFP4" in sources:
            return wide
        bits = [ggml_bits(t) for t in sources if t is not None]
        return wide if mixed_source and any(b is not None and b > 4 for b in bits) else narrow

    return quant_of
