"""Weight quantization schemes: q0f32, q0f16, q4f32_1, q4f16_1.

``qAfB_1``: A-bit weights, B-bit activations. The packing of the 4-bit schemes is documented in
docs/quantization.md; this module is its one implementation (numpy packing at compile time,
TE dequantization fused by TVM into the GEMV/GEMM kernels at run time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_SIZE = 32  # weights sharing one scale and one minimum
VALUES_PER_WORD = 8  # 4-bit values packed in one uint32
LEVELS = 15  # nibble q encodes q * scale + minimum, q in 0..15


@dataclass(frozen=True, slots=True)
class Quantization:
    name: str
    weight_bits: int  # 0 = not quantized
    dtype: str  # activation / compute dtype: "float32" | "float16"

    @property
    def quantized(self) -> bool:
        return self.weight_bits == 4

    @property
    def needs_f16(self) -> bool:
        return self.dtype == "float16"


QUANTIZATIONS = {
    "q0f32": Quantization("q0f32", 0, "float32"),
    "q0f16": Quantization("q0f16", 0, "float16"),
    "q4f32_1": Quantization("q4f32_1", 4, "float32"),
    "q4f16_1": Quantization("q4f16_1", 4, "float16"),
}


def f32_twin(name: str) -> str | None:
    """The variant with the same weights in float32 activations (runs without shader-f16), or
    None when ``name`` is already one."""
    quant = get_quantization(name)
    if not quant.needs_f16:
        return None
    return next(q.name for q in QUANTIZATIONS.values()
                if q.weight_bits == quant.weight_bits and not q.needs_f16)


def get_quantization(name: str) -> Quantization:
    try:
        return QUANTIZATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown quantization {name!r}; choose one of {', '.join(QUANTIZATIONS)}"
        ) from None


def quantize_q4(weight: np.ndarray, scale_dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, in) float weights -> packed (out, in/8) uint32, scale and minimum (out, in/32).

    Asymmetric per-group quantization along the input dimension: a group's values span
    [minimum, minimum + 15 * scale]. This is the shape of GGUF's Q4_1, so re-quantizing a Q4_1
    source is (up to rounding of the scale) lossless. Nibble ``k`` (bits 4k..4k+3) of word ``j``
    holds input column ``8*j + k``.
    """
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"q4 needs the input dimension divisible by {GROUP_SIZE}: {weight.shape}")
    w = weight.astype(np.float32).reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low = w.min(axis=2, keepdims=True)
    scale = (w.max(axis=2, keepdims=True) - low) / LEVELS
    # quantize against the stored (possibly float16) scale and minimum
    low = low.astype(scale_dtype).astype(np.float32)
    scale = scale.astype(scale_dtype).astype(np.float32)
    safe = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.rint((w - low) / safe), 0, LEVELS).astype(np.uint32)
    q = q.reshape(out_features, in_features // VALUES_PER_WORD, VALUES_PER_WORD)
    shifts = (np.arange(VALUES_PER_WORD, dtype=np.uint32) * 4)[None, None, :]
    packed = np.bitwise_or.reduce(q << shifts, axis=2).astype(np.uint32)
    return (packed, scale.reshape(out_features, -1).astype(scale_dtype),
            low.reshape(out_features, -1).astype(scale_dtype))


def dequantize_q4(packed: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """Inverse of quantize_q4 in float32 (the reference for tests)."""
    out_features, words = packed.shape
    shifts = (np.arange(VALUES_PER_WORD, dtype=np.uint32) * 4)[None, None, :]
    q = (packed[:, :, None] >> shifts) & 0xF
    values = q.reshape(out_features, words * VALUES_PER_WORD).astype(np.float32)
    return (values * np.repeat(scale.astype(np.float32), GROUP_SIZE, axis=1)
            + np.repeat(minimum.astype(np.float32), GROUP_SIZE, axis=1))
