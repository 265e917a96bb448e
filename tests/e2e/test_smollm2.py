"""SmolLM2-135M-Instruct (the bundled GGUF) compiled to q0f32, through the OpenAI-shaped API,
against transformers loading the same GGUF, on the CPU kernel set (a forward pass of 32 rows
took 20 s on lavapipe; the Llama family's WGSL kernels run on lavapipe on the tiny models of
test_tiny_parity.py, at SmolLM2's widths in test_batch_invariance.py, and over the widest
vocabulary in test_real_shapes.py)."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import hf_greedy, record, sibling_core
from wick.engine.api import EngineAPI

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
# the greedy chat's: a short system message of its own (a 21-token prompt); the answer, 8
# tokens, ends with the model's EOS
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


def test_chat_template_matches_transformers(smollm2_cpu_core, smollm2_path):
    from transformers import AutoTokenizer

    core = smollm2_cpu_core
    hf_tok = AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
    text = hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    # wick's tokenizer on both sides: transformers' GGUF tokenizer mis-splits digits
    assert core.chat_prompt_ids(MESSAGES) == core.tokenizer.encode(text)


def test_greedy_chat_equals_transformers(smollm2_cpu_core, smollm2_hf):
    core = smollm2_cpu_core
    ids = core.chat_prompt_ids(CHAT)
    with record(core.runner) as rec:
        r = EngineAPI(core).chat.completions.create(messages=CHAT, temperature=0, max_tokens=16)
    got = rec.sampled
    want = hf_greedy(smollm2_hf, ids, 16, stop_at_eos=True)
    print(f"wick: {got}\nhf:   {want}\ntext: {r.choices[0].message.content!r}")
    assert got == want
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(got)
    eos = core.info.eos_token_ids
    if want[-1] in eos:  # the model ended its answer: an EOS stop, not emitted as text
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.content == core.tokenizer.decode(want[:-1])
    else:
        assert r.choices[0].finish_reason == "length"
        assert r.choices[0].message.content == core.tokenizer.decode(want)
    assert "Paris" in r.choices[0].message.content
    assert core.kv.available_pages == core.kv.num_pages


def test_greedy_completion_equals_transformers(smollm2_cpu_core, smollm2_hf):
    """... and its logprobs equal torch.log_softmax of transformers' logits (|d| < 1e-2), the
    top 5 being torch's top 5."""
    import torch

    from tests.e2e.helpers import hf_logits

    core = smollm2_cpu_core
    api = EngineAPI(core)
    prompt = "The capital of France is"
    ids = core.prompt_ids(prompt)
    assert ids == core.tokenizer.encode(prompt)  # SmolLM2 adds no BOS
    with record(core.runner) as rec:
        r = api.completions.create(prompt=prompt, temperature=0, max_tokens=8, logprobs=5)
    want = hf_greedy(smollm2_hf, ids, 8, stop_at_eos=True)
    print(f"wick: {rec.sampled}\nhf:   {want}\ntext: {r.choices[0].text!r}")
    assert rec.sampled == want
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(want)
    text = r.choices[0].text
    assert text == core.tokenizer.decode([t for t in want if t not in core.info.eos_token_ids])
    assert "Paris" in text
    ref = torch.log_softmax(torch.tensor(hf_logits(smollm2_hf, ids + want)[len(ids) - 1:],
                                         dtype=torch.float64), -1)
    lp = r.choices[0].logprobs
    for i, token in enumerate(want):
        assert abs(lp.token_logprobs[i] - float(ref[i, token])) < 1e-2, i
        top = torch.topk(ref[i], 5)
        assert list(lp.top_logprobs[i].values()) == pytest.approx(top.values.tolist(), abs=1e-2)


def test_json_schema_output_validates(smollm2_cpu_core):
    """Structured output on a real model (the grammar's masks over its 49k-token vocabulary):
    on the CPU kernel set, whose q0f32 SmolLM2 the tests above check against transformers."""
    import json

    import jsonschema

    core = sibling_core(smollm2_cpu_core)
    api = EngineAPI(core)

    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24}, "country": {"type": "string",
                                                                 "maxLength": 24}},
        "required": ["city", "country"]}
    r = api.chat.completions.create(
        messages=[{"role": "user", "content": "Which city is the capital of France? JSON."}],
        temperature=0, max_tokens=40, response_format={
            "type": "json_schema", "json_schema": {"name": "capital", "schema": schema}})
    print(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    answer = json.loads(r.choices[0].message.content)
    jsonschema.validate(answer, schema)
    assert answer["city"] == "Paris"
    assert core.kv.available_pages == core.kv.num_pages
