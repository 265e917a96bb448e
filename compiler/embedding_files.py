"""Which checkpoints are embedding models, and how they pool: sentence-transformers' own files
(``modules.json``, ``1_Pooling/config.json``, ``2_Normalize``, ``sentence_bert_config.json``).
No TVM here (the model sources read it); compiler/models/pooling.py builds the kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .model_config import UnsupportedConfig

POOLING_MODES = ("mean", "max", "cls", "lasttoken")
# 1_Pooling/config.json's switches -> wick's mode names
_ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
             "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "lasttoken"}
_ST_UNSUPPORTED = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


def special_tokens(tokenizer_json: str) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a text (BERT: [CLS] and
    [SEP]; Qwen3-Embedding: an end-of-text token after), read by encoding a probe with and
    without them: the engine adds them itself (its tokenizers never add special tokens)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    plain = tok.encode("hello", add_special_tokens=False).ids
    full = tok.encode("hello", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return [], []


def sentence_transformers_config(path: Path) -> dict[str, Any] | None:
    """``{"pooling", "normalize", "max_seq_length"}`` from a sentence-transformers model
    directory, or None when ``path`` has no ``modules.json`` with a Pooling module (not an
    embedding model). Modules wick does not run (a Dense projection, ...) are refused by name."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        kinds = [(m["type"].rsplit(".", 1)[-1], m.get("path", "")) for m in modules]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UnsupportedConfig(f"{modules_file}: not a sentence-transformers module list "
                                f"({e})") from None
    pooling = next((p for kind, p in kinds if kind == "Pooling"), None)
    if pooling is None:
        return None
    other = [kind for kind, _ in kinds if kind not in ("Transformer", "Pooling", "Normalize")]
    if other:
        raise UnsupportedConfig(f"{modules_file}: module {other[0]} is not supported (wick "
                                "runs Transformer, Pooling and Normalize)")
    config_file = path / pooling / "config.json"
    try:
        switches = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UnsupportedConfig(f"{config_file}: cannot read the pooling config ({e})") from None
    unsupported = [k for k in _ST_UNSUPPORTED if switches.get(k)]
    modes = [mode for key, mode in _ST_MODES.items() if switches.get(key)]
    if unsupported or len(modes) != 1:
        what = unsupported[0] if unsupported else f"{len(modes)} pooling modes at once"
        raise UnsupportedConfig(f"{config_file}: {what} is not supported (wick pools with one "
                                f"of {', '.join(POOLING_MODES)})")
    max_len = None
    st_file = path / "sentence_bert_config.json"
    if st_file.is_file():
        try:
            max_len = json.loads(st_file.read_text(encoding="utf-8")).get("max_seq_length")
        except ValueError:
            max_len = None
    return {"pooling": modes[0], "normalize": any(kind == "Normalize" for kind, _ in kinds),
            "max_seq_length": int(max_len) if isinstance(max_len, int) and max_len > 0 else None}
