"""Build a ``tokenizer.json`` from a GGUF file's tokenizer metadata, with HF ``tokenizers``.

A GGUF carries no tokenizer.json, only llama.cpp's description of one: ``tokenizer.ggml.model``
(the algorithm), ``.pre`` (how byte-level text is split before BPE), ``.tokens``, ``.merges`` or
``.scores``, ``.token_type`` and the special ids. We rebuild the tokenizer llama.cpp would run:

- ``gpt2``: byte-level BPE. The vocabulary is already spelled in the GPT-2 byte alphabet; the
  split regexes per ``pre`` follow llama.cpp's ``llama-vocab.cpp`` (each regex in its list splits
  the pieces the previous one produced, so a list becomes a ``Sequence``). transformers' own GGUF
  reader ignores ``pre="smollm"`` and so does not isolate digits: "a  5" differs.
- ``llama``: SentencePiece BPE. Merges come from the file or, when absent, from the scores (the
  merged piece with the higher score merges first, which is how llama.cpp's SPM tokenizer picks);
  ``▁`` stands for a space, unknown bytes fall back to the ``<0xXX>`` tokens. Like llama.cpp,
  a space is prefixed to the text and after each special token (transformers' GGUF reader uses
  ``Metaspace`` instead, which adds none before text that already starts with a space).

Tokens of type CONTROL (3) and UNKNOWN (2) become special added tokens and USER_DEFINED (4)
plain added tokens, so all are matched whole in text, as llama.cpp does. No post-processor: the
engine alone decides about BOS (see ``engine/tokenizer.py``); ``add_bos_token`` is reported in
the tokenizer config.

References: llama.cpp ``src/llama-vocab.cpp`` (pre-tokenizer regexes, SPM merge order) and
``gguf-py/gguf/constants.py`` (key names, token types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ..engine.errors import WickError

# llama.cpp token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class _PreTokenizer:
    regex: str  # the split regex (llama.cpp's last one)
    individual_digits: bool  # every digit its own piece first (llama.cpp's leading "\p{N}")
    ignore_merges: bool  # a piece that is already a token is taken whole (llama.cpp LLAMA3)


# tokenizer.ggml.pre -> how llama.cpp splits text before byte-level BPE
_PRE_TOKENIZERS: dict[str, _PreTokenizer] = {}
for _names, _pre in (
    (("default", "gpt2", "gpt-2", "mpt", "olmo", "jais"), _PreTokenizer(_GPT2, False, False)),
    (
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
        _PreTokenizer(_GPT2, True, False),
    ),
    (
        ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"),
        _PreTokenizer(_LLAMA3, False, True),
    ),
    (("qwen2", "deepseek-r1-qwen", "stablelm2"), _PreTokenizer(_QWEN2, False, False)),
):
    for _name in _names:
        _PRE_TOKENIZERS[_name] = _pre


class TokenizerBuildError(WickError):
    """The GGUF describes a tokenizer this module cannot rebuild faithfully."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "unsupported_tokenizer"


@dataclass(frozen=True, slots=True)
class BuiltTokenizer:
    tokenizer_json: str
    tokenizer_config: dict[str, Any]  # tokenizer_config.json keys: chat_template, bos_token, ...
    bos_token_id: int | None
    eos_token_id: int | None


def build_from_gguf(meta: Mapping[str, Any]) -> BuiltTokenizer:
    """Rebuild the tokenizer described by GGUF metadata ``meta`` (key -> python value)."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta, tokens)
        add_bos_default = False
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta, tokens, types)
        add_bos_default = True  # llama.cpp adds BOS for SPM vocabularies unless told otherwise
    else:
        raise TokenizerBuildError(
            f"tokenizer.ggml.model={kind!r} is not supported (supported: 'gpt2', 'llama')"
        )
    _add_special_tokens(tokenizer, tokens, types)

    def token(key: str) -> tuple[int | None, str | None]:
        index = meta.get(f"tokenizer.ggml.{key}")
        return (None, None) if index is None else (int(index), tokens[int(index)])

    bos_id, bos = token("bos_token_id")
    eos_id, eos = token("eos_token_id")
    config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown_token_id")[1],
        "pad_token": token("padding_token_id")[1],
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return BuiltTokenizer(tokenizer.to_str(), config, bos_id, eos_id)


GPT2_END = "<|endoftext|>"  # GPT-2's one special token


def build_from_bpe_files(vocab: dict[str, int], merges: str, config: Mapping[str, Any]) -> str:
    """tokenizer.json text for a GPT-2-style byte-level BPE given as ``vocab.json`` and
    ``merges.txt`` (repos older than tokenizer.json: OPT's), as transformers' GPT-2 converter
    builds it from them: the byte-level split with ``add_prefix_space`` from ``config``
    (tokenizer_config.json), and the config's special tokens (bos/eos/unk/pad, and the added
    ones it lists) matched whole. No post-processor: the engine alone decides about BOS."""
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise TokenizerBuildError("vocab.json is not a token -> id object")
    if any(token.endswith("</w>") for token in vocab):
        raise TokenizerBuildError("vocab.json has end-of-word tokens (</w>, CLIP's kind of BPE): "
                                  "only GPT-2's byte-level BPE is read from vocab.json and "
                                  "merges.txt; a tokenizer.json is needed for this one")
    pairs = []
    for number, line in enumerate(merges.splitlines(), 1):
        if not line.strip() or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerBuildError(f"merges.txt line {number} is not two tokens: {line!r}")
        pairs.append((parts[0], parts[1]))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=bool(config.get("add_prefix_space", False)))
    tokenizer.decoder = decoders.ByteLevel()
    named = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
             "mask_token")
    specials = [config[k] for k in named if isinstance(config.get(k), str)]
    if not any(config.get(k) for k in ("bos_token", "eos_token", "unk_token")) and \
            GPT2_END in vocab:  # (GPT2Tokenizer's defaults for all three)
        specials.append(GPT2_END)
    specials += [t.get("content") if isinstance(t, dict) else t
                 for t in config.get("additional_special_tokens") or []]
    specials = [t for t in specials if isinstance(t, str)]
    plain = []
    for added in (config.get("added_tokens_decoder") or {}).values():
        if isinstance(added, dict) and isinstance(added.get("content"), str):
            (specials if added.get("special", False) else plain).append(added["content"])
    tokenizer.add_special_tokens(list(dict.fromkeys(specials)))
    tokenizer.add_tokens([t for t in dict.fromkeys(plain) if t not in specials])
    return tokenizer.to_str()


def _byte_level_bpe(meta: Mapping[str, Any], tokens: list[str]) -> Tokenizer:
    pre_name = meta.get("tokenizer.ggml.pre", "default")
    pre = _PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise TokenizerBuildError(
            f"tokenizer.ggml.pre={pre_name!r} has no known split rule "
            f"(known: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise TokenizerBuildError("a byte-level BPE GGUF without tokenizer.ggml.merges")
    bpe = models.BPE(
        vocab=_vocab(tokens),
        merges=[tuple(m.split(" ", 1)) for m in merges],
        ignore_merges=pre.ignore_merges,
    )
    tokenizer = Tokenizer(bpe)
    # Digits (not a "\p{N}" Split) is what these models' own tokenizer.json files use; the two
    # differ only on a few code points newer than llama.cpp's Unicode tables.
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre.individual_digits else []
    steps += [
        pre_tokenizers.Split(Regex(pre.regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(meta: Mapping[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    vocab = _vocab(tokens)
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerBuildError("a SentencePiece GGUF with neither merges nor scores")
        pairs = _merges_from_scores(tokens, types, list(scores), vocab)
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    # llama.cpp puts a space before every stretch of text that starts the input or follows a
    # special token, then spells spaces as "▁". A normalizer does exactly that, because added
    # tokens are cut out first and each remaining stretch is normalized on its own. (Metaspace
    # would skip the prefix when the text already starts with a space: " hi" -> "▁hi", not
    # llama.cpp's "▁▁hi".)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    spaces = normalizers.Replace(" ", "\u2581")
    tokenizer.normalizer = (
        normalizers.Sequence([normalizers.Prepend("\u2581"), spaces]) if prefix else spaces
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _merges_from_scores(
    tokens: list[str], types: list[int], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """Every split of a mergeable token into two known pieces, best merged score first."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, kind, score in zip(tokens, types, scores):
        if kind not in (NORMAL, USER_DEFINED) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # a repeated spelling keeps its first id
    return vocab


def _add_special_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (CONTROL, UNKNOWN)
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types)
        if ty == USER_DEFINED
    ]
    if control:
        tokenizer.add_special_tokens(control)
    if user:
        tokenizer.add_tokens(user)
