"""Quantized variants: perplexity of SmolLM2 on a fixed public-domain text (q0f32 vs transformers,
q4 vs transformers holding the artifact's dequantized weights, q4 vs q0f32), and the tiny model's
q4f32_1 logits against transformers with ``dequantize_q4`` weights (the packing, exactly)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import TINY_OPTIONS
from tests.e2e.helpers import (
    ids_of,
    SMOLLM2,
    all_position_logits,
    decode_logits,
    forward_plan_only,
    hf_greedy,
    hf_logits,
    hf_model_from_artifact,
    load_artifact,
    make_core,
    perplexity,
    prefill_logits,
    run_core,
    greedy,
)

# Genesis 1:1-6, King James Version (public domain).
GENESIS = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
    "of the waters. And God said, Let there be light: and there was light. And God saw the light, "
    "that it was good: and God divided the light from the darkness. And God called the light Day, "
    "and the darkness he called Night. And the evening and the morning were the first day. And "
    "God said, Let there be a firmament in the midst of the waters, and let it divide the waters "
    "from the waters."
)
NUM_TOKENS = 64  # two steps of 32 positions per variant on lavapipe

_ppl: dict[str, float] = {}  # quantization -> wick perplexity, shared by the tests below


@pytest.fixture(scope="module")
def text_ids(smollm2_core):
    ids = smollm2_core("q0f32").tokenizer.encode(GENESIS)
    assert len(ids) > NUM_TOKENS
    return ids[:NUM_TOKENS]


def wick_perplexity(core, ids) -> tuple[float, np.ndarray]:
    # every position's logits via the prefill plan (faster than 32-row GEMV on lavapipe)
    with forward_plan_only(core.runner):
        logits = all_position_logits(core.runner, ids)
    assert logits.shape == (len(ids), core.info.vocab_size)
    return perplexity(logits, ids), logits


@pytest.mark.slow
def test_q0f32_perplexity_equals_transformers(smollm2_core, smollm2_hf, text_ids):
    core = smollm2_core("q0f32")
    ppl, logits = wick_perplexity(core, text_ids)
    ref_logits = hf_logits(smollm2_hf, text_ids)
    ref = perplexity(ref_logits, text_ids)
    diff = np.abs(logits - ref_logits).max()
    print(f"q0f32 perplexity wick {ppl:.4f} transformers {ref:.4f}; max logit diff {diff:.2e}")
    _ppl["q0f32"] = ppl
    assert abs(ppl - ref) / ref < 0.01
    assert diff < 1e-3
    assert 1.5 < ppl < 30  # a real language model on English text


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["q4f32_1", "q4f16_1"])
def test_q4_perplexity_equals_dequantized_reference(quant, smollm2_core, smollm2_hf, text_ids,
                                                    compiled, backend):
    if quant.endswith("f16_1") and "shader-f16" not in backend.features:
        pytest.skip("device lacks shader-f16")
    core = smollm2_core(quant)
    ppl, logits = wick_perplexity(core, text_ids)
    _ppl[quant] = ppl
    # transformers holding exactly the weights the artifact stores (q4 dequantized, float32)
    ref_model = hf_model_from_artifact(load_artifact(compiled(SMOLLM2, quant)), smollm2_hf)
    ref_logits = hf_logits(ref_model, text_ids)
    ref = perplexity(ref_logits, text_ids)
    diff = np.abs(logits - ref_logits).max()
    print(f"{quant} perplexity wick {ppl:.4f} transformers(dequantized artifact) {ref:.4f}; "
          f"max logit diff {diff:.2e}")
    if quant == "q4f32_1":
        assert abs(ppl - ref) / ref < 0.01
        assert diff < 2e-3
    else:  # float16 activations against a float32 reference
        assert abs(ppl - ref) / ref < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["q4f32_1", "q4f16_1"])
def test_q4_perplexity_within_10_percent_of_q0f32(quant, smollm2_core, text_ids, backend):
    if quant.endswith("f16_1") and "shader-f16" not in backend.features:
        pytest.skip("device lacks shader-f16")
    for q in ("q0f32", quant):
        if q not in _ppl:
            _ppl[q] = wick_perplexity(smollm2_core(q), text_ids)[0]
    print(f"{quant} perplexity {_ppl[quant]:.4f} vs q0f32 {_ppl['q0f32']:.4f}")
    assert _ppl[quant] < 1.10 * _ppl["q0f32"]


# ----------------------------------------------------------------------------- tiny q4f32_1 / q8f32_1


@pytest.fixture(scope="module", params=["q4f32_1", "q8f32_1"])
def tiny_q4(request, tiny_llama_dir, tiny_hf, compiled, backend):
    """(core, transformers with the artifact's dequantized weights, artifact) of a packed
    f32 variant (the name is historical: 4- and 8-bit)."""
    art_dir = compiled(tiny_llama_dir, request.param, **TINY_OPTIONS)
    art = load_artifact(art_dir)
    return make_core(art_dir, num_pages=64), hf_model_from_artifact(art, tiny_hf), art


def worst_logit_diff(runner, ref, prompts):
    """Prefill-plan and decode-plan logits, and their largest difference from ``ref``."""
    pre = prefill_logits(runner, prompts)
    dec = decode_logits(runner, prompts)
    worst = max(max(np.abs(pre[i] - (want := hf_logits(ref, p)[-1])).max(),
                    np.abs(dec[i] - want).max()) for i, p in enumerate(prompts))
    return pre, dec, worst


def test_tiny_q4_artifact_is_packed(tiny_q4):
    _, _, art = tiny_q4
    per_word = 8 if art.quantization.startswith("q4") else 4
    by_name = {p.name: p for p in art.params}
    q = by_name["model.layers.0.mlp.down_proj.weight_q"]
    s = by_name["model.layers.0.mlp.down_proj.weight_scale"]
    m = by_name["model.layers.0.mlp.down_proj.weight_min"]
    assert q.dtype == "uint32" and q.shape == (64, 128 // per_word)
    assert s.dtype == m.dtype == "float32" and s.shape == m.shape == (64, 128 // 32)
    assert not any(n.endswith(".weight") and "proj" in n for n in by_name)


def test_tiny_q4_logits_equal_dequantized_transformers(tiny_q4, tiny_hf):
    core, ref, art = tiny_q4
    prompts = [ids_of(n, 30 + n) for n in (3, 16, 17, 40)]
    pre, dec, worst = worst_logit_diff(core.runner, ref, prompts)
    print(f"tiny {art.quantization} vs transformers(dequantized weights): max logit diff "
          f"{worst:.2e}")
    assert worst < 1e-3
    # the quantization is real: the logits are not those of the float model (8 bits: 16x
    # finer steps: about a tenth of the q4 difference here)
    off = np.abs(pre[1] - hf_logits(tiny_hf, prompts[1])[-1]).max()
    print(f"tiny {art.quantization} vs the float model: max logit diff {off:.2e}")
    assert off > 0.5 if art.quantization.startswith("q4") else 1e-4 < off < 0.3


def test_tiny_q4_greedy_equals_dequantized_transformers(tiny_q4):
    core, ref, _ = tiny_q4
    prompt = ids_of(21, 7)
    (got,) = run_core(core, [prompt], greedy(24))
    assert got == hf_greedy(ref, prompt, 24)


@pytest.mark.parametrize("quant", ["q0f16", "q4f16_1", "q8f16_1"])
def test_tiny_f16_variants_track_their_reference(quant, tiny_llama_dir, tiny_hf, compiled,
                                                   backend):
    """float16 activations: logits within 0.1 (they come out ~0.03 off on this model, whose
    logits reach ~5) of transformers float32 holding the artifact's weights."""
    if "shader-f16" not in backend.features:
        pytest.skip("device lacks shader-f16")
    art_dir = compiled(tiny_llama_dir, quant, **TINY_OPTIONS)
    art = load_artifact(art_dir)
    assert art.required_features == ["shader-f16"]
    core = make_core(art_dir, num_pages=64)
    ref = hf_model_from_artifact(art, tiny_hf)
    prompts = [ids_of(n, 80 + n) for n in (3, 16, 17, 40)]
    pre, dec, worst = worst_logit_diff(core.runner, ref, prompts)
    print(f"tiny {quant}: max logit diff {worst:.2e}")
    assert worst < 0.1
    assert np.abs(pre - dec).max() < 0.1
