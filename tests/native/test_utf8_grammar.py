"""xgrammar 0.1.27 lets an overlong or surrogate UTF-8 form into a JSON string when a
vocabulary spells it a byte at a time; the engine's matchers (EngineCore._matcher, the strict
UTF-8 guard) do not, and their masks still allow every valid character."""

from __future__ import annotations

import json

import pytest

from tests.tiny_models import byte_level_tokenizer
from wick.engine.grammar import GrammarSpec, VocabInfo
from wick.engine.utf8_guard import Utf8Guard, Utf8Table
from wick.native.grammar import XGrammarBackend


@pytest.fixture(scope="module")
def setup():
    tok = byte_level_tokenizer()
    n = tok.get_vocab_size()
    vocab = VocabInfo.from_tokenizer_json(tok.to_str(), n)
    backend = XGrammarBackend(vocab, n, [n - 1])
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    byte_token = {vocab.token_bytes(i)[0]: i for i in range(256)}
    yield compiled, Utf8Table.of(vocab), byte_token
    backend.close()


def allowed_bytes(mask: bytes, byte_token: dict[int, int]) -> set[int]:
    value = int.from_bytes(mask, "little")
    return {b for b, t in byte_token.items() if value >> t & 1}


@pytest.mark.parametrize("lead, bad, good", [
    (0xF0, 0x86, 0x9F),  # overlong 4-byte form / U+1F...
    (0xE0, 0x9F, 0xA0),  # overlong 3-byte form / U+0800...
    (0xED, 0xA0, 0x9F),  # a surrogate / U+D7..
    (0xF4, 0x90, 0x8F),  # past U+10FFFF / U+10F...
])
def test_invalid_utf8_is_masked_inside_a_json_string(setup, lead, bad, good):
    compiled, table, byte_token = setup
    raw, guarded = compiled.matcher(), Utf8Guard(compiled.matcher(), table)
    for b in b'{"s": "' + bytes([lead]):
        assert raw.accept(byte_token[b]) and guarded.accept(byte_token[b])
    loose = allowed_bytes(raw.next_token_bitmask(), byte_token)
    strict = allowed_bytes(guarded.next_token_bitmask(), byte_token)
    assert bad in loose and good in loose  # xgrammar alone: both
    assert bad not in strict and good in strict
    assert strict == {b for b in loose if completes(bytes([lead, b]))}


def completes(prefix: bytes) -> bool:
    """Whether CPython decodes ``prefix`` completed by continuation bytes (only a character's
    second byte has a narrower range than 80-BF)."""
    size = 4 if prefix[0] >= 0xF0 else 3
    try:
        (prefix + b"\x80" * (size - len(prefix))).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
