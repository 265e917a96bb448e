"""The tokenizer interface. Natively HF ``tokenizers``; in the browser its wasm build.

Implementations never add special tokens on their own: the engine decides about BOS (the
browser tokenizer cannot be told to add them, so the native one must not either).
"""

from __future__ import annotations

from typing import Protocol, Sequence


class Tokenizer(Protocol):
    vocab_size: int
    # The longest text one token stands for (an upper bound), or None when unknown: a prompt of
    # more than context_window x this many characters cannot fit the window.
    max_token_chars: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any added special tokens."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


def max_token_chars(tokenizer: dict) -> int | None:
    """An upper bound on the characters one token decodes to, from a parsed tokenizer.json: the
    longest vocabulary entry or added token (byte-level and SentencePiece pieces spell a
    character with at least one symbol, so their length bounds the text); None if the file
    holds no vocabulary this understands."""
    model = tokenizer.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: piece -> id
        pieces = list(vocab)
    elif isinstance(vocab, list):  # Unigram: [piece, score] pairs
        pieces = [entry[0] for entry in vocab if entry and isinstance(entry[0], str)]
    else:
        return None
    pieces += [t.get("content", "") for t in tokenizer.get("added_tokens") or []]
    return max((len(p) for p in pieces), default=0) or None
