"""``wick.engine.tokenizer.Tokenizer`` over @mlc-ai/web-tokenizers (HF tokenizers in wasm).

The wasm tokenizer never adds special tokens on encode (what the engine wants) and always keeps
them on decode: ``skip_special_tokens`` is done here, by dropping the ids that tokenizer.json's
``added_tokens`` mark ``special`` -- the same set HF ``tokenizers`` skips natively.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from wick.engine.tokenizer import max_token_chars


class WebTokenizer:
    def __init__(self, js_tokenizer: Any, tokenizer_json: str) -> None:
        """``js_tokenizer``: an object with ``encodeCsv(text) -> "1,2,3"``, ``decodeCsv("1,2,3") ->
        string`` and ``vocabSize`` (web/src/worker.ts wraps the wasm tokenizer so)."""
        self._t = js_tokenizer
        data = json.loads(tokenizer_json)
        added = data.get("added_tokens") or []
        self.special_token_ids = frozenset(t["id"] for t in added if t.get("special"))
        self.max_token_chars = max_token_chars(data)
        self.vocab_size: int = int(js_tokenizer.vocabSize)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._t.encodeCsv(text).split(",") if i] if text else []

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special_token_ids]
        if not ids:
            return ""
        return str(self._t.decodeCsv(",".join(map(str, ids))))
