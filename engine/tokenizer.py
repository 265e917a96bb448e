"""The tokenizer interface. Natively HF ``tokenizers``; in the browser its wasm build.

Implementations never add special tokens on their own: the engine decides about BOS (the
browser tokenizer cannot be told to add them, so the native one must not either).
"""

from __future__ import annotations

from typing import Protocol, Sequence


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any added special tokens."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
