"""The text model of an image-and-text checkpoint (Gemma 3 4B and up, Mistral Small 3.1/3.2,
Qwen2-VL, Qwen2.5-VL, Qwen3-VL):
its config read as transformers reads the same config.json (a text_config that names only
what differs from its class's defaults), its token ids, its weights' names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wick.compiler import hf_source

# Gemma 3 4B's config.json as Google published it, vision part left out: its text_config names
# five keys, the rest are Gemma3TextConfig's defaults
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
}
# Mistral Small 3.1's, likewise (MistralConfig's defaults for what it leaves out: the heads)
MISTRAL_SMALL_31 = {
    "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
    "model_type": "mistral3", "spatial_merge_size": 2,
    "text_config": {"head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768,
                    "max_position_embeddings": 131072, "model_type": "mistral",
                    "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                    "rope_theta": 1000000000.0, "sliding_window": None, "vocab_size": 131072},
}

# Qwen2.5-VL 7B's as Qwen published it, vision part left out: flat, multimodal RoPE as "mrope"
QWEN25_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
    "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
}
# Qwen3-VL 4B's, likewise: a full text_config, interleaved multimodal RoPE, a tied head
QWEN3_VL_4B = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655,
    "model_type": "qwen3_vl", "tie_word_embeddings": True, "video_token_id": 151656,
    "vision_end_token_id": 151653, "vision_start_token_id": 151652,
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
        "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
        "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": {"mrope_interleaved": True,
                                                 "mrope_section": [24, 20, 20],
                                                 "rope_type": "default"},
        "rope_theta": 5000000, "tie_word_embeddings": True, "use_cache": True,
        "vocab_size": 151936},
}


def _config(tmp_path, raw: dict, generation: dict | None = None) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(raw))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return hf_source.load_config(tmp_path)


def test_the_defaults_table_is_transformers_own():
    from transformers import (Gemma3TextConfig, MistralConfig, Qwen2_5_VLTextConfig,
                              Qwen2VLTextConfig, Qwen3VLTextConfig)

    for kind, cls in (("gemma3", Gemma3TextConfig), ("mistral3", MistralConfig),
                      ("qwen2_vl", Qwen2VLTextConfig), ("qwen2_5_vl", Qwen2_5_VLTextConfig),
                      ("qwen3_vl", Qwen3VLTextConfig)):
        reference = cls()
        for key, value in hf_source.TEXT_CONFIG_DEFAULTS[kind].items():
            if key == "rope_theta":
                rope = reference.rope_parameters
                assert rope.get("full_attention", rope)["rope_theta"] == value, (kind, key)
            elif key == "rope_local_base_freq":
                assert reference.rope_parameters["sliding_attention"]["rope_theta"] == value
            elif key == "sliding_window_pattern":
                assert [t == "full_attention" for t in reference.layer_types] == [
                    (i + 1) % value == 0 for i in range(reference.num_hidden_layers)]
            else:
                assert getattr(reference, key) == value, (kind, key)


def test_gemma3_4b_reads_as_transformers_reads_it(tmp_path):
    """Heads, head width, vocabulary, context, window, layer kinds and each kind's RoPE equal
    transformers' Gemma3Config text part of the same config.json (before, load_config stopped
    at the missing num_attention_heads)."""
    from transformers import Gemma3Config

    from wick.compiler.models import gemma3

    config = _config(tmp_path, GEMMA3_4B, {"bos_token_id": 2, "eos_token_id": [1, 106]})
    c = gemma3.Config.from_hf(config)
    ref = Gemma3Config(**{k: v for k, v in GEMMA3_4B.items() if k != "model_type"}).text_config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.context_window, c.sliding_window) == (
        ref.vocab_size, ref.hidden_size, ref.num_hidden_layers, ref.num_attention_heads,
        ref.num_key_value_heads, ref.head_dim, ref.max_position_embeddings, ref.sliding_window)
    assert c.extra["sliding"] == [t == "sliding_attention" for t in ref.layer_types]
    assert c.extra["scale"] == pytest.approx(ref.query_pre_attn_scalar ** -0.5)
    (full_theta, full), (local_theta, local) = c.extra["rope"][False], c.extra["rope"][True]
    assert (full_theta, dict(full)["factor"], local_theta, local) == (
        ref.rope_parameters["full_attention"]["rope_theta"],
        ref.rope_parameters["full_attention"]["factor"],
        ref.rope_parameters["sliding_attention"]["rope_theta"], None)
    assert (config["bos_token_id"], config["eos_token_id"]) == (2, [1, 106])
    assert c.tie_word_embeddings is True


def test_mistral_small_reads_as_transformers_reads_it(tmp_path):
    from transformers import Mistral3Config

    from wick.compiler.models import mistral

    c = mistral.Config.from_hf(_config(tmp_path, MISTRAL_SMALL_31))
    ref = Mistral3Config(**{k: v for k, v in MISTRAL_SMALL_31.items()
                            if k != "model_type"}).text_config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rope_theta,
            c.rms_norm_eps, c.sliding_window) == (
        ref.num_attention_heads, ref.num_key_value_heads, ref.head_dim,
        ref.rope_parameters["rope_theta"], ref.rms_norm_eps, ref.sliding_window)


@pytest.mark.parametrize("raw", [QWEN25_VL_7B, QWEN3_VL_4B], ids=["qwen2.5-vl", "qwen3-vl"])
def test_qwen_vl_reads_as_transformers_reads_it(tmp_path, raw):
    """A flat Qwen2.5-VL config and a nested Qwen3-VL one: the text model's shape, RoPE base,
    epsilon, tie and token ids equal transformers' text_config of the same config.json; the
    multimodal RoPE is plain RoPE (no scaling) and no window applies."""
    from transformers import AutoConfig

    from wick.compiler.models import qwen2, qwen3

    (tmp_path / "config.json").write_text(json.dumps(raw))
    ref = AutoConfig.from_pretrained(tmp_path)
    text = ref.text_config
    config = hf_source.load_config(tmp_path)
    family = qwen2 if raw is QWEN25_VL_7B else qwen3
    assert config["model_type"] == family.NAME
    c = family.Config.from_hf(config)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
            c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.context_window,
            c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings, c.rope_scaling,
            c.sliding_window) == (
        text.vocab_size, text.hidden_size, text.intermediate_size, text.num_hidden_layers,
        text.num_attention_heads, text.num_key_value_heads,
        getattr(text, "head_dim", text.hidden_size // text.num_attention_heads),
        text.max_position_embeddings, text.rope_parameters["rope_theta"], text.rms_norm_eps,
        ref.tie_word_embeddings, None, None)
    assert text.rope_parameters["rope_type"] == "default"
    assert (config["bos_token_id"], config["eos_token_id"]) == (
        text.bos_token_id, text.eos_token_id)


def test_the_top_levels_token_ids_win_and_bos_comes_from_generation_config(tmp_path):
    """As transformers' generation config takes them: a re-saved Gemma 3 has eos 1 in its text
    part and [1, 106] at the top; neither config names a bos, its generation_config does."""
    raw = {**GEMMA3_4B, "text_config": {**GEMMA3_4B["text_config"], "eos_token_id": 1}}
    config = _config(tmp_path, raw, {"bos_token_id": 2})
    assert (config["eos_token_id"], config["bos_token_id"]) == ([1, 106], 2)


def test_text_weights_are_renamed_and_the_vision_part_dropped():
    weights = {"language_model.model.embed_tokens.weight": np.zeros(1),
               "language_model.lm_head.weight": np.ones(1),
               "model.language_model.layers.0.mlp.up_proj.weight": np.ones(2),
               "vision_tower.vision_model.embeddings.patch_embedding.weight": np.ones(3),
               "multi_modal_projector.mm_input_projection_weight": np.ones(4)}
    dtypes = {name: "F32" for name in weights}
    hf_source.text_weights(weights, dtypes)
    assert sorted(weights) == ["lm_head.weight", "model.embed_tokens.weight",
                               "model.layers.0.mlp.up_proj.weight"] == sorted(dtypes)
    published = {"model.embed_tokens.weight": np.zeros(1), "lm_head.weight": np.ones(1),
                 "visual.blocks.0.attn.qkv.weight": np.ones(2), "visual.merger.mlp.0.bias": 0}
    hf_source.text_weights(published, {name: "F32" for name in published})  # (Qwen2.5-VL's)
    assert sorted(published) == ["lm_head.weight", "model.embed_tokens.weight"]
    plain = {"model.embed_tokens.weight": np.zeros(1), "lm_head.weight": np.ones(1)}
    hf_source.text_weights(plain, {name: "F32" for name in plain})  # (already the text's)
    assert sorted(plain) == ["lm_head.weight", "model.embed_tokens.weight"]
