"""Checkpoints that name or lay out the same weights their own ways reach one compiled model:
GPT-2 saved with and without the ``transformer.`` prefix (openai-community/gpt2 has none, and
keeps its attention-mask buffers), GPT-NeoX's per-head q/k/v interleaving, GPT-2-style config
keys, an untied head named ``embed_out``. (The families' parity suite, tests/e2e/test_families.py,
runs each one's own layout against transformers.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from wick.compiler import hf_source
from wick.compiler.models import gpt2, gpt_neox


def _weights(names_shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in names_shapes.items()}


GPT2_CONFIG = {"model_type": "gpt2", "vocab_size": 11, "n_embd": 8, "n_layer": 1, "n_head": 2,
               "n_positions": 16, "n_inner": None, "layer_norm_epsilon": 1e-5}


def _gpt2_checkpoint(prefix: str) -> dict[str, np.ndarray]:
    h, inner = 8, 32
    shapes = {"wte.weight": (11, h), "wpe.weight": (16, h), "ln_f.weight": (h,), "ln_f.bias": (h,),
              "h.0.ln_1.weight": (h,), "h.0.ln_1.bias": (h,), "h.0.ln_2.weight": (h,),
              "h.0.ln_2.bias": (h,), "h.0.attn.c_attn.weight": (h, 3 * h),
              "h.0.attn.c_attn.bias": (3 * h,), "h.0.attn.c_proj.weight": (h, h),
              "h.0.attn.c_proj.bias": (h,), "h.0.mlp.c_fc.weight": (h, inner),
              "h.0.mlp.c_fc.bias": (inner,), "h.0.mlp.c_proj.weight": (inner, h),
              "h.0.mlp.c_proj.bias": (h,)}
    return {prefix + n: w for n, w in _weights(shapes).items()}


def test_gpt2_config_keys_are_read_under_the_usual_names(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT2_CONFIG))
    config = hf_source.load_config(tmp_path)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["max_position_embeddings"], config["intermediate_size"]) == (8, 1, 2, 16, 32)
    c = gpt2.Config.from_hf(config)
    # (tied or not: load_weights decides, by whether the file has a head of its own)
    assert (c.num_key_value_heads, c.rms_norm_eps, c.layer_norm) == (2, 1e-5, True)
    assert not c.attention(0, "float32").rope


def test_gpt2_style_keys_win_over_stray_usual_ones():
    """transformers' GPT-2 reads n_inner, not an intermediate_size saved beside it."""
    config = hf_source.with_aliases({**GPT2_CONFIG, "n_inner": 24, "intermediate_size": 128,
                                     "hidden_size": 99})
    assert (config["intermediate_size"], config["hidden_size"]) == (24, 8)
    assert hf_source.with_aliases({"hidden_size": 8, "intermediate_size": 5}) == {
        "hidden_size": 8, "intermediate_size": 5}  # (not a GPT-2-style config: as it is)


def test_gpt2_with_or_without_the_transformer_prefix_converts_alike():
    config = gpt2.Config.from_hf(hf_source.with_aliases(GPT2_CONFIG))
    bare = _gpt2_checkpoint("")
    bare["h.0.attn.bias"] = np.tril(np.ones((16, 16), np.float32))  # (old files' mask buffer)
    prefixed = _gpt2_checkpoint("transformer.")
    a, b = gpt2.convert_weights(config, bare), gpt2.convert_weights(config, prefixed)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[n], b[n]) for n in a)
    # Conv1D's (in, out) became (out, in); q|k|v stay in their order
    qkv = a["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (24, 8) and np.array_equal(qkv, bare["h.0.attn.c_attn.weight"].T)
    assert a["model.embed_positions.weight"].shape == (16, 8)
    assert "model.layers.0.attn.bias" not in a


def test_gpt2_refuses_attention_scaled_by_layer():
    with pytest.raises(Exception, match="scale_attn_by_inverse_layer_idx"):
        gpt2.Config.from_hf(hf_source.with_aliases(
            {**GPT2_CONFIG, "scale_attn_by_inverse_layer_idx": True}))


def test_gpt_neox_regroups_interleaved_heads():
    heads, d, hidden = 2, 3, 6
    # rows named (head, part, i): what query_key_value's view(heads, 3 * d) reads
    rows = np.array([[h * 100 + part * 10 + i] for h in range(heads) for part in range(3)
                     for i in range(d)], np.float32) * np.ones((1, hidden), np.float32)
    got = gpt_neox.regroup_qkv(rows, heads)[:, 0]
    want = [h * 100 + part * 10 + i for part in range(3) for h in range(heads) for i in range(d)]
    assert got.tolist() == want


def test_an_untied_head_named_embed_out_is_kept(tmp_path):
    from safetensors.numpy import save_file

    save_file({"embed_out.weight": np.ones((4, 2), np.float32),
               "gpt_neox.embed_in.weight": np.zeros((4, 2), np.float32)},
              str(tmp_path / "model.safetensors"))
    config = {"tie_word_embeddings": False}
    weights, _ = hf_source.load_weights(tmp_path, config)
    assert config["tie_word_embeddings"] is False and "embed_out.weight" in weights


def test_opt_without_the_model_prefix_converts_alike_and_drops_two_position_rows():
    from wick.compiler.models import opt

    h = 8
    config = opt.Config.from_hf(hf_source.with_aliases({
        "model_type": "opt", "vocab_size": 11, "hidden_size": h, "ffn_dim": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 6}))
    assert config.intermediate_size == 16  # (OPT's ffn_dim)
    layer = "decoder.layers.0."
    shapes = {"decoder.embed_tokens.weight": (11, h), "decoder.embed_positions.weight": (8, h),
              "decoder.final_layer_norm.weight": (h,), "decoder.final_layer_norm.bias": (h,),
              **{layer + f"self_attn.{x}_proj.{k}": (h, h) if k == "weight" else (h,)
                 for x in ("q", "k", "v", "out") for k in ("weight", "bias")},
              **{layer + f"{n}.{k}": (h,) for n in ("self_attn_layer_norm", "final_layer_norm")
                 for k in ("weight", "bias")},
              layer + "fc1.weight": (16, h), layer + "fc1.bias": (16,),
              layer + "fc2.weight": (h, 16), layer + "fc2.bias": (h,)}
    bare = _weights(shapes)
    a = opt.convert_weights(config, bare)
    b = opt.convert_weights(config, {"model." + n: w for n, w in bare.items()})
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
    assert np.array_equal(a["model.embed_positions.weight"], bare["decoder.embed_positions.weight"][2:])
    # the layer's own final_layer_norm is the MLP's norm; the decoder's the model's last
    assert np.array_equal(a["model.layers.0.post_attention_layernorm.weight"],
                          bare[layer + "final_layer_norm.weight"])
    assert np.array_equal(a["model.norm.weight"], bare["decoder.final_layer_norm.weight"])


def _hf_config(tmp_path, **values) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(values))
    return hf_source.load_config(tmp_path)


NEOX = {"model_type": "gpt_neox", "vocab_size": 11, "hidden_size": 8, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2}


def test_family_defaults_apply_where_a_config_is_silent(tmp_path):
    """transformers' config classes' defaults, not the Llama-shaped ones load_config fills:
    GPT-NeoX's older rotary keys, LayerNorm epsilon 1e-5, a quarter of each head rotated."""
    c = gpt_neox.Config.from_hf(_hf_config(tmp_path, **NEOX, rotary_emb_base=1e6,
                                           rotary_pct=0.5))
    assert (c.rope_theta, c.rotary_dim, c.rms_norm_eps) == (1e6, 2, 1e-5)
    c = gpt_neox.Config.from_hf(_hf_config(tmp_path, **NEOX))
    assert (c.rope_theta, c.rotary_dim) == (10000.0, 1)


def test_a_silent_tie_is_the_familys(tmp_path):
    """GPT-2 ties its head by default, even beside a stored copy; Llama does not."""
    config = _hf_config(tmp_path, **GPT2_CONFIG)
    assert config["tie_word_embeddings"] is None
    assert gpt2.Config.from_hf(config).tie_word_embeddings is True
    from wick.compiler.models import llama

    llama_config = _hf_config(tmp_path, model_type="llama", vocab_size=11, hidden_size=8,
                              intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    assert llama.Config.from_hf(llama_config).tie_word_embeddings is False


def test_stablelm_gguf_layers_are_parallel_only_without_a_second_norm():
    """llama.cpp's converter writes use_parallel_residual true where a config has no such key
    (StableLM 2 1.6B's); its loader goes by the second norm's presence, as wick does."""
    from wick.compiler.models import stablelm

    def key(name, default=None):
        return {"attention.layer_norm_epsilon": 1e-5, "use_parallel_residual": True}.get(
            name, default)

    assert stablelm.gguf_config(key, {"blk.0.ffn_norm.weight"})["use_parallel_residual"] is False
    assert stablelm.gguf_config(key, set())["use_parallel_residual"] is True


def test_opt_takes_a_null_embedding_width_as_the_models():
    from wick.compiler.models import opt

    c = opt.Config.from_hf(hf_source.with_aliases({
        "model_type": "opt", "vocab_size": 11, "hidden_size": 8, "ffn_dim": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "word_embed_proj_dim": None}))
    assert c.hidden_size == 8


def olmo3_config(**changes):
    raw = {"model_type": "olmo3", "vocab_size": 100, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
           "num_key_value_heads": 4, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
           "sliding_window": 4096}
    return {**raw, **changes}


def test_olmo3_layers_and_each_kinds_rope_from_a_transformers_4_config():
    """OLMo 3 7B's config.json as released (transformers 4.x: rope_theta + rope_scaling, the
    YaRN for the global layers only): transformers 5 reads the same numbers out of it."""
    from transformers import Olmo3Config

    from wick.compiler.models import olmo3

    yarn = {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.2079, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 8192}
    raw = olmo3_config(rope_theta=500000, rope_scaling=yarn)
    c = olmo3.Config.from_hf(raw)
    hf = Olmo3Config(**{k: v for k, v in raw.items() if k != "model_type"})
    assert c.extra["sliding"] == [t == "sliding_attention" for t in hf.layer_types]
    assert c.extra["sliding"] == [True, True, True, False] * 2
    (full_theta, full), (local_theta, local) = (c.extra["rope_by_kind"][False],
                                                c.extra["rope_by_kind"][True])
    assert (full_theta, local_theta, local) == (500000.0, 500000.0, None)
    assert full["rope_type"] == "yarn" and full["attention_factor"] == 1.2079
    assert (c.attention(3, "float32").window, c.attention(0, "float32").window) == (None, 4096)
    assert c.attention(3, "float32").rope_scaling != c.attention(0, "float32").rope_scaling
    # (no rope_theta at all: transformers' 500k; no sliding_window: its 4096)
    bare = olmo3.Config.from_hf({k: v for k, v in olmo3_config().items()
                                 if k != "sliding_window"})
    assert bare.extra["rope_by_kind"][False] == (500000.0, None)
    assert bare.sliding_window == 4096


@pytest.mark.parametrize("family,theta,eps,head_dim", [
    ("llama", 10000.0, 1e-6, 8), ("helium", 100000.0, 1e-8, 128), ("glm", 10000.0, 1.5625e-7, 128),
    ("arcee", 10000.0, 1e-5, 8), ("olmo2", 10000.0, 1e-5, 8), ("olmo3", 500000.0, 1e-5, 8),
    ("exaone", 500000.0, 1e-5, 8), ("seed_oss", 10000.0, 1e-6, 128),
])
def test_a_silent_config_gets_its_familys_rope_base_epsilon_and_head_width(
        tmp_path, family, theta, eps, head_dim):
    """Each family's transformers config class defaults, where config.json names no
    rope_theta, rms_norm_eps or head_dim (load_config leaves them unset for the family)."""
    from transformers import AutoConfig

    from wick.compiler.models import family_for

    values = {"model_type": family, "vocab_size": 11, "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2}
    c = family_for(family).Config.from_hf(_hf_config(tmp_path, **values))
    spec = c.attention(3, "float32")  # (a global layer in OLMo 3)
    assert (spec.rope_theta, c.rms_norm_eps, c.head_dim) == (theta, eps, head_dim)
    hf = AutoConfig.for_model(**values)  # (transformers' own defaults, for the same keys)
    rope = hf.rope_parameters
    assert (rope.get("full_attention", rope)["rope_theta"], hf.rms_norm_eps) == (theta, eps)
    assert getattr(hf, "head_dim", None) in (head_dim, None)  # (None: hidden / heads)


@pytest.mark.parametrize("layout", [
    {"multi_query": True},  # Falcon-7B: one key/value head after the query heads
    {"new_decoder_architecture": True, "num_kv_heads": 2},  # 40B/180B: per group
    {"multi_query": False},  # q, k, v interleaved per head (Falcon-RW's, without ALiBi here)
], ids=["7b", "40b", "per-head"])
def test_falcon_fused_qkv_splits_as_transformers_splits_it(layout):
    """wick's q|k|v rows of each fused layout equal what transformers' FalconAttention
    _split_heads takes as each head's query, key and value (one position, the row index as the
    value, so each head's rows are named)."""
    import torch
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconAttention

    from wick.compiler.models import falcon

    heads, d = 4, 3
    hf = {"model_type": "falcon", "vocab_size": 11, "hidden_size": heads * d,
          "num_hidden_layers": 1, "num_attention_heads": heads, **layout}
    c = falcon.Config.from_hf({**hf, "intermediate_size": 8})
    attention = FalconAttention(FalconConfig(**{k: v for k, v in hf.items() if k != "model_type"}))
    rows = (c.num_attention_heads + 2 * c.num_key_value_heads) * d
    fused = torch.arange(rows, dtype=torch.float32)[None, None]
    q, k, v = (x.reshape(-1, d)[:, 0] for x in attention._split_heads(fused))
    kv_heads = c.num_key_value_heads
    group = heads // kv_heads
    # (transformers broadcasts each group's key/value head over its query heads in the 40B
    # layout: one per group is the stored head)
    k, v = (x[::group] if layout.get("new_decoder_architecture") else x for x in (k, v))
    want = torch.cat([q, k[:kv_heads], v[:kv_heads]]).tolist()
    regrouped = falcon.convert_weights(c, {
        "transformer.word_embeddings.weight": np.zeros((11, heads * d), np.float32),
        "transformer.ln_f.weight": np.ones(heads * d, np.float32),
        "transformer.ln_f.bias": np.zeros(heads * d, np.float32),
        "transformer.h.0.input_layernorm.weight": np.ones(heads * d, np.float32),
        "transformer.h.0.input_layernorm.bias": np.zeros(heads * d, np.float32),
        "transformer.h.0.ln_attn.weight": np.ones(heads * d, np.float32),
        "transformer.h.0.ln_attn.bias": np.zeros(heads * d, np.float32),
        "transformer.h.0.ln_mlp.weight": np.ones(heads * d, np.float32),
        "transformer.h.0.ln_mlp.bias": np.zeros(heads * d, np.float32),
        "transformer.h.0.self_attention.query_key_value.weight":
            np.arange(rows, dtype=np.float32)[:, None] * np.ones((1, heads * d), np.float32)})
    got = regrouped["model.layers.0.self_attn.qkv_proj.weight"][:, 0].reshape(-1, d)[:, 0]
    assert got.tolist() == want


def test_falcon_config_defaults_as_transformers_has_them(tmp_path):
    """A Falcon-7B-shaped config without ffn_hidden_size or tie_word_embeddings: an MLP four
    times the width, a tied head, LayerNorm epsilon 1e-5, one key/value head; ALiBi refused."""
    from transformers import AutoConfig

    from wick.compiler.model_config import UnsupportedConfig
    from wick.compiler.models import falcon

    values = {"model_type": "falcon", "vocab_size": 11, "hidden_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "multi_query": True}
    c = falcon.Config.from_hf(_hf_config(tmp_path, **values))
    ref = AutoConfig.for_model(**values)
    assert (c.intermediate_size, c.tie_word_embeddings, c.rms_norm_eps, c.num_key_value_heads,
            c.rope_theta) == (ref.ffn_hidden_size, ref.tie_word_embeddings,
                              ref.layer_norm_epsilon, 1, ref.rope_parameters["rope_theta"])
    with pytest.raises(UnsupportedConfig, match="ALiBi"):
        falcon.Config.from_hf(_hf_config(tmp_path, **values, alibi=True))


def test_apertus_config_silent_on_rope_gets_transformers_llama3_default(tmp_path):
    """ApertusConfig's RoPE where config.json names none: llama3 scaling at base 12M (not the
    plain RoPE at 10000 a Llama config would get); its epsilon 1e-5."""
    from transformers import AutoConfig

    from wick.compiler.models import apertus

    values = {"model_type": "apertus", "vocab_size": 11, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    c = apertus.Config.from_hf(_hf_config(tmp_path, **values))
    rope = AutoConfig.for_model(**values).rope_parameters
    assert c.rope_theta == rope["rope_theta"]
    assert {k: c.rope_scaling[k] for k in ("rope_type", "factor", "low_freq_factor",
                                           "high_freq_factor",
                                           "original_max_position_embeddings")} == {
        k: rope[k] for k in ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                             "original_max_position_embeddings")}
    assert c.rms_norm_eps == AutoConfig.for_model(**values).rms_norm_eps


@pytest.mark.parametrize("layout, shape", [
    ({"multi_query": True, "parallel_attn": True}, "one_norm"),  # Falcon-7B
    ({"new_decoder_architecture": True, "num_kv_heads": 2}, "two_norms"),  # 40B/180B
    ({"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1},
     "one_norm"),  # Falcon2-11B
    ({"multi_query": False, "parallel_attn": False}, "sequential"),
], ids=["7b", "40b", "11b", "sequential"])
def test_falcon_layer_shapes_are_transformers_decoder_layers(layout, shape):
    """Which norms a Falcon layer has, as transformers' FalconDecoderLayer builds it for the
    same config: one before a parallel block, one for each branch, or two in sequence."""
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconDecoderLayer

    from wick.compiler.models import falcon

    config = FalconConfig(vocab_size=11, hidden_size=16, num_hidden_layers=1,
                          num_attention_heads=4, **layout)
    config._attn_implementation = "eager"
    layer = FalconDecoderLayer(config, 0)
    norms = {name for name in ("input_layernorm", "post_attention_layernorm", "ln_attn",
                               "ln_mlp") if hasattr(layer, name)}
    assert falcon.layer_shape({"model_type": "falcon", **layout}) == shape
    assert norms == {"one_norm": {"input_layernorm"}, "two_norms": {"ln_attn", "ln_mlp"},
                     "sequential": {"input_layernorm", "post_attention_layernorm"}}[shape]


def test_internlm3_config_keys_and_dynamic_rope():
    """InternLM3's own config.json (qkv_bias and bias, dynamic NTK RoPE) as wick reads it:
    the biases on, plain RoPE, the context window the pretrained length (transformers stretches
    the base only past it)."""
    from wick.compiler.models import llama
    from wick.compiler.model_config import UnsupportedConfig

    hf = {"model_type": "internlm3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "max_position_embeddings": 32768, "qkv_bias": True, "bias": True,
          "rope_theta": 50000000, "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"}}
    c = llama.Config.from_hf(hf)
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == (True, True, True)
    assert (c.rope_scaling, c.rope_theta, c.context_window) == (None, 50000000.0, 32768)
    assert not llama.Config.from_hf({**hf, "model_type": "llama"}).qkv_bias  # (InternLM3's keys)
    with pytest.raises(UnsupportedConfig, match="dynamic"):  # (alpha: Hunyuan's, its family's)
        llama.Config.from_hf({**hf, "rope_scaling": {"rope_type": "dynamic", "alpha": 1000.0}})
