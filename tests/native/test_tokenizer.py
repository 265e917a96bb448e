"""``max_token_chars`` (the bound that lets a too-long prompt be refused before tokenizing)
against HF ``tokenizers``' own vocabulary, for BPE (byte-level) and Unigram tokenizers: no
token decodes to more characters than it says."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers, decoders

from wick.engine.tokenizer import max_token_chars
from wick.native.tokenizer import HFTokenizer


def check(tok: Tokenizer) -> int:
    bound = max_token_chars(json.loads(tok.to_str()))
    vocab = tok.get_vocab(with_added_tokens=True)
    assert all(len(tok.decode([i], skip_special_tokens=False)) <= bound for i in vocab.values())
    assert HFTokenizer(tok.to_str()).max_token_chars == bound
    return bound


def test_byte_level_bpe():
    from tests.tiny_models import byte_level_tokenizer

    tok = byte_level_tokenizer()
    tok.add_tokens(["\n" + " " * 80])  # a long whitespace token, like SmolLM2's 81 characters
    assert check(tok) == 81


def test_unigram():
    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁hello", -1.0), ("▁wor", -2.0),
                                    ("ld", -2.0), ("▁", -3.0)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    assert check(tok) == 6


def test_a_long_text_is_tokenized_without_holding_the_gil():
    """3.9 MB (the outside probe's tool-call arguments): the ids of tokenizers' own encode,
    while another thread keeps running (encode holds the GIL for seconds; wick's does not)."""
    import threading
    import time

    from tests.tiny_models import byte_level_tokenizer

    tok = byte_level_tokenizer([("t", "h"), ("th", "e"), ("Ġ", "q")])
    wick = HFTokenizer(tok.to_str())
    text = ('the quick {"brown": [1, 2]} fox ' * 130_000)[:3_900_000]
    gaps: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        ids = wick.encode(text)
    finally:
        stop.set()
        ticker.join()
    assert ids == tok.encode(text, add_special_tokens=False).ids
    # (tokenizers' encode holds the GIL 7.6 s here; 0.50 s was seen beside the other test
    # worker on two cores)
    assert max(gaps) < 2.0, f"another thread waited {max(gaps):.2f} s"
