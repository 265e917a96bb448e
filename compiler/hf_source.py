"""A local Hugging Face model directory -> config, weights, tokenizer.

Expected files: ``config.json``, one or more ``*.safetensors`` (or, in repos that have none,
``pytorch_model*.bin``: torch_pickle reads them without torch and without running them),
``tokenizer.json`` (or, in older
repos such as OPT's, a GPT-2-style tokenizer's ``vocab.json`` and ``merges.txt``, with
``special_tokens_map.json``: tokenizer_build.build_from_bpe_files); optional
``tokenizer_config.json``, ``chat_template.jinja`` (transformers 5 writes the template there) and
``generation_config.json`` (its ``eos_token_id`` list wins over config.json's single id, as in
HF generation).

Weights keep their dtype (float32, float16) except bfloat16, which numpy lacks: those become
float32, exactly (bf16 is the top half of an f32). A safetensors tensor is read only when the
compiler writes it (``lazy_weights.LazyArray``: the header gives its shape and dtype).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from safetensors import safe_open

from ..engine.errors import WickError
from ..engine.sampling_defaults import read_values
from . import torch_pickle
from .lazy_weights import LazyArray
from .model_config import check_config

Progress = Callable[[str, int, int], None]  # (stage, done, total)

REQUIRED_FILES = ("config.json",)
TOKENIZER_JSON = "tokenizer.json"
BPE_FILES = ("vocab.json", "merges.txt")  # (a tokenizer.json's absence: what stands for it)
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
PROCESSOR_TEMPLATE = "chat_template.json"  # {"chat_template": ...}, beside a processor


class HFDirError(WickError):
    """The directory is not a usable HF model; the message names the file at fault."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "invalid_model_dir"


def is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


TORCH_WEIGHTS = "pytorch_model*.bin"  # (torch.save files; read only where no safetensors is)


# each kind of weight file, and the index a sharded checkpoint lists its shards in
WEIGHT_KINDS = (("*.safetensors", "model.safetensors.index.json"),
                (TORCH_WEIGHTS, "pytorch_model.bin.index.json"))


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's weight files: safetensors, else torch's; where an index lists the
    shards, those only (as transformers reads them: a variant such as model.fp16.safetensors
    or a combined file left beside the shards is not the checkpoint)."""
    for pattern, index_name in WEIGHT_KINDS:
        files = sorted(path.glob(pattern))
        if not files:
            continue
        index = path / index_name
        if not index.is_file():
            return files
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HFDirError(f"{index}: no weight_map naming the checkpoint's shards")
        named = [path / name for name in sorted(set(map(str, weight_map.values())))]
        missing = [p.name for p in named if not p.is_file()]
        if missing:
            raise HFDirError(f"{path}: shard {missing[0]} named in {index_name} is missing")
        return named
    raise HFDirError(f"{path}: no weight file found (*.safetensors, or "
                     f"{TORCH_WEIGHTS} in older repos)")


def tracked_files(path: Path) -> list[Path]:
    """Everything ``load`` reads: what the content hash covers."""
    check_files(path)
    tokenizer = tokenizer_files(path)
    optional = ("tokenizer_config.json", "chat_template.jinja", PROCESSOR_TEMPLATE,
                "generation_config.json",
                "modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
                *(index for _, index in WEIGHT_KINDS))
    if tokenizer[0].name != TOKENIZER_JSON:  # (read only beside vocab.json and merges.txt)
        optional += (SPECIAL_TOKENS_MAP,)
    return sorted(
        [path / n for n in REQUIRED_FILES] + tokenizer
        + [path / n for n in optional if (path / n).is_file()]
        + weight_files(path)
    )


def check_files(path: Path) -> None:
    for name in REQUIRED_FILES:
        if not (path / name).is_file():
            raise HFDirError(f"{path}: required file {name} is missing")
    tokenizer_files(path)
    weight_files(path)


def tokenizer_files(path: Path) -> list[Path]:
    """tokenizer.json, or else a GPT-2-style tokenizer's vocab.json and merges.txt."""
    if (path / TOKENIZER_JSON).is_file():
        return [path / TOKENIZER_JSON]
    if all((path / name).is_file() for name in BPE_FILES):
        return [path / name for name in BPE_FILES]
    raise HFDirError(f"{path}: required file {TOKENIZER_JSON} is missing (nor are there "
                     f"{' and '.join(BPE_FILES)}, a GPT-2-style tokenizer's files)")


# GPT-2-style config keys (GPT-2, GPT-BigCode) -> the names transformers' attribute_map reads
# them as
CONFIG_ALIASES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
                  "n_head": "num_attention_heads", "n_positions": "max_position_embeddings",
                  "n_inner": "intermediate_size"}


# other families' names for a usual key (OPT's and Falcon's MLP widths; GPT-NeoX's older RoPE
# keys; EXAONE 3's layer count and norm epsilon, as transformers' ExaoneConfig attribute_map
# reads them; Falcon's older width)
OTHER_ALIASES = {"ffn_dim": "intermediate_size", "ffn_hidden_size": "intermediate_size",
                 "rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"}
FAMILY_ALIASES = {"exaone": {"num_layers": "num_hidden_layers",
                             "layer_norm_epsilon": "rms_norm_eps"},
                  "falcon": {"n_embed": "hidden_size"}}
# families whose config may leave the MLP's width out: its multiple of the width (transformers'
# FalconConfig: ffn_hidden_size 4 x hidden_size)
MLP_WIDTH_FACTORS = {"falcon": 4}


def with_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with GPT-2-style keys also under their usual names. Where a config has both, the
    GPT-2-style key is the one its model reads (transformers' attribute_map makes the usual
    name an alias of it; a stray ``intermediate_size`` beside ``n_inner`` is ignored there).
    ``OTHER_ALIASES`` fill a usual key a config does not have."""
    out = dict(raw)
    for old, new in {**OTHER_ALIASES, **FAMILY_ALIASES.get(raw.get("model_type"), {})}.items():
        if out.get(old) is not None and out.get(new) is None:
            out[new] = out[old]
    factor = MLP_WIDTH_FACTORS.get(raw.get("model_type"))
    if factor and out.get("intermediate_size") is None and out.get("hidden_size") is not None:
        out["intermediate_size"] = factor * int(out["hidden_size"])
    if out.get("n_embd") is None:
        return out
    for old, new in CONFIG_ALIASES.items():
        if out.get(old) is not None:
            out[new] = out[old]
    if out.get("n_inner") is None:
        out["intermediate_size"] = 4 * int(out["n_embd"])  # (n_inner null: four times the width)
    return out


# image-and-text checkpoints whose text model wick runs (the vision tower is left unread):
# model_type -> the text model's family, where its text_config names none
TEXT_OF_MULTIMODAL = {"gemma3": "gemma3_text", "mistral3": "mistral", "qwen2_vl": "qwen2",
                      "qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3"}
# the ones whose text_config's own model_type is no family's (qwen2_5_vl_text, ...)
TEXT_TYPE_OF_MULTIMODAL = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
# their text configs as transformers saves them hold only what differs from the text config
# class's defaults (Gemma 3 4B's names five keys): those defaults, as transformers'
# Gemma3TextConfig, MistralConfig, Qwen2VLTextConfig, Qwen2_5_VLTextConfig and
# Qwen3VLTextConfig have them (tests/compiler/test_multimodal_text.py compares them with
# transformers')
TEXT_CONFIG_DEFAULTS = {
    "gemma3": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
               "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
               "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
               "sliding_window": 4096, "sliding_window_pattern": 6, "attention_bias": False},
    "mistral3": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                 "rope_theta": 10000.0, "sliding_window": 4096},
    "qwen2_vl": {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568,
                 "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                 "rope_theta": 1e6, "use_sliding_window": False},
    "qwen3_vl": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                 "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 128000,
                 "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "attention_bias": False},
}
TEXT_CONFIG_DEFAULTS["qwen2_5_vl"] = TEXT_CONFIG_DEFAULTS["qwen2_vl"]  # (the same class's)
# their weights' names -> the text model's; any other tensor is the vision part's
MULTIMODAL_TEXT_PREFIXES = {"language_model.model.": "model.",  # (as transformers saves them)
                            "language_model.lm_head.": "lm_head.",
                            "model.language_model.": "model.",  # (transformers 5's own)
                            "lm_head.": "lm_head."}
# the vision part's tensors in checkpoints that keep the text model's own names (Qwen2-VL's and
# Qwen2.5-VL's as Qwen published them: model.layers... beside visual.blocks...)
VISION_PREFIXES = ("visual.",)


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """An image-and-text checkpoint's config as its text model's (``text_config`` over its
    class's defaults, or for a Qwen-VL config published flat, its top level's text keys; the
    top level's token ids, as transformers' generation config takes them, and its tie where
    the text part names none; ``multimodal`` set to the wrapper's type); any other config as
    it is. Qwen-VL's multimodal RoPE is plain RoPE on text (the three position streams of a
    text token are equal), and is read so, as transformers reads ``mrope`` as "default"."""
    kind = raw.get("model_type")
    nested = isinstance(raw.get("text_config"), dict)
    if kind not in TEXT_OF_MULTIMODAL or not (nested or kind in TEXT_TYPE_OF_MULTIMODAL):
        return raw
    own = raw["text_config"] if nested else {
        key: value for key, value in raw.items() if key not in ("vision_config", "text_config")}
    defaults = dict(TEXT_CONFIG_DEFAULTS[kind])
    if "rope_theta" in (own.get("rope_parameters") or {}):
        del defaults["rope_theta"]  # (named where transformers 5 saves it)
    text = {**defaults, **own}
    if kind in TEXT_TYPE_OF_MULTIMODAL or "model_type" not in text:
        text["model_type"] = TEXT_OF_MULTIMODAL[kind]
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(text.get(key), dict):
            text[key] = without_mrope(text[key])
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if raw.get(key) is not None:
            text[key] = raw[key]
    if kind in TEXT_TYPE_OF_MULTIMODAL and nested and (
            raw.get("tie_word_embeddings") or text.get("tie_word_embeddings")):
        text["tie_word_embeddings"] = True  # (Qwen-VL's config ties where either level does)
    if text.get("tie_word_embeddings") is None and raw.get("tie_word_embeddings") is not None:
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    text["multimodal"] = kind
    return text


def without_mrope(rope: dict[str, Any]) -> dict[str, Any]:
    """A Qwen-VL RoPE dict as text sees it: "mrope" (its older name) as "default", the
    sections of the three position streams dropped."""
    out = {key: value for key, value in rope.items()
           if key not in ("mrope_section", "mrope_interleaved")}
    for key in ("type", "rope_type"):
        if out.get(key) == "mrope":
            out[key] = "default"
    return out


def raw_config(hf: dict[str, Any]) -> dict[str, Any]:
    """A config.json's dict as the families read it: an image-and-text one's text model's,
    other names for the usual keys aliased (``with_aliases``)."""
    raw = with_aliases(text_config(hf))
    if raw.get("use_sliding_window") is False and raw.get("sliding_window") == 0:
        raw = {**raw, "sliding_window": None}  # (unused: transformers 5 writes Qwen2-MoE's so)
    return raw


def text_weights(weights: dict[str, np.ndarray], dtypes: dict[str, str]) -> None:
    """An image-and-text checkpoint's text model's tensors under its own names, in place; the
    vision tower's and projector's are dropped. (Weights already under the text model's names,
    none of them prefixed, are kept as they are, beside a vision part under ``visual.``.)"""
    prefixed = [p for p in MULTIMODAL_TEXT_PREFIXES if p != "lm_head."]
    if not any(name.startswith(tuple(prefixed)) for name in weights):
        for name in [name for name in weights if name.startswith(VISION_PREFIXES)]:
            del weights[name], dtypes[name]
        return
    for name in list(weights):
        array, dtype = weights.pop(name), dtypes.pop(name)
        for prefix, text_prefix in MULTIMODAL_TEXT_PREFIXES.items():
            if name.startswith(prefix):
                renamed = text_prefix + name[len(prefix):]
                weights[renamed], dtypes[renamed] = array, dtype
                break


def load_config(path: Path) -> dict[str, Any]:
    """config.json with the keys wick relies on filled in and normalized (others kept)."""
    raw = raw_config(_read_json(path / "config.json"))
    check_config(raw, str(path / "config.json"))
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        config = dict(raw)
        config.update(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            # (head_dim, rms_norm_eps and rope_theta absent: None, the family's default,
            # DecoderConfig.from_hf's where it has none of its own)
            head_dim=None if raw.get("head_dim") is None else int(raw["head_dim"]),
            rms_norm_eps=None if raw.get("rms_norm_eps") is None else float(raw["rms_norm_eps"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            # (absent: None, the family's default; load_weights ties a file without a head)
            tie_word_embeddings=(None if raw.get("tie_word_embeddings") is None
                                 else bool(raw["tie_word_embeddings"])),
            model_type=raw["model_type"],
        )
    except KeyError as missing:
        raise HFDirError(f"{path / 'config.json'}: key {missing} is missing") from None
    # (whether the config says anything of RoPE scaling, "default" included: a family whose
    # transformers class has a scaling of its own applies it only where a config is silent)
    config["names_rope"] = bool(raw.get("rope_scaling") or raw.get("rope_parameters"))
    theta, config["rope_scaling"] = rope_settings(raw)
    named = raw.get("rope_theta") if raw.get("rope_theta") is not None else (
        raw.get("rope_parameters") or {}).get("rope_theta")
    config["rope_theta"] = None if named is None else theta
    generation = path / "generation_config.json"
    eos, bos = raw.get("eos_token_id"), raw.get("bos_token_id")
    if generation.is_file():
        gen = _read_json(generation)
        eos = gen.get("eos_token_id", eos)
        bos = bos if bos is not None else gen.get("bos_token_id")
        # the checkpoint's sampling defaults (the manifest's model.sampling_defaults)
        config["generation_sampling"] = read_values(gen)
    config["eos_token_id"] = eos
    config["bos_token_id"] = bos
    return config


# the LM head's weight under the names checkpoints give it (GPT-NeoX's: embed_out)
LM_HEAD_NAMES = {"lm_head.weight", "embed_out.weight"}


def load_weights(
    path: Path, config: dict[str, Any], progress: Progress | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(HF name -> array, HF name -> stored dtype) over every safetensors file."""
    weights: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    files = weight_files(path)
    total = sum(_tensor_count(file) for file in files)
    for file in files:
        for name, array, dtype in _tensors(file):
            if name in weights:
                raise HFDirError(f"{file}: tensor {name} also appears in another file")
            weights[name], dtypes[name] = array, dtype
            if progress is not None:
                progress("read", len(weights), total)
    if config.get("multimodal"):
        text_weights(weights, dtypes)
    if not config["tie_word_embeddings"] and not LM_HEAD_NAMES & weights.keys():
        config["tie_word_embeddings"] = True  # (no head of its own: tied, whatever it says)
    if config["tie_word_embeddings"]:
        for name in LM_HEAD_NAMES:
            weights.pop(name, None)
            dtypes.pop(name, None)
    return weights, dtypes


def _tensors(file: Path) -> Iterator[tuple[str, np.ndarray, str]]:
    """(name, array, stored dtype) of each tensor in one weight file."""
    if file.suffix == ".bin":
        try:
            yield from torch_pickle.read(file)
        except torch_pickle.TorchPickleError as err:
            raise HFDirError(f"{file}: {err}") from None
        return
    offsets = None
    with safe_open(file, framework="numpy") as f:
        for name in f.keys():
            view = f.get_slice(name)
            dtype, shape = view.get_dtype(), tuple(view.get_shape())
            if dtype == "BF16":
                offsets = offsets or _header(file)
                yield name, LazyArray(functools.partial(_read_bf16, file, offsets, name), shape,
                                      np.float32), dtype
            elif dtype in _NUMPY_DTYPES:  # (read when the compiler writes it: lazy_weights)
                yield name, LazyArray(functools.partial(_read_tensor, file, name), shape,
                                      _NUMPY_DTYPES[dtype]), dtype
            else:
                yield name, np.array(f.get_tensor(name), copy=True), dtype


# safetensors' dtype names -> numpy's, for the tensors read on demand
_NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                 "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                 "BOOL": np.bool_}


def _read_tensor(file: Path, name: str) -> np.ndarray:
    with safe_open(file, framework="numpy") as f:
        return np.array(f.get_tensor(name), copy=True)


def _tensor_count(file: Path) -> int:
    """How many tensors ``file`` holds (for the progress total)."""
    if file.suffix == ".bin":
        try:
            return torch_pickle.count(file)
        except torch_pickle.TorchPickleError as err:
            raise HFDirError(f"{file}: {err}") from None
    with safe_open(file, framework="numpy") as f:
        return len(list(f.keys()))


def load_tokenizer(path: Path) -> tuple[str, dict[str, Any]]:
    """(tokenizer.json text, tokenizer_config with plain-string special tokens). Without a
    tokenizer.json, the one transformers would build from vocab.json and merges.txt, its
    special tokens from tokenizer_config.json, else special_tokens_map.json."""
    config_file = path / "tokenizer_config.json"
    config = _read_json(config_file) if config_file.is_file() else {}
    (first, *_) = tokenizer_files(path)
    if first.name != TOKENIZER_JSON and (path / SPECIAL_TOKENS_MAP).is_file():
        # (as transformers' slow tokenizers load them: the map's tokens win)
        config = {**config, **_read_json(path / SPECIAL_TOKENS_MAP)}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):  # older files: {"content": "<s>", "lstrip": ...}
            config[key] = value.get("content")
    if first.name == TOKENIZER_JSON:
        tokenizer_json = without_padding(first.read_text(encoding="utf-8"))
    else:
        from .tokenizer_build import build_from_bpe_files

        tokenizer_json = build_from_bpe_files(_read_json(path / BPE_FILES[0]),
                                              (path / BPE_FILES[1]).read_text(encoding="utf-8"),
                                              config)
    template = path / "chat_template.jinja"
    if "chat_template" not in config and template.is_file():
        config["chat_template"] = template.read_text(encoding="utf-8")
    processor_template = path / PROCESSOR_TEMPLATE  # (image-and-text repos of transformers 4.4x)
    if "chat_template" not in config and processor_template.is_file():
        config["chat_template"] = _read_json(processor_template).get("chat_template")
    return tokenizer_json, config


def without_padding(tokenizer_json: str) -> str:
    """tokenizer.json without a padding or truncation setting (sentence-transformers exports
    often keep ``Fixed: 128`` padding): the engine's encode must give a text's own tokens;
    lengths are the engine's to check."""
    try:
        parsed = json.loads(tokenizer_json)
    except ValueError:
        return tokenizer_json  # (the tokenizer's own loader names the damage)
    if not isinstance(parsed, dict) or (parsed.get("padding") is None
                                        and parsed.get("truncation") is None):
        return tokenizer_json
    parsed["padding"] = parsed["truncation"] = None
    return json.dumps(parsed, ensure_ascii=False)


def rope_settings(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) from a config.json in any transformers spelling:
    ``rope_theta`` + ``rope_scaling`` (4.x) or ``rope_parameters`` (5.x); ``type`` is the older
    name of ``rope_type``; "default" scaling is none."""
    params = dict(hf.get("rope_parameters") or {})
    theta = params.pop("rope_theta", None)
    theta = hf["rope_theta"] if hf.get("rope_theta") is not None else theta
    theta = 10000.0 if theta is None else theta
    scaling = hf.get("rope_scaling") or (params if params else None)
    if scaling:
        scaling = dict(scaling)
        kind = scaling.pop("type", None)
        scaling.setdefault("rope_type", kind)
        scaling.pop("rope_theta", None)
        scaling.pop("partial_rotary_factor", None)  # (not scaling: DecoderConfig reads it)
        if scaling["rope_type"] in (None, "default"):
            scaling = None
    return float(theta), scaling or None


def _read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise HFDirError(f"{file}: not valid JSON ({err})") from None


def _header(file: Path) -> tuple[int, dict[str, Any]]:
    """(offset of the data section, header dict) of a safetensors file."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return 8 + size, json.loads(f.read(size))


def _read_bf16(file: Path, header: tuple[int, dict[str, Any]], name: str) -> np.ndarray:
    base, entries = header
    begin, end = entries[name]["data_offsets"]
    count = (end - begin) // 2
    # each bf16 the high half of a float32 (low halves zero), read a block at a time into the
    # floats' high halves: the floats and one block in memory, not the floats three times
    wide = np.zeros(count, np.uint32)
    halves = wide.view(np.uint16)[1::2] if sys.byteorder == "little" else wide.view(np.uint16)[::2]
    with open(file, "rb") as f:
        f.seek(base + begin)
        for start in range(0, count, BF16_BLOCK):
            stop = min(count, start + BF16_BLOCK)
            block = np.fromfile(f, dtype="<u2", count=stop - start)
            if block.size != stop - start:
                raise HFDirError(f"{file}: tensor {name} is cut short (the file ends early)")
            halves[start:stop] = block
    return wide.view(np.float32).reshape(entries[name]["shape"])


BF16_BLOCK = 1 << 22  # bf16 values read at a time
