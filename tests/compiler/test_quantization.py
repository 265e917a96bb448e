"""The q4 / q8 packing (docs/quantization.md) against hand-computed values."""

import numpy as np
import pytest

from wick.compiler.quantization import GROUP_SIZE, dequantize, get_quantization, quantize

Q4 = get_quantization("q4f32_1")


def test_packing_layout_is_the_documented_one():
    # one row, one group: values 0..15 then 15..0 -> nibbles equal the values, scale 1, min 0
    row = np.array([list(range(16)) + list(range(15, -1, -1))], dtype=np.float32)
    packed, scale, minimum = quantize(row, Q4)
    assert packed.shape == (1, 4) and scale.shape == minimum.shape == (1, 1)
    assert scale[0, 0] == 1.0 and minimum[0, 0] == 0.0
    # nibble k of word j holds column 8j + k
    assert packed[0, 0] == sum(k << (4 * k) for k in range(8))
    assert packed[0, 3] == sum((7 - k) << (4 * k) for k in range(8))
    np.testing.assert_array_equal(dequantize(packed, scale, minimum), row)


@pytest.mark.parametrize("name", ["q8f32_1", "q8f16_1"])
def test_q8_packing_layout_is_the_documented_one(name):
    # one group spanning 0..255 in steps of 8 (+ 255): byte k of word j holds column 4j + k
    values = [8 * i for i in range(31)] + [255]
    row = np.array([values], dtype=np.float32) - 100.0
    packed, scale, minimum = quantize(row, get_quantization(name))
    assert packed.shape == (1, 8) and packed.dtype == np.uint32
    assert scale[0, 0] == 1.0 and minimum[0, 0] == -100.0
    assert scale.dtype == np.dtype("float32" if "f32" in name else "float16")
    assert packed[0, 0] == sum((8 * k) << (8 * k) for k in range(4))
    assert packed[0, 7] == sum(v << (8 * k) for k, v in enumerate(values[28:]))
    np.testing.assert_array_equal(dequantize(packed, scale, minimum), row)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_q4_1_grid_requantizes_losslessly(dtype):
    """GGUF Q4_1 blocks (d * q + m, f16 d and m) survive re-quantization: the point of the
    scale + minimum scheme (SmolLM2's built-in weights are Q4_1)."""
    rng = np.random.default_rng(0)
    out, cols = 8, 4 * GROUP_SIZE
    d = rng.uniform(0.001, 0.05, size=(out, cols // GROUP_SIZE)).astype(np.float16)
    m = rng.uniform(-0.4, 0.0, size=(out, cols // GROUP_SIZE)).astype(np.float16)
    q = rng.integers(0, 16, size=(out, cols))
    q[:, ::GROUP_SIZE] = 0  # every block uses its full range, as llama.cpp's quantizer makes it
    q[:, 1::GROUP_SIZE] = 15
    w = (q * np.repeat(d.astype(np.float32), GROUP_SIZE, 1)
         + np.repeat(m.astype(np.float32), GROUP_SIZE, 1)).astype(np.float32)
    back = dequantize(*quantize(w, get_quantization("q4" + dtype[0] + dtype[5:] + "_1")))
    assert np.abs(back - w).max() <= 1e-3 * np.abs(w).max()


@pytest.mark.parametrize("name", ["q4f32_1", "q8f32_1"])
def test_error_is_bounded_by_half_a_step(name):
    w = np.random.default_rng(1).normal(size=(16, 64)).astype(np.float32)
    packed, scale, minimum = quantize(w, get_quantization(name))
    err = np.abs(dequantize(packed, scale, minimum) - w)
    assert (err <= np.repeat(scale, GROUP_SIZE, 1) / 2 + 1e-6).all()
    # 8 bits: 17x finer steps than 4 (255 levels against 15)
    assert err.max() < (0.5 if name.startswith("q4") else 0.03)


def test_unknown_quantization_names_the_choices():
    with pytest.raises(ValueError, match="q4f16_1.*q8f32_1"):
        get_quantization("q3f16")
