"""The tiny models of test_families.py, by family and by GGUF architecture; two of them are
also served as hf:// repos by the stand-in Hub (conftest.hub_models), so that each compiles once
and the hub path gets the families' whole parity suite."""

from __future__ import annotations

from pathlib import Path

FAMILIES = {
    # family: transformers config keys that make its tiny model exercise what is new in it
    "llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "qwen2": {"tie": False},  # q/k/v bias, untied head
    "qwen3": {"tie": False},  # q/k norm, head_dim 32 with hidden 64 / 4 heads
    # experts in two layers, a dense MLP between them (mlp_only_layers), the chosen experts'
    # weights renormalized
    "qwen3_moe": {"tie": False, "layers": 3, "mlp_only_layers": [1], "norm_topk_prob": True},
    # Mixtral: 4 experts, two a token, a window (its checkpoint names: block_sparse_moe, w1..w3)
    "mixtral": {"tie": False, "sliding_window": 24},
    # Qwen2-MoE: a shared expert beside the routed ones, q/k/v biases, weights not renormalized
    "qwen2_moe": {"tie": False},
    # OLMoE: OLMo 2's full-width q/k norms, clamped q/k/v, 8 experts of 32
    "olmoe": {"tie": False, "clip_qkv": 1.5},
    # Granite MoE: Granite's four multipliers, experts stacked in the checkpoint
    "granitemoe": {"tie": False, "embedding_multiplier": 3.0, "attention_multiplier": 0.2,
                   "residual_multiplier": 0.5, "logits_scaling": 2.0},
    # fused qkv and gate_up in the checkpoint; a window shorter than the longer prompts;
    # longrope on half of each head (Phi-3.5 / Phi-4-mini): prompts within the pretrained 64
    # positions (short factors), the 32 greedy tokens cross it (long factors from position 64)
    "phi3": {"tie": False, "sliding_window": 20, "partial_rotary_factor": 0.5,
             "original_max_position_embeddings": 64,
             "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.3, 2.0, 4.5],
                              "long_factor": [1.5, 3.0, 7.0, 20.0]}},
    "mistral": {"tie": True, "sliding_window": 24},
    # ERNIE 4.5 MoE: a dense first layer, then experts chosen by probability + bias, a shared
    # expert unscaled, RoPE on adjacent pairs, biases on the projections
    "ernie4_5_moe": {"tie": True, "layers": 3, "use_bias": True},
    # GPT-OSS: windowed and global layers, each head's attention sink, YaRN, a router and
    # experts with biases, the clamped gate (a limit the random weights reach)
    "gpt_oss": {"tie": False, "layers": 3, "sliding_window": 20,
                "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "truncate": False, "rope_theta": 10000.0,
                                    "original_max_position_embeddings": 32}},
    # InternLM3 (transformers runs it as Llama): biases under its own names (qkv_bias, bias),
    # dynamic NTK RoPE, plain up to the pretrained length
    "internlm3": {"tie": False},
    # Hunyuan dense: per-head q/k RMSNorms after RoPE, RoPE's base stretched by NTK alpha
    "hunyuan_v1_dense": {"tie": True},
    # alternating windowed/global layers, attention and final soft-capping (small caps, so
    # that they bite on these logits)
    "gemma2": {"tie": True, "layers": 3, "sliding_window": 20, "attn_logit_softcapping": 6.0,
               "final_logit_softcapping": 15.0},
    # 5:1 local/global (2 of 6 layers here: pattern 3), each kind with its own RoPE base, the
    # global layers' scaled (Gemma 3 4B and up: linear, factor 8)
    "gemma3": {"tie": True, "layers": 3, "sliding_window": 20, "sliding_window_pattern": 3,
               "rope_parameters": {
                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                   "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 50000.0}}},
    # its four scalars, none of them transformers' default of 1
    "granite": {"tie": True, "embedding_multiplier": 3.0, "attention_multiplier": 0.2,
                "residual_multiplier": 0.5, "logits_scaling": 2.0},
    # a layer without RoPE between two with it
    "smollm3": {"tie": True, "layers": 3, "no_rope_layers": [1, 0, 1]},
    # norms after the blocks only; q/k norms over all heads at once
    "olmo2": {"tie": False},
    # OLMo 2's layer in windowed and global layers, YaRN on the global ones only
    "olmo3": {"tie": False, "layers": 3, "sliding_window": 20,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32}},
    # RoPE on adjacent pairs (interleaved), biases on every projection, head_dim 32 with hidden
    # 64 / 4 heads
    "ernie4_5": {"tie": True, "use_bias": True},
    # hybrid: two windowed layers with RoPE, then a global one without (pattern 3)
    "exaone4": {"tie": False, "layers": 3, "sliding_window": 20, "sliding_window_pattern": 3},
    # Gemma 1: norms as 1 + w, scaled embedding, GELU-tanh (and none of Gemma 2's changes)
    "gemma": {"tie": True},
    # StableLM 2 1.6B's layer: LayerNorms with biases, RoPE on a quarter of each head, q/k/v bias
    "stablelm": {"tie": False, "use_qkv_bias": True, "partial_rotary_factor": 0.25},
    # StableLM 2 12B's: one norm for a parallel attention and MLP; per-head q/k LayerNorms
    "stablelm_parallel": {"tie": False, "use_parallel_residual": True, "qk_layernorm": True,
                          "partial_rotary_factor": 0.25},
    # Phi-2: parallel block, plain GELU MLP, biases everywhere (the LM head's too), RoPE on
    # 0.4 of each head; its head_dim 80 (hidden 160 / 2 heads; 32 rotary dimensions)
    "phi": {"tie": False, "hidden_size": 160, "num_attention_heads": 2,
            "num_key_value_heads": 2, "partial_rotary_factor": 0.4},
    # Pythia: q/k/v interleaved per head in one matrix, a parallel block with two norms, exact
    # GELU, RoPE on a quarter of each head (head_dim 32: 8 dimensions)
    "gpt_neox": {"tie": False, "hidden_size": 128, "partial_rotary_factor": 0.25},
    # StarCoder2: LayerNorms and biases everywhere, a plain GELU MLP, a window on every layer
    "starcoder2": {"tie": True, "sliding_window": 20},
    # Command R: parallel block, LayerNorms without bias, RoPE on adjacent pairs, logit_scale,
    # per-head q/k LayerNorms (Aya Expanse has none; Command R+ has them)
    "cohere": {"tie": True, "logit_scale": 0.5, "use_qk_norm": True},
    # Command R7B: windowed layers with RoPE, then a global one without (pattern 2 here)
    "cohere2": {"tie": True, "logit_scale": 0.5, "sliding_window": 20, "sliding_window_pattern": 2},
    # OPT: GPT-2's shape with ReLU, separate q/k/v, a position table offset by two rows
    "opt": {"tie": True},
    # GLM-4 (-hf): q/k/v biases, RoPE on adjacent pairs of half of each head, gate|up fused
    "glm": {"tie": False},
    # GLM-4-0414: GLM's layer with a norm after each block too
    "glm4": {"tie": False},
    # Seed-OSS: q/k/v biases and (a config switch) one on the output projection
    "seed_oss": {"tie": False, "attention_out_bias": True},
    # Arcee (AFM): a squared-ReLU plain MLP in the Llama decoder
    "arcee": {"tie": False},
    # Helium: RoPE on adjacent pairs over the whole head, q/k/v biases (a config switch)
    "helium": {"tie": False, "attention_bias": True},
    # EXAONE 3.x: Llama under checkpoint and config names of its own (shipped so), llama3 RoPE
    "exaone": {"tie": True, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64}},
    # Ministral: windowed and global layers as layer_types lists them
    "ministral": {"tie": False, "layers": 3, "sliding_window": 20,
                  "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    # OLMo 1: LayerNorms without parameters, q/k/v clamped (a bound the random weights reach)
    "olmo": {"tie": False, "clip_qkv": 1.5},
    # GPT-J: one LayerNorm for a parallel block, RoPE on adjacent pairs of half of each head
    # (rotary_dim), biases on the MLP and the LM head
    "gptj": {"tie": False},
    # the text models of image-and-text checkpoints (Gemma 3 4B and up, Mistral Small 3.1):
    # text_config, weights under language_model., a vision tower left unread
    "gemma3_multimodal": {"tie": True, "layers": 3, "sliding_window": 20,
                          "sliding_window_pattern": 3},
    "mistral3": {"tie": False, "sliding_window": 24},
    # Qwen2.5-VL (as Qwen published it: a flat config, the text weights' own names beside
    # visual.*) and Qwen3-VL: multimodal RoPE, plain RoPE on text
    "qwen2_5_vl": {"tie": False},
    "qwen3_vl": {"tie": True},
    # Falcon-7B: one key/value head, one LayerNorm feeding a parallel attention and MLP
    "falcon": {"tie": True},
    # Falcon-40B/180B: grouped key/value heads interleaved with their query heads in the fused
    # matrix, a parallel block with a LayerNorm each; biases (a config switch) everywhere
    "falcon_40b": {"tie": False, "new_decoder_architecture": True, "num_kv_heads": 2,
                   "bias": True},
    # Apertus: xIELU's per-layer scalars, q/k norms, llama3 RoPE (its config's default)
    "apertus": {"tie": False, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}},
    # Jais 2: LayerNorms, a squared-ReLU plain MLP, biases everywhere (its defaults)
    "jais2": {"tie": False},
    # Nemotron: LayerNorm1P (1 + w, with bias), squared-ReLU plain MLP, RoPE on half of each head
    "nemotron": {"tie": False, "partial_rotary_factor": 0.5},
    # GPT-2: learned positions, no RoPE, Conv1D weights stored (in, out), tied head
    "gpt2": {"tie": True},
    # GPT-BigCode: GPT-2 with one key/value head (multi_query) and Linear weights; and without
    # multi_query, q/k/v interleaved per head
    "gpt_bigcode": {"tie": True},
    "gpt_bigcode_mha": {"tie": True, "multi_query": False},
    # GPT-NeoX's sequential block (use_parallel_residual false)
    "gpt_neox_sequential": {"tie": False, "hidden_size": 128, "partial_rotary_factor": 0.25,
                            "use_parallel_residual": False},
}
# a tiny model's family where its name says more (a variant of one family)
MULTIMODAL = {"gemma3_multimodal": "gemma3", "mistral3": "mistral3",  # variant -> its wrapper
              "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}
FAMILY_OF = {"llama3": "llama", "falcon_40b": "falcon", "stablelm_parallel": "stablelm",
             "gpt_neox_sequential": "gpt_neox", "gpt_bigcode_mha": "gpt_bigcode",
             "gemma3_multimodal": "gemma3", "mistral3": "mistral", "qwen2_5_vl": "qwen2",
             "qwen3_vl": "qwen3", "internlm3": "llama"}


# tiny models whose transformers config is another family's than wick's (tiny_models.FAMILY_CONFIGS)
CONFIG_OF = {"internlm3": "internlm3"}


def family_of(name: str) -> str:
    return FAMILY_OF.get(name, name)
# the tiny models with a sliding window: on every layer (the cache frees pages behind it), or on
# some layers beside global ones (a second, sliding page pool); the window tests run on these
EVERY_LAYER_WINDOWED = ("mistral", "phi3")
WINDOWED_BESIDE_GLOBAL = ("gemma2", "gemma3", "exaone4")


# GGUF architecture -> (tiny family, config changes): what llama.cpp's converter has to
# say in each architecture's own way (Gemma 2's GGUF has no query_pre_attn_scalar: llama.cpp
# scales by 1/sqrt(key_length), so the tiny model uses that scale)
GGUF_CASES = {
    "llama": ("llama3", {}),  # Llama 3.1: q/k rows interleaved, rope_freqs divisors
    # q/k/v biases, an untied head, Qwen's long-context YaRN (factor, pretrained length and
    # beta_fast as llama.cpp's keys)
    "qwen2": ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 2.0,
                                         "original_max_position_embeddings": 64}}),
    "qwen3": ("qwen3", {}),  # q/k norms, key_length != hidden / heads
    # the text models of Qwen2-VL/2.5-VL and Qwen3-VL as llama.cpp writes them: Qwen2's and
    # Qwen3's tensors, multimodal RoPE's sections as a key (plain RoPE on text)
    "qwen2vl": ("qwen2", {}),
    "qwen3vl": ("qwen3", {}),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 16}),  # norms stored as 1 + w, caps, window
    "phi3": ("phi3", {}),  # fused qkv / gate_up, longrope factor tensors, partial rotary
    "granite": ("granite", {}),  # the four multipliers as *_scale keys, q/k rows interleaved
    # no layer list: llama.cpp takes every fourth layer as NoPE, so the tiny model's is that
    "smollm3": ("smollm3", {"layers": 4, "no_rope_layers": [1, 1, 1, 0]}),
    "olmo2": ("olmo2", {}),  # post-block norms under llama.cpp's names, full-width q/k norms
    # OLMo 3, which llama.cpp writes as olmo2: the window, which layers have it, YaRN with its
    # attention factor as attn_factor (one RoPE base in a GGUF: the same for both kinds here)
    "olmo2+olmo3": ("olmo3", {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3,
        "original_max_position_embeddings": 32}}),
    "ernie4_5": ("ernie4_5", {"use_bias": False}),  # q/k rows in the checkpoint's order
    # q/k norms after RoPE under llama.cpp's names, the NTK alpha folded into rope.freq_base
    "hunyuan-dense": ("hunyuan_v1_dense", {}),
    "gemma": ("gemma", {}),  # norms stored as 1 + w under the common names, no output tensor
    # LayerNorm biases and epsilon, rotary dimensions, per-head q/k norms stacked, parallel
    "stablelm": ("stablelm_parallel", {"use_qkv_bias": True}),
    "phi2": ("phi", {}),  # biases under llama.cpp's names (the LM head's: output.bias)
    "gptneox": ("gpt_neox", {}),
    "starcoder2": ("starcoder2", {}),  # the window as attention.sliding_window, norm biases
    # learned positions as position_embd; llama.cpp writes 4 x the width as the MLP's (n_inner
    # null, as GPT-2's own configs have it)
    "gpt2": ("gpt2", {"n_inner": None, "intermediate_size": 256}),
    "nemotron": ("nemotron", {}),  # norms stored as 1 + w, biases, rotary dimensions
    "glm4": ("glm4", {}),  # rows in the checkpoint's order, post-block norms, rotary dimensions
    "seed_oss": ("seed_oss", {}),  # rows in the checkpoint's order, the output bias
    "arcee": ("arcee", {}),  # q/k rows interleaved (Llama's converter), no ffn_gate
    "exaone": ("exaone", {}),  # rows in the checkpoint's order, llama3 scaling as rope_freqs
    "command-r": ("cohere", {}),  # rows in the checkpoint's order, per-head norms, logit_scale
    # no layer list: llama.cpp takes every fourth layer as global, so the tiny model's is that
    "cohere2": ("cohere2", {"layers": 4, "sliding_window_pattern": 4}),
    # Falcon-40B's grouped heads ungrouped into attn_qkv, its second norm as attn_norm_2; an MLP
    # 4 x the width (what llama.cpp writes) and no biases (which llama.cpp's falcon has not)
    "falcon": ("falcon_40b", {"ffn_hidden_size": 256, "bias": False}),
    # the xIELU scalars as per-layer arrays, as stored; q/k rows in the checkpoint's order
    "apertus": ("apertus", {}),
    "jais2": ("jais2", {}),  # LayerNorm epsilon, rotary dimensions, biases; rows as stored
    # mixture-of-experts: each projection's experts stacked; Qwen's expert widths as keys;
    # Mixtral as llama with experts (q/k rows interleaved, no window: LlamaModel writes none);
    # the routers in the norm_topk_prob llama.cpp's graphs hard-code (Qwen3-MoE renormalizes)
    "qwen3moe": ("qwen3_moe", {"mlp_only_layers": []}),  # (llama.cpp's has no dense layers)
    "qwen2moe": ("qwen2_moe", {}),  # a shared expert and its gate (one row)
    "olmoe": ("olmoe", {"clip_qkv": None}),
    "llama+mixtral": ("mixtral", {"sliding_window": None}),
    # Granite MoE: its stacked input_linear split into gate and up stacks, the multipliers
    "granitemoe": ("granitemoe", {}),
    # ERNIE 4.5 MoE: the correction bias as exp_probs_b, dense layers before
    # leading_dense_block_count, the shared experts as *_shexp (no biases: llama.cpp reads none)
    "ernie4_5-moe": ("ernie4_5_moe", {"use_bias": False}),
    # GPT-OSS: the sinks as attn_sinks, gate|up split into two stacks with their biases, the
    # router's bias; the experts in MXFP4 (the tiny model's rounded to its grid: gguf_case)
    "gpt-oss": ("gpt_oss", {"swiglu_limit": 7.0}),  # (llama.cpp hard-codes 7: no key for it)
    # ... and as llama.cpp wrote it before April 2024: one tensor an expert (ffn_up.E)
    "llama+mixtral_legacy": ("mixtral", {"sliding_window": None}),
    "starcoder": ("gpt_bigcode", {"n_inner": None, "intermediate_size": 256}),  # multi-query  # q|k|v regrouped in attn_qkv, parallel blocks with two norms
}


def family_model(root: Path, name: str) -> Path:
    """A family's tiny HF directory; Qwen2's weights in bfloat16, as most Hub checkpoints
    ship; OPT's tokenizer as vocab.json and merges.txt and its weights as pytorch_model.bin,
    as OPT's repos ship them."""
    from tests.tiny_models import (make_tiny_model, to_bfloat16, to_bpe_files, to_exaone_names,
                                   to_multimodal, to_torch_bin)

    family_name = CONFIG_OF.get(name, family_of(name))
    path = make_tiny_model(root, family_name, seed=7, **FAMILIES[name])
    if name == "opt":
        return to_torch_bin(to_bpe_files(path))
    if name == "exaone":
        return to_exaone_names(path)
    if name in MULTIMODAL:
        return to_multimodal(path, MULTIMODAL[name])
    return to_bfloat16(path) if name == "qwen2" else path


def gguf_case(root: Path, arch: str) -> tuple[Path, Path]:
    """(HF directory, GGUF file) of a GGUF architecture's tiny model."""
    from tests.tiny_models import make_tiny_model, to_mxfp4_grid, write_gguf

    name, changes = GGUF_CASES[arch]
    family_name = family_of(name)
    hf_dir = make_tiny_model(root, family_name, seed=11, merges=[("\u0120", "\u0120")],
                             **{**FAMILIES[name], **changes})
    written = gguf_arch(arch)
    types = {}
    if arch == "gpt-oss":  # (its experts in MXFP4, as OpenAI's and llama.cpp's files have them)
        to_mxfp4_grid(hf_dir)
        types = {f"{stack}.weight": "MXFP4"
                 for stack in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
    return hf_dir, write_gguf(hf_dir, hf_dir / f"tiny-{written}.gguf", written, types,
                              legacy_experts=arch.endswith("_legacy"))


def gguf_arch(case: str) -> str:
    """A GGUF case's architecture: its name, up to a ``+`` naming the model written under it
    (``olmo2+olmo3``: OLMo 3 as llama.cpp writes it)."""
    return case.split("+")[0]


# the hf:// repos of the stand-in Hub: (repo, family or GGUF architecture, kind)
HUB_REPOS = {"qwen2": "org/tiny-qwen2", "gguf:llama": "org/tiny-llama-GGUF"}


def hub_with_family_models(root: Path):
    """A stand-in Hub serving Qwen2's bf16 checkpoint (with files wick must not fetch) and the
    Llama 3 GGUF in a repo; ``hub.dirs`` holds each one's HF directory (transformers'
    reference), ``hub.commits`` each repo's commit, ``hub.cache`` a huggingface_hub cache."""
    from tests.hub_standin import StandinHub

    def files(directory: Path) -> dict[str, bytes]:
        return {p.relative_to(directory).as_posix(): p.read_bytes()
                for p in sorted(directory.rglob("*")) if p.is_file() and p.suffix != ".gguf"}

    hub = StandinHub()
    qwen = family_model(root / "qwen2", "qwen2")
    llama, gguf = gguf_case(root / "llama", "llama")
    hub.dirs = {"qwen2": qwen, "gguf:llama": llama}
    hub.commits = {
        "qwen2": hub.add(HUB_REPOS["qwen2"], {**files(qwen), "README.md": b"# tiny",
                                              "pytorch_model.bin": b"not fetched" * 100}),
        "gguf:llama": hub.add(HUB_REPOS["gguf:llama"], {"tiny-llama-F32.gguf": gguf.read_bytes(),
                                                        "README.md": b"# gguf"}),
    }
    hub.cache = root / "hf-cache"
    return hub
