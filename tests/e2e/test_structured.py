"""Structured output and the sampling surface through ``wick.Engine``'s API on the real kernels
(tiny random Llama, q0f32, lavapipe), against independent references: logprobs against
torch.log_softmax of transformers' logits, penalties and bias against transformers'
LogitsProcessors, constrained outputs against the ``jsonschema`` package."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from wick.engine import EngineAPI
from wick.engine.errors import InvalidRequestError
from tests.e2e.helpers import hf_logits

generation = pytest.importorskip("transformers.generation.logits_process")



@pytest.fixture(scope="module")
def api(tiny_core):
    return EngineAPI(tiny_core)


@pytest.fixture(scope="module")
def PROMPT(api):
    return api.core.tokenizer.encode("Hello, world")


def byte_of(api, token: int) -> int:
    """A byte-level token's byte, by transformers' own GPT-2 table (not wick's)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}[api.core.tokenizer.id_to_token(token)]


def test_logprobs_equal_torch_log_softmax(api, tiny_hf, PROMPT):
    r = api.completions.create(prompt=PROMPT, max_tokens=8, temperature=0, logprobs=5,
                               ignore_eos=True)
    lp = r.choices[0].logprobs
    ref_tokens = []
    seq = list(PROMPT)
    for i in range(8):
        logits = torch.tensor(hf_logits(tiny_hf, seq)[-1], dtype=torch.float64)
        ref = torch.log_softmax(logits, -1)
        token = int(torch.argmax(ref))
        ref_tokens.append(token)
        assert abs(lp.token_logprobs[i] - float(ref[token])) < 1e-3
        top = torch.topk(ref, 5)
        got = list(lp.top_logprobs[i].items())
        # the top entries: most likely first, equal to torch's top-k (texts of byte tokens)
        assert [v for _, v in got] == sorted((v for _, v in got), reverse=True)
        np.testing.assert_allclose([v for _, v in got], top.values.numpy(), atol=1e-3)
        seq.append(token)
    assert api.core.tokenizer.decode(ref_tokens) == r.choices[0].text
    # tokens that are not whole UTF-8 characters are spelled "bytes:\xNN", as OpenAI does
    raw = [byte_of(api, t) for t in ref_tokens]
    assert lp.tokens == [chr(b) if b < 128 else f"bytes:\\x{b:02x}" for b in raw]
    assert len(lp.tokens) == 8 and r.usage.completion_tokens == 8
    # chat shape: the same numbers, bytes that join to the text
    c = api.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                    temperature=0, logprobs=True, top_logprobs=3,
                                    ignore_eos=True)
    content = c.choices[0].logprobs.content
    assert len(content) == 6
    assert bytes(b for e in content for b in e.bytes).decode(errors="replace") == \
        c.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6
    assert c.to_dict()["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0].keys() == {
        "token", "logprob", "bytes"}


def test_penalties_and_bias_match_transformers(api, tiny_hf, PROMPT):
    """Greedy under repetition/frequency/presence penalties and a bias: the same tokens as a
    reference loop applying transformers' processors (and OpenAI's formula) to its logits;
    the logprobs stay the model's own."""
    bias = {"101": -100.0, "32": 5.0, "111": 2.5}
    r = api.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0,
                               ignore_eos=True, repetition_penalty=1.5, frequency_penalty=0.7,
                               presence_penalty=0.4, logit_bias=bias)
    seq = list(PROMPT)
    out: list[int] = []
    rep = generation.RepetitionPenaltyLogitsProcessor(1.5)
    seq_bias = generation.SequenceBiasLogitsProcessor({(int(k),): v for k, v in bias.items()})
    for i in range(12):
        logits = torch.tensor(hf_logits(tiny_hf, seq)[-1][None], dtype=torch.float64)
        raw = torch.log_softmax(logits[0], -1)
        scores = rep(torch.tensor([seq]), logits.clone())
        counts = torch.bincount(torch.tensor(out, dtype=torch.long),
                                minlength=logits.shape[1]).double()
        scores = scores - 0.7 * counts - 0.4 * (counts > 0)
        scores = seq_bias(torch.tensor([seq]), scores)
        token = int(torch.argmax(scores))
        assert abs(r.choices[0].logprobs.token_logprobs[i] - float(raw[token])) < 1e-3
        out.append(token)
        seq.append(token)
    assert 101 not in out
    plain = api.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    # the same 12 token ids (each spelled as the logprobs spell it)
    assert r.choices[0].logprobs.tokens == [api.token_texts.of(t)[0] for t in out]
    assert r.choices[0].text != plain.choices[0].text


SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "color": {"enum": ["red", "green", "blue"]}},
     "required": ["ok", "color"]},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "n": {"type": "integer", "minimum": 0, "maximum": 999}},
     "required": ["name", "n"]},
    {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 1, "maxItems": 3},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["enum-bool", "string-int", "array"])
def test_json_schema_outputs_validate(api, schema):
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema,
                                                  "strict": True}}
    r = api.chat.completions.create(messages=[{"role": "user", "content": "JSON please"}],
                                    response_format=fmt, max_tokens=96, temperature=0)
    greedy = r.choices[0]
    assert greedy.finish_reason == "stop", greedy.message.content
    jsonschema.validate(json.loads(greedy.message.content), schema)
    # sampled, several choices with a seed: all valid, reproducible, not all equal
    kw = dict(messages=[{"role": "user", "content": "JSON please"}], response_format=fmt,
              max_tokens=96, temperature=1.0, n=3, seed=11)
    first = api.chat.completions.create(**kw)
    again = api.chat.completions.create(**kw)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in again.choices]
    for c in first.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), schema)


def test_json_object_and_ebnf(api, PROMPT):
    r = api.chat.completions.create(messages=[{"role": "user", "content": "x"}],
                                    response_format={"type": "json_object"}, max_tokens=64,
                                    temperature=0.7, seed=3, min_p=0.05, top_k=50)
    if r.choices[0].finish_reason == "stop":  # a random model may talk until max_tokens
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.lstrip().startswith("{")
    grammar = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
    for seed in range(4):
        r = api.completions.create(prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed,
                                   response_format={"type": "grammar", "grammar": grammar})
        text = r.choices[0].text
        assert r.choices[0].finish_reason == "stop"
        head, digits = text.split(" ")
        assert head in ("yes", "no") and digits.isdigit() and 1 <= len(digits) <= 2


def test_streamed_constrained_text_equals_the_whole(api):
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMAS[0]}}
    kw = dict(messages=[{"role": "user", "content": "go"}], response_format=fmt,
              max_tokens=64, temperature=0, logprobs=True)
    whole = api.chat.completions.create(**kw)
    chunks = list(api.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in
                                             whole.choices[0].logprobs.content]


@pytest.mark.parametrize(("fmt", "param", "code"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}},
     "response_format.json_schema.schema", "invalid_json_schema"),
    ({"type": "grammar", "grammar": 'root ::= "a" | '}, "response_format.grammar",
     "invalid_grammar"),
    ({"type": "grammar", "grammar": 'start ::= "a"'}, "response_format.grammar",
     "invalid_grammar"),
])
def test_bad_grammars_are_400s(api, fmt, param, code):
    with pytest.raises(InvalidRequestError) as e:
        api.chat.completions.create(messages=[{"role": "user", "content": "x"}],
                                    response_format=fmt, max_tokens=4)
    assert (e.value.param, e.value.code, e.value.status) == (param, code, 400)
    assert "[" not in e.value.message.split(":")[0]  # no C++ log prefix
    assert not api.core.has_unfinished()


def test_processing_leaves_the_plans_cached_dispatches_alone(api, PROMPT):
    """A step with logit processing adds its dispatches to its own list, never to the plan's
    cached one (which the next step of that shape reuses)."""
    runner = api.core.runner

    def lengths():
        return {(plan.name, key): len(hit[0]) for plan in (runner.forward, runner.decode,
                                                           runner.decode1, runner.sample)
                for key, hit in plan._cache.items()}

    kw = dict(prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={"7": 3.0}, logprobs=2)
    api.completions.create(**kw)
    first = lengths()
    api.completions.create(**kw)
    assert {k: v for k, v in lengths().items() if k in first} == first
