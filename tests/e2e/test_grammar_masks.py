"""The engine's grammar matcher (``wick.native.grammar``: xgrammar's bindings over the engine's
own ``VocabInfo``) against xgrammar used directly through its public API over a transformers
tokenizer: the same bitmask at every step of sampled paths, for a corpus of JSON schemas and
the SmolLM2 tokenizer. The vocabulary detection is checked against xgrammar's own."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from wick.engine.grammar import (
    JSON_ANY_WHITESPACE,
    VOCAB_BYTE_FALLBACK,
    GrammarSpec,
    VocabInfo,
    patch_json_ebnf,
)
from wick.native.grammar import XGrammarBackend, xgrammar_bindings

xgr = pytest.importorskip("xgrammar")  # the public API needs torch: a test-time reference

# (schema, a valid instance): nested objects, arrays, enums, numbers, patterns, optional fields,
# $defs, formats, anyOf, const, additionalProperties, prefixItems
SCHEMAS: list[tuple[dict, object]] = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]}, {"name": "Ada Lovelace", "age": 36}),
    ({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
     {"ok": False}),
    ({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
      "required": ["color"]}, {"color": "green"}),
    ({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
      "required": ["x", "y"]}, {"x": -1.25, "y": 3e5}),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}, [3, 14, 15]),
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["tags"]}, {"tags": ["a", "bc", "déjà vu"]}),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}},
        "required": ["b"]}}, "required": ["a"]}, {"a": {"b": {"c": 7}}}),
    ({"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
      "required": ["zip"]}, {"zip": "75001"}),
    ({"type": "object", "properties": {"name": {"type": "string"}, "nick": {"type": "string"}},
      "required": ["name"]}, {"name": "Bob"}),  # an optional field left out
    ({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                           "y": {"type": "integer"}},
                          "required": ["x", "y"]}},
      "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                       "to": {"$ref": "#/$defs/point"}},
      "required": ["from", "to"]}, {"from": {"x": 0, "y": 1}, "to": {"x": 2, "y": -3}}),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
      "required": ["n"]}, {"n": 42}),
    ({"type": "object", "properties": {"kind": {"const": "city"}, "name": {"type": "string"}},
      "required": ["kind", "name"]}, {"kind": "city", "name": "Paris"}),
    ({"anyOf": [{"type": "object", "properties": {"cat": {"type": "string"}},
                 "required": ["cat"]},
                {"type": "object", "properties": {"dog": {"type": "integer"}},
                 "required": ["dog"]}]}, {"dog": 2}),
    ({"type": "object", "properties": {"v": {"type": ["string", "null"]}}, "required": ["v"]},
     {"v": None}),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 2,
                                             "maxLength": 5}},
      "required": ["s"]}, {"s": "abc"}),
    ({"type": "object", "properties": {"date": {"type": "string", "format": "date"}},
      "required": ["date"]}, {"date": "2026-11-23"}),
    ({"type": "object", "properties": {"email": {"type": "string", "format": "email"}},
      "required": ["email"]}, {"email": "ada@example.com"}),
    ({"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                                 "required": ["id"]}, "maxItems": 3}, [{"id": 1}, {"id": 2}]),
    ({"type": "object", "properties": {"m": {"type": "object",
                                             "additionalProperties": {"type": "integer"}}},
      "required": ["m"]}, {"m": {"k": 1, "j": 2}}),
    ({"type": "object", "properties": {"t": {"type": "array", "prefixItems": [
        {"type": "string"}, {"type": "integer"}], "items": False}}, "required": ["t"]},
     {"t": ["x", 1]}),
    ({"type": "string", "enum": ["yes", "no"]}, "no"),
    ({"type": "object", "properties": {"price": {"type": "number", "minimum": 0},
                                       "currency": {"enum": ["EUR", "USD"]}},
      "required": ["price", "currency"]}, {"price": 9.99, "currency": "EUR"}),
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    from wick.compiler.gguf_source import GGUFModel

    built = GGUFModel(smollm2_path).tokenizer()
    return built.tokenizer_json, built.eos_token_id


@pytest.fixture(scope="module")
def both(smollm2_tokenizer):
    """(wick's backend, xgrammar's public compiler, vocab size, stop ids)."""
    from transformers import PreTrainedTokenizerFast

    text, eos = smollm2_tokenizer
    hf = PreTrainedTokenizerFast(tokenizer_object=__import__("tokenizers").Tokenizer.from_str(text))
    vocab_size = len(hf.get_vocab())
    vocab = VocabInfo.from_tokenizer_json(text, vocab_size)
    wick = XGrammarBackend(vocab, vocab_size, [eos])
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[eos])
    return wick, xgr.GrammarCompiler(info), vocab_size, eos


def test_vocab_detection_agrees_with_xgrammar(smollm2_tokenizer):
    text, _ = smollm2_tokenizer
    meta = json.loads(xgrammar_bindings().TokenizerInfo._detect_metadata_from_hf(text))
    vocab = VocabInfo.from_tokenizer_json(text)
    assert (vocab.vocab_type, vocab.add_prefix_space) == (meta["vocab_type"],
                                                          meta["add_prefix_space"])
    # a SentencePiece-style tokenizer (byte fallback, "▁" prepended)
    from tokenizers import Tokenizer, decoders, models, normalizers

    sp = Tokenizer(models.BPE({"<unk>": 0, "<0x41>": 1, "▁a": 2, "b": 3}, [], unk_token="<unk>",
                              byte_fallback=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    meta = json.loads(xgrammar_bindings().TokenizerInfo._detect_metadata_from_hf(sp.to_str()))
    vocab = VocabInfo.from_tokenizer_json(sp.to_str())
    assert (vocab.vocab_type, vocab.add_prefix_space) == (meta["vocab_type"],
                                                          meta["add_prefix_space"])
    assert vocab.vocab_type == VOCAB_BYTE_FALLBACK
    assert [vocab.token_bytes(i) for i in range(4)] == [b"<unk>", b"A", b" a", b"b"]


def _allowed(mask_words: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(mask_words.view(np.uint8), bitorder="little")[:vocab_size]
    return np.nonzero(bits)[0]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_masks_equal_xgrammar_along_paths(both, smollm2_tokenizer, index):
    """Two paths per schema, the masks compared before every token: a valid instance as the
    tokenizer splits it, to the end (then both matchers are terminated), and 24 tokens drawn
    at random from the allowed set."""
    from tokenizers import Tokenizer

    wick, compiler, V, eos = both
    schema, example = SCHEMAS[index]
    jsonschema.validate(example, schema)
    source = json.dumps(schema)  # keys in order: properties are generated in schema order
    # xgrammar's own schema conversion, with wick's one patch (test below)
    ebnf = str(xgr.Grammar.from_json_schema(source, any_whitespace=JSON_ANY_WHITESPACE))
    compiled_ref = compiler.compile_grammar(patch_json_ebnf(ebnf))
    ref_mask = xgr.allocate_token_bitmask(1, V)
    tok = Tokenizer.from_str(smollm2_tokenizer[0])
    valid = tok.encode(json.dumps(example, ensure_ascii=False), add_special_tokens=False).ids
    rng = np.random.default_rng(index)
    # the intended differences: xgrammar over a transformers tokenizer allows the special
    # tokens (<|im_start|>...) inside JSON strings, and tokens of bytes that never occur in
    # UTF-8 (0xF5..); wick blanks both (VocabInfo.for_grammar; only EOS may end)
    specials = np.zeros(V, bool)
    specials[[i for i, p in enumerate(wick.vocab.for_grammar()[:V]) if p == "" and i != eos]] = True
    assert specials.sum() >= len(wick.vocab.special_ids) - 1
    keep = ~np.packbits(np.pad(specials, (0, -V % 32)).reshape(-1, 8), axis=1,
                        bitorder="little").reshape(-1).view(np.int32)
    specials_offered = False  # did xgrammar-over-transformers ever offer a special token?
    for path in ("valid", "sampled"):
        ours = wick.compile(GrammarSpec("json_schema", source)).matcher()
        ref = xgr.GrammarMatcher(compiled_ref)
        tokens = [*valid, eos] if path == "valid" else []
        for step in range(len(tokens) if path == "valid" else 24):
            mine = np.frombuffer(ours.next_token_bitmask(), np.int32)
            ref.fill_next_token_bitmask(ref_mask)
            np.testing.assert_array_equal(mine, ref_mask[0].numpy() & keep,
                                          err_msg=f"{path} path, step {step}")
            specials_offered |= bool((ref_mask[0].numpy() & ~keep).any())
            allowed = _allowed(mine, V)
            if path == "sampled":
                if eos in allowed or ref.is_terminated():
                    break
                tokens.append(int(rng.choice(allowed)))
            assert tokens[step] in allowed, (path, step, tok.decode(tokens[:step + 1]))
            assert ours.accept(tokens[step]) and ref.accept_token(tokens[step])
        if path == "valid":
            assert ours.is_terminated() and ref.is_terminated()
        else:
            assert len(tokens) >= 2
    if index == 0:  # inside the "name" string: the difference above is real, and blanked
        assert specials_offered


def test_patched_json_grammar_refuses_raw_control_characters():
    """xgrammar 0.1.27's rule for length-bounded strings lets raw control characters into a
    string (invalid JSON); wick's patch closes that and changes nothing else."""
    schema = json.dumps({"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 4}, "t": {"type": "string"}}, "required": ["s", "t"]})
    raw = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    patched = patch_json_ebnf(raw)
    assert patched != raw and patch_json_ebnf(patched) == patched
    info = xgr.TokenizerInfo([chr(c) for c in range(128)])
    compiler = xgr.GrammarCompiler(info)

    def accepts(ebnf: str, text: str) -> bool:
        return xgr.GrammarMatcher(compiler.compile_grammar(ebnf)).accept_string(text)

    assert accepts(raw, '{"s": "a\x17')  # the bug
    assert not accepts(patched, '{"s": "a\x17')
    assert not accepts(patched, '{"s": "ab", "t": "\x01')  # unbounded strings: already strict
    assert accepts(patched, '{"s": "abcd", "t": "x"}')
    assert not accepts(patched, '{"s": "abcde"')
