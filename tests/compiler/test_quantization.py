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


def _gguf_round_trip(w: np.ndarray, kind: str) -> np.ndarray:
    """``w`` through the gguf package's own quantizer and dequantizer."""
    from gguf import GGMLQuantizationType, quants

    t = GGMLQuantizationType[kind]
    return quants.dequantize(quants.quantize(w, t), t)


@pytest.mark.parametrize("name,kinds", [("q4f32_1", ["Q4_0", "Q4_1"]),
                                        ("q8f32_1", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])])
def test_a_quantized_source_keeps_its_values(name, kinds):
    """A GGUF block of at most 2^bits levels is re-quantized exactly, whichever codes it uses
    (Q4_0 rarely reaches code 15, Q8_0 spans 254 steps, not 255): rounding once, not twice."""
    w = np.random.default_rng(2).normal(size=(64, 256)).astype(np.float32)
    quant = get_quantization(name)
    for kind in kinds:
        source = _gguf_round_trip(w, kind)
        back = dequantize(*quantize(source, quant))
        np.testing.assert_allclose(back, source, rtol=0, atol=1e-6 * np.abs(source).max(),
                                   err_msg=kind)
        f16 = dequantize(*quantize(source, get_quantization(name.replace("f32", "f16"))))
        assert np.abs(f16 - source).max() <= 1e-3 * np.abs(source).max(), kind  # f16 scale


def test_a_k_quant_block_keeps_its_values():
    """Q4_K-shaped groups (d·q − m with codes that reach neither 0 nor 15) keep their values;
    without the grid, min-max steps would move them by up to half a step."""
    rng = np.random.default_rng(3)
    groups = 6
    d = rng.uniform(0.01, 0.05, size=(groups, 1)).astype(np.float32)
    m = rng.uniform(0.0, 0.3, size=(groups, 1)).astype(np.float32)
    q = rng.integers(2, 13, size=(groups, GROUP_SIZE)).astype(np.float32)
    source = (d * q - m).reshape(1, groups * GROUP_SIZE)
    back = dequantize(*quantize(source, Q4))
    np.testing.assert_allclose(back, source, rtol=0, atol=1e-6)


def _min_max(w: np.ndarray, levels: int) -> np.ndarray:
    """Min-max rounding of ``w``'s groups (the reference the fitted range must beat)."""
    g = w.reshape(w.shape[0], -1, GROUP_SIZE)
    low = g.min(-1, keepdims=True)
    scale = (g.max(-1, keepdims=True) - low) / levels
    return (np.rint((g - low) / np.where(scale > 0, scale, 1)) * scale + low).reshape(w.shape)


def _weighted_error(w: np.ndarray, back: np.ndarray) -> np.ndarray:
    """Each group's squared error weighted by importance (group RMS + |w|), as documented."""
    g = w.reshape(w.shape[0], -1, GROUP_SIZE)
    weight = np.sqrt((g * g).mean(-1, keepdims=True)) + np.abs(g)
    return (weight * (g - back.reshape(g.shape)) ** 2).sum(-1)


def test_values_off_any_grid_get_a_fitted_range_in_4_bits_and_min_max_in_8():
    row = np.array([[0.0, 1.0, 0.5, 0.3] + [0.25] * (GROUP_SIZE - 4)], dtype=np.float32)
    back = dequantize(*quantize(row, Q4))
    assert _weighted_error(row, back) < 0.5 * _weighted_error(row, _min_max(row, 15))
    off = np.random.default_rng(5).normal(size=(1, GROUP_SIZE)).astype(np.float32)
    _, scale, minimum = quantize(off, get_quantization("q8f32_1"))
    assert minimum[0, 0] == off.min() and scale[0, 0] == np.float32((off.max() - off.min()) / 255)
    on_grid = row.copy()
    on_grid[0, 3] = 0.75  # now every value is a multiple of 1/4: four steps
    _, scale, _ = quantize(on_grid, Q4)
    assert scale[0, 0] == 0.25
    np.testing.assert_array_equal(dequantize(*quantize(on_grid, Q4)), on_grid)


@pytest.mark.parametrize("name", ["q4f32_1", "q4f16_1", "q8f32_1"])
def test_each_value_goes_to_its_nearest_code(name):
    """Within its group's range a value is off by at most half a step; past it (a fitted
    4-bit range may leave a group's extremes out), it goes to the range's end."""
    w = np.random.default_rng(1).normal(size=(16, 64)).astype(np.float32)
    quant = get_quantization(name)
    packed, scale, minimum = quantize(w, quant)
    step = np.repeat(scale.astype(np.float32), GROUP_SIZE, 1)
    low = np.repeat(minimum.astype(np.float32), GROUP_SIZE, 1)
    high = low + quant.levels * step
    outside = np.maximum(0, np.maximum(low - w, w - high))
    err = np.abs(dequantize(packed, scale, minimum) - w)
    assert (err <= step / 2 + outside + 1e-6).all()
    if quant.weight_bits == 8:
        assert outside.max() < 1e-6 and err.max() < 0.03  # min-max: 17x finer than 4 bits


@pytest.mark.parametrize("name", ["q4f32_1", "q4f16_1"])
def test_a_fitted_range_is_never_worse_than_min_max_and_mostly_better(name):
    rng = np.random.default_rng(4)
    # Gaussian groups, heavy-tailed ones (a few outliers: where min-max wastes codes most),
    # and constant ones (zero error either way)
    w = np.concatenate([rng.normal(size=(64, 256)), rng.standard_t(3, size=(64, 256)),
                        np.full((4, 256), 0.5)]).astype(np.float32)
    fitted = _weighted_error(w, dequantize(*quantize(w, get_quantization(name))))
    min_max = _weighted_error(w, _min_max(w, 15))
    slack = 1e-6 if name == "q4f32_1" else 2e-3  # (float16 scales move either rounding)
    assert (fitted <= min_max * (1 + slack) + 1e-9).all()
    assert fitted.sum() < 0.9 * min_max.sum()
    assert (fitted[-4:] == 0).all()


def test_unknown_quantization_names_the_choices():
    with pytest.raises(ValueError, match="q4f16_1.*q8f32_1"):
        get_quantization("q3f16")


def _plan(name, types):
    from wick.compiler.quantization import QUANTIZATIONS, mixed_plan

    plan = mixed_plan(QUANTIZATIONS[name], types)
    linears = ["model.embed_tokens.table", "lm_head", "model.layers.0.self_attn.qkv_proj",
               "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.gate_up_proj",
               "model.layers.0.mlp.down_proj"]
    return [plan(n).name for n in linears]


def test_a_mixed_scheme_widens_what_a_mixed_checkpoint_keeps_wide():
    """Q4_K_M-like: q and k in 4 bits but v in Q6_K -> the fused qkv in 8; ffn_down in Q6_K
    -> 8; the rest 4; the embedding and the head 8 whatever they were."""
    layer = "model.layers.0."
    types = {"model.embed_tokens.weight": "Q4_K", layer + "self_attn.q_proj.weight": "Q4_K",
             layer + "self_attn.k_proj.weight": "Q4_K", layer + "self_attn.v_proj.weight": "Q6_K",
             layer + "self_attn.o_proj.weight": "Q4_K", layer + "mlp.gate_proj.weight": "Q4_K",
             layer + "mlp.up_proj.weight": "Q4_K", layer + "mlp.down_proj.weight": "Q6_K",
             "model.norm.weight": "F32"}
    assert _plan("q4f16_m", types) == ["q8f16_1", "q8f16_1", "q8f16_1", "q4f16_1", "q4f16_1",
                                       "q8f16_1"]
    assert _plan("q4f32_m", types)[3] == "q4f32_1"


@pytest.mark.parametrize("kind", ["Q8_0", "BF16", "F16"])
def test_a_uniform_checkpoint_gets_4_bit_layers_and_an_8_bit_vocabulary(kind):
    """A checkpoint of one width says nothing about which tensors need more: 4-bit layers
    (decode speed of q4), 8-bit embedding and head (where 4 bits cost most)."""
    types = {"model.embed_tokens.weight": kind, "model.layers.0.mlp.down_proj.weight": kind,
             "model.layers.0.self_attn.v_proj.weight": kind}
    assert _plan("q4f16_m", types) == ["q8f16_1", "q8f16_1"] + ["q4f16_1"] * 4


def test_mixed_names_and_twins():
    from wick.compiler.quantization import f32_twin, ggml_bits

    assert f32_twin("q4f16_m") == "q4f32_m" and f32_twin("q4f16_1") == "q4f32_1"
    assert [ggml_bits(t) for t in ("Q4_K", "IQ4_XS", "Q5_0", "Q6_K", "Q8_0", "MXFP4", "F16",
                                   "BF16")] == [4, 4, 5, 6, 8, 4, None, None]


@pytest.mark.parametrize("bits, exact", [(8, True), (4, False)])
def test_mxfp4_values_lie_on_an_8_bit_grid_only(bits, exact):
    """gpt-oss's expert values (e2m1 codes times a block's power of two): an 8-bit group
    keeps them exactly, 4 affine bits do not (zero is off their grid)."""
    from wick.compiler.models.gpt_oss import MXFP4_VALUES, mxfp4_floats
    from wick.compiler.quantization import dequantize, plain, quantize

    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (64, 90, 16), dtype=np.uint8)
    scales = rng.integers(118, 130, (64, 90), dtype=np.uint8)
    w = mxfp4_floats(blocks, scales)
    assert set(np.unique(np.abs(w[0, :32]) / 2.0 ** (int(scales[0, 0]) - 127))) <= set(
        np.abs(MXFP4_VALUES))
    back = dequantize(*quantize(w, plain(bits, "float32")))
    assert np.array_equal(back, w) == exact
    if not exact:
        assert np.sqrt(((back - w) ** 2).mean() / (w ** 2).mean()) > 0.02


def test_a_mixed_scheme_keeps_mxfp4_experts_in_8_bits():
    """gpt-oss's MXFP4 expert stacks, as a GGUF names them (gate and up apart) and as OpenAI's
    checkpoint does (blocks and scales), go to 8 bits; its bf16 layers to 4."""
    from wick.compiler.quantization import QUANTIZATIONS, mixed_plan

    ex = "model.layers.0.mlp.experts."
    attention = {"model.layers.0.self_attn.q_proj.weight": "BF16",
                 "model.layers.0.self_attn.o_proj.weight": "BF16"}
    gguf = {ex + "gate_proj.weight": "MXFP4", ex + "up_proj.weight": "MXFP4",
            ex + "down_proj.weight": "MXFP4", **attention}
    openai = {ex + "gate_up_proj_blocks": "U8", ex + "gate_up_proj_scales": "U8",
              ex + "down_proj_blocks": "U8", ex + "down_proj_scales": "U8", **attention}
    for types in (gguf, openai):
        plan = mixed_plan(QUANTIZATIONS["q4f16_m"], types)
        assert [plan(ex + "gate_up_proj").name, plan(ex + "down_proj").name,
                plan("model.layers.0.self_attn.qkv_proj").name,
                plan("model.layers.0.self_attn.o_proj").name] == [
            "q8f16_1", "q8f16_1", "q4f16_1", "q4f16_1"]
