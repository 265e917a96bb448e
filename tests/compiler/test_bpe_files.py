"""A repo without tokenizer.json (OPT's, older GPT-2-style ones) has vocab.json and merges.txt:
wick builds the tokenizer transformers builds from them, and its ids equal transformers' own
GPT-2 tokenizer's on the same files (its slow, pure-Python one: an independent reference)."""

from __future__ import annotations

import json

import pytest

from tests.tiny_models import byte_level_tokenizer
from wick.compiler import hf_source
from wick.compiler.tokenizer_build import TokenizerBuildError, build_from_bpe_files

MERGES = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n"), ("\u0120", "a")]
TEXTS = ["the cat", " the  in the", "hello, world!\n\nnew line", "caf\u00e9 \u65e5\u672c 123",
         "</s>the<pad> end", "  leading spaces", ""]


@pytest.fixture
def bpe_dir(tmp_path):
    """vocab.json + merges.txt (as GPT-2's tokenizer saves them) and OPT-like special tokens."""
    vocab = json.loads(byte_level_tokenizer(MERGES).to_str())["model"]["vocab"]
    for special in ("<s>", "</s>", "<pad>", "<unk>"):
        vocab[special] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"add_prefix_space": False, "bos_token": {"content": "</s>"}}))
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_ids_equal_transformers_gpt2_tokenizer(bpe_dir):
    from tokenizers import Tokenizer
    from transformers import GPT2Tokenizer

    reference = GPT2Tokenizer(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"),
                              bos_token="</s>", eos_token="</s>", unk_token="</s>",
                              pad_token="<pad>")
    text, config = hf_source.load_tokenizer(bpe_dir)
    ours = Tokenizer.from_str(text)
    assert config["bos_token"] == "</s>" and config["pad_token"] == "<pad>"
    for t in TEXTS:
        want = reference.encode(t, add_special_tokens=False)
        assert ours.encode(t, add_special_tokens=False).ids == want, t
        assert ours.decode(want, skip_special_tokens=False) == reference.decode(want)
    assert ours.token_to_id("</s>") == reference.convert_tokens_to_ids("</s>")


def test_the_files_are_what_a_directory_needs_and_what_its_hash_covers(bpe_dir):
    names = [p.name for p in hf_source.tokenizer_files(bpe_dir)]
    assert names == ["vocab.json", "merges.txt"]
    (bpe_dir / "merges.txt").unlink()
    with pytest.raises(hf_source.HFDirError, match="tokenizer.json is missing"):
        hf_source.tokenizer_files(bpe_dir)


def test_damaged_files_say_which():
    with pytest.raises(TokenizerBuildError, match="line 2"):
        build_from_bpe_files({"a": 0, "b": 1}, "#version: 0.2\na b c\n", {})
    with pytest.raises(TokenizerBuildError, match="vocab.json"):
        build_from_bpe_files(["a"], "", {})


def test_gpt2_end_of_text_is_special_where_no_token_is_named(tmp_path):
    """GPT2Tokenizer's default bos/eos/unk: a repo naming none still matches it whole."""
    from tokenizers import Tokenizer
    from transformers import GPT2Tokenizer

    vocab = json.loads(byte_level_tokenizer(MERGES).to_str())["model"]["vocab"]
    vocab["<|endoftext|>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("".join(f"{a} {b}\n" for a, b in MERGES))
    ours = Tokenizer.from_str(hf_source.load_tokenizer(tmp_path)[0])
    reference = GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    text = "the<|endoftext|>in"
    assert ours.encode(text).ids == reference.encode(text)
    assert vocab["<|endoftext|>"] in ours.encode(text).ids  # (whole, not its bytes)


def test_clip_style_files_are_refused_in_words():
    with pytest.raises(TokenizerBuildError, match="</w>"):
        build_from_bpe_files({"a</w>": 0, "a": 1}, "", {})
