"""Llama 3.x RoPE scaling from a GGUF's ``rope_freqs`` tensor.

transformers describes Llama 3's RoPE scaling by four numbers (``rope_type: "llama3"``, factor,
low/high frequency factors, original context); llama.cpp's converter instead stores the
per-frequency divisors those numbers produce (``rope_freqs.weight``, one per frequency):

    wavelength < original / high:  1
    wavelength > original / low:   factor
    between:  1 / ((1 - s) / factor + s),  s = (original / wavelength - low) / (high - low)

``s`` is linear in 1 / wavelength, so the divisors between the two bands give the line back
(a least-squares fit), and with it the band edges; any ``original`` reproduces the same
frequencies, so the nominal one is kept. The numbers found are checked by recomputing every
divisor: a file whose divisors do not follow the formula is refused, never approximated.
"""

from __future__ import annotations

import math

import numpy as np

NOMINAL_ORIGINAL = 8192  # Llama 3.1's; the recovered bands do not depend on it


class NotLlama3Factors(ValueError):
    pass


def llama3_divisors(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """The per-frequency divisors of HF's llama3 rope_scaling (llama.cpp's formula)."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelength = 2 * math.pi / inv
    original = scaling["original_max_position_embeddings"]
    low, high, factor = (scaling["low_freq_factor"], scaling["high_freq_factor"],
                         scaling["factor"])
    smooth = (original / wavelength - low) / (high - low)
    out = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelength < original / high, 1.0, out)
    return np.where(wavelength > original / low, factor, out)


def llama3_scaling(divisors: np.ndarray, theta: float, head_dim: int) -> dict:
    """HF's ``rope_scaling`` dict whose divisors are ``divisors`` (to 1e-4), or
    ``NotLlama3Factors``."""
    d = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if d.shape != (head_dim // 2,) or not np.all(np.isfinite(d)) or d.min() < 1 - 1e-6:
        raise NotLlama3Factors(f"expected {head_dim // 2} divisors >= 1")
    factor = float(d.max())
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = inv / (2 * math.pi)  # 1 / wavelength
    if factor <= 1 + 1e-6:
        raise NotLlama3Factors("all divisors are 1: no scaling")
    medium = (d > 1 + 1e-6) & (d < factor - 1e-6 * factor)
    if medium.sum() >= 2:
        smooth = (1 / d[medium] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(x[medium], smooth, 1)
    else:
        # no (or one) frequency between the bands: put the edges midway between neighbours
        high_band, low_band = x[d <= 1 + 1e-6], x[d >= factor * (1 - 1e-6)]
        if not len(high_band) or not len(low_band):
            raise NotLlama3Factors("the divisors do not form llama3's two bands")
        x0 = (high_band.min() + (x[medium].max() if medium.any() else low_band.max())) / 2
        x1 = ((x[medium].min() if medium.any() else high_band.min()) + low_band.max()) / 2
        x0, x1 = min(x0, x1), max(x0, x1)
        a = 1 / (x1 - x0) if x1 > x0 else 1.0
        b = -a * x0
    if a <= 0:
        raise NotLlama3Factors("the divisors grow with frequency")
    original = NOMINAL_ORIGINAL
    # s = a * x + b = (original * x - low) / (high - low)  =>  high - low = original / a
    span = original / a
    low = -b * span
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
               "high_freq_factor": float(low + span),
               "original_max_position_embeddings": original}
    again = llama3_divisors(scaling, theta, head_dim)
    if np.max(np.abs(again - d) / d) > 1e-4:
        raise NotLlama3Factors("the divisors do not follow llama3's formula")
    return scaling
