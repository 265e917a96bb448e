"""Constrained generation: the grammar interface, its vocabulary, and response formats.

A ``GrammarSpec`` says what the output must be (any JSON, JSON matching a schema, an EBNF
grammar). A ``GrammarBackend`` compiles it for one model's vocabulary into a ``CompiledGrammar``
(cached per spec: many requests share one schema) and gives each sequence a ``GrammarMatcher``
that follows the tokens sampled so far and says which tokens may come next. There are two
backends, both xgrammar at one pinned version (0.1.27): natively its C++ bindings
(``wick.native.grammar``), in the browser worker its wasm build (``wick_web.grammar``). The
allowed tokens travel to the GPU as xgrammar's bitmask, where ``process_logits`` applies them.

Both backends build their tokenizer info from the same ``VocabInfo``, computed here from
tokenizer.json with the standard library only, so the worker and the server see one vocabulary.
Special and added tokens are blanked: xgrammar would otherwise allow ``<|im_end|>`` as text
inside a JSON string. The model's EOS ids are the grammar's stop tokens: once the output is
complete, only they are allowed, and sampling one ends the sequence with "stop".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

from .errors import InvalidRequestError
from .utf8_guard import never_in_utf8

# The JSON layout both backends are given (xgrammar's JS binding defaults indent=2, Python None:
# pass the same everywhere): one line, ", " and ": " between items, as Python's json.dumps.
# No free whitespace: small models given the choice tend to emit runs of blanks and newlines
# until max_tokens.
JSON_INDENT: int | None = None
JSON_ANY_WHITESPACE = False
# A JSON schema becomes xgrammar EBNF (``Grammar.from_json_schema``), is patched by
# ``patch_json_ebnf``, then compiled as a grammar: "json" is any object (OBJECT_SCHEMA, not
# strict: any properties), "json_schema" strict (no properties beyond the schema's).
OBJECT_SCHEMA = '{"type": "object"}'

# xgrammar 0.1.27 spells the characters of a string with a length bound (minLength/maxLength)
# as [^"\\\r\n], which lets raw control characters through (invalid JSON: json.loads and
# pydantic refuse them). Every other string rule already excludes \0-\x1f.
_LOOSE_STRING_CHAR = '[^\\"\\\\\\r\\n]'
_STRICT_STRING_CHAR = '[^\\"\\\\\\0-\\x1f]'


def json_schema_of(spec: GrammarSpec) -> tuple[str, bool]:
    """(schema as JSON text, strict) of a "json" or "json_schema" spec, for both backends'
    ``Grammar.from_json_schema``. Raises ValueError (json's own message, the same in CPython
    and Pyodide) for text that is not JSON, before xgrammar sees it."""
    if spec.kind == "json":
        return OBJECT_SCHEMA, False
    json.loads(spec.source)
    return spec.source, True


def patch_json_ebnf(ebnf: str) -> str:
    """Fix xgrammar's EBNF for a JSON schema (see ``_LOOSE_STRING_CHAR``)."""
    return ebnf.replace(_LOOSE_STRING_CHAR, _STRICT_STRING_CHAR)

VOCAB_RAW, VOCAB_BYTE_FALLBACK, VOCAB_BYTE_LEVEL = 0, 1, 2  # xgrammar's VocabType numbers


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What the output must be: ``kind`` "json" (any JSON object), "json_schema" (``source`` is
    the schema as JSON text), "ebnf" (``source`` is xgrammar EBNF with a ``root`` rule) or
    "tool_calls" (``source`` from ``tools.tools_spec_source``: compiled as a structural tag).
    ``param`` names the request field a compile error is blamed on."""

    kind: str
    source: str = ""
    param: str = "response_format"

    def __post_init__(self) -> None:
        if self.kind not in ("json", "json_schema", "ebnf", "tool_calls"):
            raise ValueError(f"unknown grammar kind {self.kind!r}")


class GrammarMatcher(Protocol):
    """One sequence's position in a compiled grammar. A matcher whose library answers with a
    promise (the wasm build) offers ``async next_token_bitmask_async()`` instead of
    ``next_token_bitmask``; the async facade awaits it before each step. A matcher with
    ``rollback(num_tokens)`` (undo the last accepts) lets its sequence speculate: the masks of
    drafted positions are read by accepting the drafts, then rolling them back."""

    def next_token_bitmask(self) -> bytes:
        """Allowed next tokens: ceil(vocab_size / 32) little-endian int32 words, bit ``i % 32``
        of word ``i // 32`` set when token ``i`` is allowed."""

    def accept(self, token: int) -> bool:
        """Advance by one sampled token; False when the grammar does not allow it."""

    def is_terminated(self) -> bool:
        """The output is complete and a stop token was accepted."""


class CompiledGrammar(Protocol):
    def matcher(self) -> GrammarMatcher: ...


class GrammarBackend(Protocol):
    """Compiles specs: ``compile(spec)``, or (the wasm build) ``async compile_async(spec)``."""

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile (or fetch from the cache); raises ``InvalidRequestError`` with
        ``spec.param`` and code ``invalid_json_schema`` / ``invalid_grammar`` when the spec
        is not valid."""


# natively "[12:11:34] /project/cpp/x.cc:902: ", in wasm "[FATAL] /Users/.../x.cc:902: "
_LOG_PREFIX = re.compile(r"^\[(?:[\d:]+|FATAL)\] \S+:\d+: ")


def compile_error(spec: GrammarSpec, detail: str) -> InvalidRequestError:
    """The one error both backends raise for a spec their compiler refuses (xgrammar's message
    without its log prefix of time and C++ source line, which differ between builds)."""
    detail = _LOG_PREFIX.sub("", detail.strip().splitlines()[0] if detail.strip() else "")
    detail = detail.strip() or "the compiler refused it"
    if spec.kind == "ebnf":
        return InvalidRequestError(f"Invalid grammar: {detail}", param=spec.param,
                                   code="invalid_grammar")
    return InvalidRequestError(f"Invalid JSON schema: {detail}", param=spec.param,
                               code="invalid_json_schema")


def check_opens(compiled: CompiledGrammar, spec: GrammarSpec) -> None:
    """Refuse (400, as ``compile_error``) a grammar no text can start: its first mask allows no
    token, not even a stop (``root ::= root "a"`` compiles, then ended every request at once,
    empty, with finish_reason "stop"). Once per compiled grammar: a grammar that opened is
    marked so (the cache hands the same object to every request that asks for it)."""
    if getattr(compiled, OPENS, False):
        return
    matcher = compiled.matcher()
    try:
        _refuse_unless_open(compiled, spec, matcher, matcher.next_token_bitmask())
    finally:
        _close(matcher)


async def check_opens_async(compiled: CompiledGrammar, spec: GrammarSpec) -> None:
    """``check_opens`` for either kind of matcher (a wasm one answers with a promise)."""
    if getattr(compiled, OPENS, False):
        return
    matcher = compiled.matcher()
    try:
        read = getattr(matcher, "next_token_bitmask_async", None)
        mask = await read() if read is not None else matcher.next_token_bitmask()
        _refuse_unless_open(compiled, spec, matcher, mask)
    finally:
        _close(matcher)


OPENS = "wick_opens"  # (the mark check_opens leaves on a compiled grammar that opened)


def _refuse_unless_open(compiled: CompiledGrammar, spec: GrammarSpec, matcher: GrammarMatcher,
                        mask: bytes) -> None:
    if not any(mask) and not matcher.is_terminated():
        raise compile_error(spec, "no text matches it (a rule that can only refer to itself "
                                  "never ends)")
    try:
        setattr(compiled, OPENS, True)
    except AttributeError:  # (an object without a __dict__: checked again next time)
        pass


def _close(matcher: GrammarMatcher) -> None:
    close = getattr(matcher, "close", None)  # (a wasm matcher holds memory of its own)
    if close is not None:
        close()


class GrammarCache:
    """Compiled grammars by spec, least recently used dropped past ``capacity`` entries or
    ``max_bytes`` of their memory (as ``put`` is told it; the newest entry always stays), and
    handed to ``on_evict``, e.g. to free wasm memory. Both backends put this in front of
    their compiler: compiling a schema costs milliseconds to seconds, matching microseconds."""

    def __init__(self, capacity: int = 64, on_evict=None, max_bytes: int | None = None) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._on_evict = on_evict
        self._items: dict[tuple[str, str], tuple[CompiledGrammar, int]] = {}
        self.bytes = 0  # what the entries' sizes add up to
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, spec: GrammarSpec) -> CompiledGrammar | None:
        hit = self._items.pop((spec.kind, spec.source), None)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items[(spec.kind, spec.source)] = hit  # most recent last
        return hit[0]

    def put(self, spec: GrammarSpec, compiled: CompiledGrammar, size: int = 0
            ) -> CompiledGrammar:
        old = self._items.pop((spec.kind, spec.source), None)
        if old is not None:
            self.bytes -= old[1]
        self._items[(spec.kind, spec.source)] = (compiled, size)
        self.bytes += size
        while len(self._items) > 1 and (len(self._items) > self._capacity or (
                self._max_bytes is not None and self.bytes > self._max_bytes)):
            evicted, evicted_size = self._items.pop(next(iter(self._items)))
            self.bytes -= evicted_size
            if self._on_evict is not None:
                self._on_evict(evicted)
        return compiled


# ---------------------------------------------------------------------------------------------
# The vocabulary as xgrammar needs it, and each token's bytes (for logprobs)


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, inverted: char -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _has(component: object, kind: str) -> bool:
    """Whether a tokenizer.json component (or a Sequence of them) contains ``kind``."""
    if not isinstance(component, dict):
        return False
    if component.get("type") == kind:
        return True
    parts = component.get("decoders") or component.get("pretokenizers") or \
        component.get("normalizers") or []
    return any(_has(p, kind) for p in parts)


@dataclass(frozen=True, slots=True)
class VocabInfo:
    encoded: tuple[str, ...]  # id -> token string as tokenizer.json spells it; "" = blanked
    vocab_type: int  # VOCAB_RAW | VOCAB_BYTE_FALLBACK | VOCAB_BYTE_LEVEL
    add_prefix_space: bool
    special_ids: frozenset[int]  # added tokens: never produced by a grammar

    @classmethod
    def from_tokenizer_json(cls, text: str, vocab_size: int | None = None) -> VocabInfo:
        data = json.loads(text)
        model = data.get("model") or {}
        vocab = model.get("vocab")
        pieces: dict[int, str] = {}
        if isinstance(vocab, dict):
            pieces = {int(i): p for p, i in vocab.items()}
        elif isinstance(vocab, list):
            pieces = {i: e[0] for i, e in enumerate(vocab)}
        added = {int(t["id"]) for t in data.get("added_tokens") or []}
        size = max([*pieces, *added, -1]) + 1
        if vocab_size is not None:
            size = max(size, vocab_size)
        encoded = ["" if i in added else pieces.get(i, "") for i in range(size)]
        decoder = data.get("decoder")
        if _has(decoder, "ByteLevel"):
            vocab_type = VOCAB_BYTE_LEVEL
        elif _has(decoder, "ByteFallback") or model.get("byte_fallback"):
            vocab_type = VOCAB_BYTE_FALLBACK
        else:
            vocab_type = VOCAB_RAW
        # SentencePiece-style tokenizers put "▁" before the first word of every text
        prefix = (_has(data.get("normalizer"), "Prepend")
                  or any(p.get("prepend_scheme", "never") != "never" or p.get("add_prefix_space")
                         for p in _components(data.get("pre_tokenizer"), "Metaspace")))
        return cls(tuple(encoded), vocab_type, bool(prefix), frozenset(added))

    def for_grammar(self) -> list[str]:
        """The vocabulary both grammar backends are given: special tokens blanked (see the
        module docstring), and tokens holding a byte that never occurs in UTF-8 (0xC0, 0xC1,
        0xF5-0xFF): xgrammar 0.1.27 takes lead bytes 0xF5-0xF7 for 4-byte characters, which
        lets undecodable text into a JSON string."""
        out = list(self.encoded)
        for i, piece in enumerate(out):
            if piece and _NEVER_UTF8.intersection(self.token_bytes(i)):
                out[i] = ""
        return out

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (OpenAI's logprobs ``bytes``). Special tokens give
        their text as tokenizer.json spells it only through ``special_text``; here b""."""
        if not 0 <= token < len(self.encoded):
            return b""
        piece = self.encoded[token]
        if self.vocab_type == VOCAB_BYTE_LEVEL:
            table = _BYTE_LEVEL
            return bytes(table.get(ch, 0) for ch in piece) if all(ch in table for ch in piece) \
                else piece.encode()
        if self.vocab_type == VOCAB_BYTE_FALLBACK:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return bytes([int(piece[3:5], 16)])
                except ValueError:
                    pass
            return piece.replace("▁", " ").encode()
        return piece.encode()


def _components(component: object, kind: str) -> list[dict]:
    if not isinstance(component, dict):
        return []
    if component.get("type") == kind:
        return [component]
    out: list[dict] = []
    for p in component.get("pretokenizers") or []:
        out += _components(p, kind)
    return out


_BYTE_LEVEL = _byte_level_decoder()
_NEVER_UTF8 = never_in_utf8()


# ---------------------------------------------------------------------------------------------
# response_format -> GrammarSpec


def response_format_spec(response_format: dict | None) -> GrammarSpec | None:
    """The grammar a validated ``response_format`` asks for (None for plain text)."""
    if not response_format:
        return None
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json")
    if kind == "json_schema":
        schema = response_format["json_schema"].get("schema")
        if schema is None:  # OpenAI: no schema means any JSON object
            return GrammarSpec("json", param="response_format.json_schema")
        return GrammarSpec("json_schema", json.dumps(schema),  # property order matters
                           param="response_format.json_schema.schema")
    if kind == "grammar":
        return GrammarSpec("ebnf", response_format["grammar"], param="response_format.grammar")
    raise ValueError(f"unvalidated response_format type {kind!r}")
