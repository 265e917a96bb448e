"""The text model of an image-and-text checkpoint (Gemma 3 4B and up, Mistral Small 3.1/3.2):
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


def _config(tmp_path, raw: dict, generation: dict | None = None) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(raw))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return hf_source.load_config(tmp_path)


def test_the_defaults_table_is_transformers_own():
    from transformers import Gemma3TextConfig, MistralConfig

    for kind, cls in (("gemma3", Gemma3TextConfig), ("mistral3", MistralConfig)):
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
    plain = {"model.embed_tokens.weight": np.zeros(1), "lm_head.weight": np.ones(1)}
    hf_source.text_weights(plain, {name: "F32" for name in plain})  # (already the text's)
    assert sorted(plain) == ["lm_head.weight", "model.embed_tokens.weight"]
