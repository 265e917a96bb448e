"""The native tokenizer: HF ``tokenizers`` over a tokenizer.json (the browser runs its wasm build).

Never adds special tokens (the engine decides about BOS); special tokens written in the text,
such as ``<|im_start|>``, still encode to their single ids because they are added tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from ..engine.tokenizer import max_token_chars

# tokenizers' encode holds the GIL (3.5 s for 3.9 MB, every stream of the server stalled);
# encode_batch releases it. Short texts take the quicker call.
LONG_TEXT_CHARS = 16_384


class HFTokenizer:
    """``engine.tokenizer.Tokenizer`` over a tokenizer.json string or file."""

    def __init__(self, tokenizer_json: str | Path):
        if isinstance(tokenizer_json, Path) or not tokenizer_json.lstrip().startswith("{"):
            tokenizer_json = Path(tokenizer_json).read_text(encoding="utf-8")
        self._tok = Tokenizer.from_str(tokenizer_json)
        self.max_token_chars = max_token_chars(json.loads(tokenizer_json))
        # vocab_size counts added tokens too: ids run 0..vocab_size-1 with possible gaps
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.special_token_ids: frozenset[int] = frozenset(
            index for index, added in self._tok.get_added_tokens_decoder().items() if added.special
        )

    def encode(self, text: str) -> list[int]:
        if len(text) > LONG_TEXT_CHARS:  # encode_batch lets other threads run meanwhile
            return self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        return self._tok.id_to_token(index)
