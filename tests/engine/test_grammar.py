"""engine/grammar.py without a grammar library: the vocabulary given to xgrammar, token bytes
(against transformers' GPT-2 byte table), response_format -> spec, the compile cache, and
per-row logit adjustments."""

from __future__ import annotations

import json

import pytest

from wick.engine.grammar import (
    VOCAB_BYTE_LEVEL,
    GrammarCache,
    GrammarSpec,
    VocabInfo,
    response_format_spec,
)
from wick.engine.sequence import SamplingParams, logit_adjustments


def test_byte_level_token_bytes_and_grammar_vocab():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from tests.tiny_models import SPECIALS, byte_level_tokenizer

    tok = byte_level_tokenizer()
    vocab = VocabInfo.from_tokenizer_json(tok.to_str())
    assert vocab.vocab_type == VOCAB_BYTE_LEVEL and not vocab.add_prefix_space
    char_to_byte = {c: b for b, c in bytes_to_unicode().items()}
    for piece, i in tok.get_vocab().items():
        if piece in SPECIALS:
            assert i in vocab.special_ids
            continue
        assert vocab.token_bytes(i) == bytes([char_to_byte[piece]])
    blank = {i for i, p in enumerate(vocab.for_grammar()) if p == ""}
    never = {tok.token_to_id(bytes_to_unicode()[b]) for b in (0xC0, 0xC1, *range(0xF5, 0x100))}
    assert blank == set(vocab.special_ids) | never


def test_response_format_specs():
    assert response_format_spec(None) is None
    assert response_format_spec({"type": "text"}) is None
    assert response_format_spec({"type": "json_object"}) == GrammarSpec("json")
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    spec = response_format_spec({"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": schema}})
    assert spec.kind == "json_schema" and spec.param == "response_format.json_schema.schema"
    assert list(json.loads(spec.source)["properties"]) == ["b", "a"]  # order kept
    spec = response_format_spec({"type": "grammar", "grammar": 'root ::= "a"'})
    assert (spec.kind, spec.source, spec.param) == ("ebnf", 'root ::= "a"',
                                                     "response_format.grammar")


def test_grammar_cache_is_lru():
    built, evicted = [], []
    cache = GrammarCache(capacity=2, on_evict=evicted.append)
    for source in ["a", "b", "a", "c", "b", "a"]:
        spec = GrammarSpec("ebnf", source)
        got = cache.get(spec) or cache.put(spec, built.append(source) or source.upper())
        assert got == source.upper()
    # a, b, (a hit), c evicts b, b evicts a, a again (evicts c)
    assert built == ["a", "b", "c", "b", "a"] and (cache.hits, cache.misses) == (1, 5)
    assert evicted == ["B", "A", "C"]


def test_logit_adjustments_fold_every_rule_once():
    p = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.25,
                       logit_bias=((7, -3.0), (9, 1.0)))
    got = logit_adjustments(p, frozenset([1, 7]), {7: 2, 8: 1})
    assert got == [(1, 1.2, 0.0), (7, 1.2, -1.25 - 3.0), (8, 1.2, -0.75), (9, 1.0, 1.0)]
    assert logit_adjustments(SamplingParams(), frozenset([1]), {2: 1}) == []
    with pytest.raises(ValueError):
        SamplingParams(top_logprobs=21)


# ---------------------------------------------------------------------------------------------
# The engine driving a grammar backend (a fake one: engine_fakes.LiteralGrammar), sync and async


def _apis(asynchronous: bool):
    from engine_fakes import IM_END, AsyncFakeRunner, ByteTokenizer, LiteralGrammar, make_info

    from wick.engine import AsyncEngineAPI, EngineAPI
    from wick.engine.core import EngineCore

    info = make_info()
    grammar = LiteralGrammar(info.vocab_size, IM_END, asynchronous)
    core = EngineCore(AsyncFakeRunner(64, info.page_size), ByteTokenizer(), info, num_pages=64,
                      grammar=grammar)
    return EngineAPI(core), AsyncEngineAPI(core), grammar


@pytest.mark.parametrize("asynchronous", [False, True])
def test_grammar_forces_the_output_and_ends_with_stop(asynchronous):
    import asyncio

    sync_api, async_api, grammar = _apis(asynchronous)
    fmt = {"type": "grammar", "grammar": 'root ::= "si, claro"'}

    async def two():
        return await asyncio.gather(*(async_api.chat.completions.create(
            messages=[{"role": "user", "content": f"q{i}"}], response_format=fmt, n=2,
            temperature=1.0, seed=i) for i in range(2)))

    for r in asyncio.run(two()):
        assert [c.message.content for c in r.choices] == ["si, claro"] * 2
        assert {c.finish_reason for c in r.choices} == {"stop"}
        assert r.usage.completion_tokens == 2 * (len("si, claro") + 1)  # + the stop token
    if asynchronous:  # the sync facade cannot await the wasm build's promises
        with pytest.raises(Exception, match="AsyncEngineAPI"):
            sync_api.chat.completions.create(messages=[{"role": "user", "content": "x"}],
                                             response_format=fmt)
    else:
        r = sync_api.completions.create(prompt="x", response_format=fmt, max_tokens=4)
        assert (r.choices[0].text, r.choices[0].finish_reason) == ("si, ", "length")
    with pytest.raises(Exception) as e:
        asyncio.run(async_api.chat.completions.create(
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "grammar", "grammar": "root ::= ("}))
    assert (e.value.param, e.value.code) == ("response_format.grammar", "invalid_grammar")
    assert e.value.message == "Invalid grammar: cannot parse 'root ::= ('"
    assert not async_api.core.has_unfinished()
