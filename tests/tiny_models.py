"""Tiny random models built offline from transformers configs (test references only)."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_tokenizer(merges: list[tuple[str, str]] = ()):
    """A byte-level BPE tokenizer, every byte a token (ids 0..255) and ``merges`` (their
    results next), plus ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def make_tiny_llama(out: Path, *, seed: int = 0, layers: int = 2, tie: bool = False,
                    context: int = 512) -> Path:
    return make_tiny_model(out, "llama", seed=seed, layers=layers, tie=tie, context=context)


# family -> (transformers config and model class names, config keys beyond the shared ones)
FAMILY_CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),  # head_dim != hidden/heads
    # 8 experts of 32, two a token (each layer's router output checked against transformers')
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4,
                                                        "num_experts_per_tok": 2}),
    # a shared expert of 64 beside 8 experts of 32
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 8, "num_experts_per_tok": 2,
                                                  "intermediate_size": 32}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}),
    # ERNIE 4.5 MoE: 8 experts of 32, two a token, chosen by probability + a bias; one shared
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", {
        "pad_token_id": 0, "head_dim": 32, "moe_num_experts": 8, "moe_k": 2,
        "moe_intermediate_size": 32, "moe_num_shared_experts": 1, "moe_layer_start_index": 1}),
    # GPT-OSS: 4 experts of 32 with biases and a clamped gate, two a token; attention sinks
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {
        "head_dim": 16, "pad_token_id": 0, "num_local_experts": 4, "num_experts_per_tok": 2,
        "intermediate_size": 32, "swiglu_limit": 1.0}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "internlm3": ("InternLM3Config", "LlamaForCausalLM", {
        "pad_token_id": 0, "head_dim": 16, "qkv_bias": True, "bias": True,
        "rope_parameters": {"rope_type": "dynamic", "factor": 6.0, "rope_theta": 10000.0}}),
    # (q/k norms after RoPE; RoPE's base stretched by a fixed NTK alpha, as the checkpoints say)
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {
        "head_dim": 16, "pad_token_id": 0,
        "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                            "rope_theta": 10000.0}}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "query_pre_attn_scalar": 24,
                                                     "pad_token_id": 0}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 32, "query_pre_attn_scalar": 24,
                                                         "pad_token_id": 0}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"pad_token_id": 0}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"pad_token_id": 0}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"pad_token_id": 0}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {"pad_token_id": 0}),
    "glm": ("GlmConfig", "GlmForCausalLM", {"pad_token_id": 0, "head_dim": 16}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"pad_token_id": 0, "head_dim": 16}),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", {"pad_token_id": 0, "head_dim": 16}),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {"pad_token_id": 0}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", {"pad_token_id": 0, "head_dim": 16}),
    "exaone": ("ExaoneConfig", "LlamaForCausalLM", {"pad_token_id": 0}),  # (transformers' way)
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {"pad_token_id": 0}),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", {"pad_token_id": 0, "layer_norm_epsilon": 1e-5,
                                               "num_key_value_heads": 4, "n_inner": 128,
                                               "rotary_dim": 8}),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {"pad_token_id": 0, "head_dim": 16}),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {"pad_token_id": 0, "head_dim": 32}),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {"pad_token_id": 0}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16, "pad_token_id": 0}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {"pad_token_id": 0, "layer_norm_eps": 1e-5}),
    "phi": ("PhiConfig", "PhiForCausalLM", {"pad_token_id": 0, "layer_norm_eps": 1e-5}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {"pad_token_id": 0,
                                                                 "norm_epsilon": 1e-5}),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", {
        "pad_token_id": 0, "layer_norm_epsilon": 1e-5, "n_inner": 128}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"pad_token_id": 0, "layer_norm_eps": 1e-5}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {"pad_token_id": 0, "layer_norm_eps": 1e-5}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"pad_token_id": 0, "ffn_dim": 128,
                                            "num_key_value_heads": 4}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {"pad_token_id": 0, "norm_eps": 1e-5}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"pad_token_id": 0, "layer_norm_epsilon": 1e-5,
                                               "num_key_value_heads": 4, "n_inner": 128}),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {"pad_token_id": 0}),
    "jais2": ("Jais2Config", "Jais2ForCausalLM", {"pad_token_id": 0, "layer_norm_eps": 1e-5}),
    # (Falcon's MLP width is ffn_hidden_size; its key/value heads are multi_query's one or
    # num_kv_heads)
    "falcon": ("FalconConfig", "FalconForCausalLM", {"pad_token_id": 0, "layer_norm_epsilon": 1e-5,
                                                     "intermediate_size": None,
                                                     "ffn_hidden_size": 128,
                                                     "num_key_value_heads": None}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"pad_token_id": 0, "layer_norm_eps": 1e-5,
                                                         "num_key_value_heads": 4}),
}


def make_tiny_model(out: Path, family: str = "llama", *, seed: int = 0, layers: int = 2,
                    tie: bool = False, context: int = 512, extra_tokens: list[str] = (),
                    chat_template: str = CHATML, merges: list[tuple[str, str]] = (),
                    **config) -> Path:
    """A random ``family`` model of 2..6 layers with the byte-level tokenizer, saved as an HF
    directory (safetensors, f32). ``extra_tokens`` become added (not special) tokens, as Qwen3's <think>."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    tok = byte_level_tokenizer(merges)
    tok.add_tokens(list(extra_tokens))
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": chat_template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "add_bos_token": False,
    }))
    torch.manual_seed(seed)
    config_name, model_name, family_keys = FAMILY_CONFIGS[family]
    values = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tie,
        bos_token_id=tok.token_to_id("<|im_start|>"), eos_token_id=tok.token_to_id("<|im_end|>"),
    )
    values.update(family_keys)
    values.update(config)
    cfg = getattr(transformers, config_name)(**values)
    model = getattr(transformers, model_name)(cfg)
    with torch.no_grad():  # random init is tiny; widen it so logits are well separated
        for name, p in model.named_parameters():
            if p.dim() in (2, 3):  # (3: a mixture-of-experts model's stacked experts)
                p.normal_(0.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:  # not all ones: a wrong norm weight must show
                p.uniform_(0.5, 1.5)
            elif name.endswith(".sinks"):  # (GPT-OSS: large enough to take a share)
                p.normal_(0.0, 1.0)
            elif name.endswith((".act_fn.alpha_p", ".act_fn.alpha_n")):  # Apertus' xIELU
                p.uniform_(-0.5, 1.0)  # (a value a layer, none the initial one)
    model.save_pretrained(out, safe_serialization=True)
    return out


def to_bpe_files(hf_dir: Path) -> Path:
    """The directory's tokenizer as older repos (OPT's) ship it, in place: vocab.json and
    merges.txt, its added tokens listed in tokenizer_config.json, no tokenizer.json."""
    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(tokenizer["model"]["vocab"])
    added = {str(t["id"]): {"content": t["content"], "special": t["special"]}
             for t in tokenizer["added_tokens"]}
    vocab.update({t["content"]: int(i) for i, t in added.items()})
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    (hf_dir / "vocab.json").write_text(json.dumps(vocab))
    (hf_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "added_tokens_decoder": added}))
    (hf_dir / "tokenizer.json").unlink()
    return hf_dir


def to_torch_bin(hf_dir: Path) -> Path:
    """The directory's weights as older repos (OPT's) ship them, in place: one
    pytorch_model.bin written by torch.save from the model's state dict (a tied head saved as
    the embedding's own storage, as a module's state_dict holds it), no safetensors."""
    import torch
    from safetensors.torch import load_file

    file = hf_dir / "model.safetensors"
    state = load_file(str(file))
    embedding = next(k for k in state if k.endswith("embed_tokens.weight"))
    state.setdefault("lm_head.weight", state[embedding])
    torch.save(state, hf_dir / "pytorch_model.bin")
    file.unlink()
    return hf_dir


def to_exaone_names(hf_dir: Path) -> Path:
    """An EXAONE 3 directory's config as LG's checkpoints ship it, in place: ``num_layers``,
    ``layer_norm_epsilon`` and ``activation_function`` keys (transformers' attribute_map reads
    them back). Its weights need nothing: transformers saves them under the checkpoint's own
    names (``transformer.h.N.attn.attention.*``: its conversion mapping, reversed on save)."""
    config = json.loads((hf_dir / "config.json").read_text())
    for new, old in (("num_hidden_layers", "num_layers"), ("rms_norm_eps", "layer_norm_epsilon"),
                     ("hidden_act", "activation_function")):
        config[old] = config.pop(new)
    config["architectures"] = ["ExaoneForCausalLM"]
    (hf_dir / "config.json").write_text(json.dumps(config))
    return hf_dir


def to_multimodal(hf_dir: Path, kind: str) -> Path:
    """The directory's text model inside an image-and-text checkpoint of ``kind`` (Gemma 3's
    and Mistral 3's ForConditionalGeneration: a tiny vision tower and projector beside it,
    their config's text_config the text model's), saved by transformers in place."""
    import torch
    import transformers

    text_config = transformers.AutoConfig.from_pretrained(hf_dir)
    text = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    last = text_config.vocab_size - 1  # (image tokens: any ids, unused by text)
    if kind == "gemma3":
        vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=1, num_attention_heads=2,
                                                 image_size=28, patch_size=14)
        config = transformers.Gemma3Config(
            text_config=text_config.to_dict(), vision_config=vision.to_dict(),
            mm_tokens_per_image=1, image_token_index=last, boi_token_index=last - 1,
            eoi_token_index=last - 2, tie_word_embeddings=text_config.tie_word_embeddings)
        model = transformers.Gemma3ForConditionalGeneration(config)
    elif kind in ("qwen2_5_vl", "qwen3_vl"):
        return to_qwen_vl(hf_dir, kind, text_config, text)
    else:
        vision = transformers.PixtralVisionConfig(hidden_size=16, intermediate_size=32,
                                                  num_hidden_layers=1, num_attention_heads=2,
                                                  image_size=28, patch_size=14, head_dim=8)
        config = transformers.Mistral3Config(
            text_config=text_config.to_dict(), vision_config=vision.to_dict(),
            image_token_index=last, spatial_merge_size=1,
            tie_word_embeddings=text_config.tie_word_embeddings)
        model = transformers.Mistral3ForConditionalGeneration(config)
    save_around(model, text, hf_dir)
    return hf_dir


def save_around(model, text, hf_dir: Path) -> None:
    """An image-and-text model saved in place of the text model ``text`` it now holds."""
    import torch

    with torch.no_grad():
        model.model.language_model.load_state_dict(text.model.state_dict())
        model.lm_head.weight.copy_(text.lm_head.weight)
    (hf_dir / "model.safetensors").unlink()
    model.save_pretrained(hf_dir)


def to_qwen_vl(hf_dir: Path, kind: str, text_config, text) -> Path:
    """The directory's Qwen2/Qwen3 text model inside a Qwen2.5-VL or Qwen3-VL checkpoint,
    with each text token's three RoPE position streams split into sections (interleaved on
    Qwen3-VL). Qwen3-VL's as transformers saves it (text_config, model.language_model.);
    Qwen2.5-VL's as Qwen published theirs: the text keys at the config's top level with
    rope_scaling {"type": "mrope"}, the text model's own weight names beside visual.*."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    half = text_config.head_dim // 2 if getattr(text_config, "head_dim", None) else (
        text_config.hidden_size // text_config.num_attention_heads // 2)
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    last = text_config.vocab_size - 1
    values = {key: value for key, value in text_config.to_dict().items()
              if key not in ("model_type", "architectures", "transformers_version")}
    rope = {**values.pop("rope_parameters"), "mrope_section": sections}
    tokens = dict(image_token_id=last, video_token_id=last - 1, vision_start_token_id=last - 2,
                  vision_end_token_id=last - 3, tie_word_embeddings=text_config.tie_word_embeddings)
    if kind == "qwen3_vl":
        vision = transformers.Qwen3VLVisionConfig(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text_config.hidden_size,
            num_position_embeddings=16, deepstack_visual_indexes=[0])
        config = transformers.Qwen3VLConfig(
            text_config={**values, "rope_parameters": {**rope, "mrope_interleaved": True}},
            vision_config=vision.to_dict(), **tokens)
        model = transformers.Qwen3VLForConditionalGeneration(config)
    else:
        vision = transformers.Qwen2_5_VLVisionConfig(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=56,
            out_hidden_size=text_config.hidden_size, fullatt_block_indexes=[0])
        config = transformers.Qwen2_5_VLConfig(
            text_config={**values, "rope_parameters": rope}, vision_config=vision.to_dict(),
            **tokens)
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    save_around(model, text, hf_dir)
    if kind == "qwen2_5_vl":  # Qwen's published form
        file = hf_dir / "model.safetensors"
        renamed = {name.replace("model.language_model.", "model.", 1)
                   .replace("model.visual.", "visual.", 1): tensor
                   for name, tensor in load_file(str(file)).items()}
        save_file(renamed, str(file), metadata={"format": "pt"})
        saved = json.loads((hf_dir / "config.json").read_text())
        flat = {key: value for key, value in saved.items() if key != "text_config"}
        nested = {key: value for key, value in saved["text_config"].items()
                  if key not in ("model_type", "rope_parameters")}
        theta = saved["text_config"]["rope_parameters"]["rope_theta"]
        flat.update(nested, rope_theta=theta,
                    rope_scaling={"type": "mrope", "mrope_section": sections})
        (hf_dir / "config.json").write_text(json.dumps(flat, indent=2))
    return hf_dir


def to_bfloat16(hf_dir: Path) -> Path:
    """The directory's weights stored in bfloat16 (as most Hub checkpoints ship), in place."""
    import torch
    from safetensors.torch import load_file, save_file

    file = hf_dir / "model.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(str(file)).items()},
              str(file), metadata={"format": "pt"})
    return hf_dir


def to_mxfp4_grid(hf_dir: Path) -> Path:
    """A GPT-OSS directory's expert stacks rounded to MXFP4 (gguf-py's quantizer there and
    back, in blocks of 32 along each stack's input dimension, as a GGUF stores them), in place:
    a GGUF of them in MXFP4 holds the same values."""
    import gguf
    import torch
    from safetensors.torch import load_file, save_file

    file = hf_dir / "model.safetensors"
    tensors = load_file(str(file))
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    for name, w in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # (E, in, out)
            rows = w.transpose(1, 2).contiguous().numpy()
            exact = gguf.quants.dequantize(gguf.quants.quantize(rows, mxfp4), mxfp4)
            tensors[name] = torch.from_numpy(exact.reshape(rows.shape)).transpose(1, 2).contiguous()
    save_file(tensors, str(file), metadata={"format": "pt"})
    return hf_dir


# llama.cpp's tensor names (gguf-py tensor_mapping.py) for each family's HF modules
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",  # Qwen3, Gemma 3
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # Phi-3 keeps them fused
    # mixture-of-experts routers and shared experts (the experts: EXPERT_STACKS)
    "mlp.gate": "ffn_gate_inp", "block_sparse_moe.gate": "ffn_gate_inp",
    "block_sparse_moe.router.layer": "ffn_gate_inp",  # (Granite MoE's)
    "block_sparse_moe.output_linear": "ffn_down_exps",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
}
# an expert's projection -> llama.cpp's stack of them (TextModel / LlamaModel.modify_tensors:
# torch.stack over the experts, in their order)
EXPERT_STACKS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                 "down_proj": "ffn_down_exps", "w1": "ffn_gate_exps", "w3": "ffn_up_exps",
                 "w2": "ffn_down_exps"}
GEMMA_LAYER_NAMES = {  # Gemma 2/3: four norms per layer
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
OLMO2_LAYER_NAMES = {  # OLMo 2: the norms after each block only
    "post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm",
}
PHI2_LAYER_NAMES = {"self_attn.dense": "attn_output", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
GPT2_LAYER_NAMES = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": "attn_qkv",
                    "attn.c_proj": "attn_output", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
STARCODER2_LAYER_NAMES = {"mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # (and Arcee's)
EXAONE_LAYER_NAMES = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.attention.q_proj": "attn_q",
                      "attn.attention.k_proj": "attn_k", "attn.attention.v_proj": "attn_v",
                      "attn.attention.out_proj": "attn_output", "mlp.c_fc_0": "ffn_gate",
                      "mlp.c_fc_1": "ffn_up", "mlp.c_proj": "ffn_down"}
SEED_OSS_LAYER_NAMES = {"post_attention_layernorm": "post_attention_norm"}  # (gguf-py's)
HUNYUAN_LAYER_NAMES = {"self_attn.query_layernorm": "attn_q_norm",
                       "self_attn.key_layernorm": "attn_k_norm"}
ERNIE_MOE_LAYER_NAMES = {"mlp.shared_experts.gate_proj": "ffn_gate_shexp",
                         "mlp.shared_experts.up_proj": "ffn_up_shexp",
                         "mlp.shared_experts.down_proj": "ffn_down_shexp"}
GPT_OSS_LAYER_NAMES = {"post_attention_layernorm": "post_attention_norm",
                       "mlp.router": "ffn_gate_inp"}
GLM4_LAYER_NAMES = {"post_self_attn_layernorm": "post_attention_norm",
                    "post_mlp_layernorm": "post_ffw_norm"}
GPTNEOX_LAYER_NAMES = {"attention.query_key_value": "attn_qkv", "attention.dense": "attn_output",
                       "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}
APERTUS_LAYER_NAMES = {"attention_layernorm": "attn_norm", "feedforward_layernorm": "ffn_norm"}
FALCON_LAYER_NAMES = {"input_layernorm": "attn_norm", "ln_mlp": "attn_norm",  # (gguf-py's)
                      "ln_attn": "attn_norm_2", "self_attention.query_key_value": "attn_qkv",
                      "self_attention.dense": "attn_output", "mlp.dense_h_to_4h": "ffn_up",
                      "mlp.dense_4h_to_h": "ffn_down"}
# the architectures with LayerNorms (a bias beside each norm weight, llama.cpp's
# layer_norm_epsilon) and RoPE on part of each head (rope.dimension_count)
LAYER_NORM_ARCHS = ("stablelm", "phi2", "gptneox", "gpt2", "starcoder", "starcoder2", "command-r",
                    "cohere2", "nemotron", "falcon", "jais2")


# the architectures whose llama.cpp converter is LlamaModel's, q/k rows interleaved per head
LLAMA_PERMUTED = ("llama", "granite", "granitemoe", "smollm3", "arcee")


def write_gguf(hf_dir: Path, out: Path, arch: str = "llama", types: dict[str, str] = {},
               legacy_experts: bool = False) -> Path:
    """A tiny HF directory written as llama.cpp's ``convert_hf_to_gguf.py`` writes ``arch``
    (each architecture of tests/e2e/family_models.GGUF_CASES), read off its model classes:
    llama.cpp tensor names; Llama's (and Granite's, SmolLM3's) q/k rows interleaved per head;
    Granite's multipliers as its ``*_scale`` keys and Llama 3's RoPE scaling as per-frequency
    divisors (``rope_freqs.weight``); Gemma's and Nemotron's norms stored as 1 + w, Gemma's
    without an output tensor; YaRN as its rope.scaling keys; Phi-3's fused projections kept,
    its longrope factors as
    ``rope_factors_long/short`` tensors with the pretrained length and attention factor as
    keys; the LayerNorm families' epsilon, rotary dimensions and norm biases; StableLM's
    per-head q/k norms stacked into one tensor a layer; GPT-NeoX's per-head q/k/v regrouped;
    GPT-2's Conv1D weights transposed and GPT-2's own config names read; Command R's
    ``logit_scale``; the byte-level vocabulary as a "gpt2" tokenizer. ``types``: GGML types by
    tensor kind (``{"attn_v.weight": "Q8_0"}``), as a quantized file mixes them (Q4_K_M keeps
    attn_v and ffn_down wider); float32 otherwise. ``legacy_experts``: a mixture-of-experts
    model's experts one tensor each (``blk.N.ffn_up.E.weight``), as llama.cpp wrote them before
    it stacked them (April 2024)."""
    import math

    import gguf
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    cfg = json.loads((hf_dir / "config.json").read_text())
    if arch in ("gpt2", "starcoder"):  # GPT2Model/StarCoderModel read GPT-2's own names
        cfg.update(hidden_size=cfg["n_embd"], num_hidden_layers=cfg["n_layer"],
                   num_attention_heads=cfg["n_head"],
                   num_key_value_heads=1 if arch == "starcoder" else cfg["n_head"],
                   max_position_embeddings=cfg["n_positions"],
                   intermediate_size=4 * cfg["n_embd"], layer_norm_eps=cfg["layer_norm_epsilon"])
    weights = {k: v.to(torch.float32).numpy() for k, v in
               load_file(str(hf_dir / "model.safetensors")).items()}
    if arch == "falcon":  # FalconModel.set_gguf_parameters: 4 x the width, head_count_kv
        mq = cfg.get("multi_query", True) and not cfg.get("new_decoder_architecture")
        cfg.update(intermediate_size=4 * cfg["hidden_size"],
                   num_key_value_heads=1 if mq else cfg["num_kv_heads"])
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if arch in LAYER_NORM_ARCHS:
        writer.add_layer_norm_eps(cfg.get("layer_norm_eps") or cfg.get("norm_epsilon")
                                  or cfg.get("layer_norm_epsilon") or cfg["norm_eps"])
        partial = (cfg.get("partial_rotary_factor")
                   or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor"))
        if partial:  # (GPT-2 has no RoPE)
            writer.add_rope_dimension_count(int(head_dim * partial))
    else:
        writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:  # TextModel.set_gguf_parameters; Qwen2MoeModel's (Qwen3's) expert widths
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters
            writer.add_expert_feed_forward_length(cfg["intermediate_size"])
        if arch in ("qwen2moe", "qwen3moe"):
            writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
            if cfg.get("shared_expert_intermediate_size"):
                writer.add_expert_shared_feed_forward_length(
                    cfg["shared_expert_intermediate_size"])
    if arch == "ernie4_5-moe":  # Ernie4_5MoeModel.set_gguf_parameters (no end layer key)
        writer.add_expert_count(cfg["moe_num_experts"])
        writer.add_expert_used_count(cfg["moe_k"])
        writer.add_interleave_moe_layer_step(cfg["moe_layer_interval"])
        writer.add_leading_dense_block_count(cfg["moe_layer_start_index"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg["moe_num_shared_experts"]:
            writer.add_expert_shared_count(cfg["moe_num_shared_experts"])
            # (its converter's formula, whatever the shared experts' width)
            writer.add_expert_shared_feed_forward_length(cfg["intermediate_size"] // kv_heads)
    if arch == "jais2":  # Jais2Model: the whole head
        writer.add_rope_dimension_count(head_dim)
    if arch == "glm4":  # Glm4Model: RoPE on the first half of each head
        writer.add_rope_dimension_count(int(head_dim * cfg.get(
            "partial_rotary_factor", (cfg.get("rope_parameters") or {}).get(
                "partial_rotary_factor", 0.5))))
    if arch in ("command-r", "cohere2"):  # CommandR2Model, Cohere2Model
        writer.add_logit_scale(cfg["logit_scale"])
    if arch in ("stablelm", "gptneox"):  # (both converters write true where a config has none)
        writer.add_parallel_residual(bool(cfg.get("use_parallel_residual", True)))
    if "head_dim" in cfg:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' base
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if arch == "hunyuan-dense" and rope.get("rope_type") == "dynamic":
        # HunYuanModel.set_gguf_parameters: the NTK alpha folded into the base, no scaling
        theta *= rope.get("alpha", 50) ** (head_dim / (head_dim - 2))
    writer.add_rope_freq_base(theta)
    if cfg.get("sliding_window"):
        writer.add_sliding_window(cfg["sliding_window"])
        if arch == "olmo2":  # Olmo2Model (OLMo 3): which layers are windowed
            writer.add_sliding_window_pattern([t == "sliding_attention"
                                               for t in cfg["layer_types"]])
    if arch in ("qwen2vl", "qwen3vl"):  # Qwen2VLModel, Qwen3VLTextModel: mrope's sections
        half = head_dim // 2
        writer.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch in ("granite", "granitemoe"):  # GraniteModel's: the multipliers as *_scale
        writer.add_embedding_scale(cfg["embedding_multiplier"])
        writer.add_attention_scale(cfg["attention_multiplier"])
        writer.add_residual_scale(cfg["residual_multiplier"])
        writer.add_logit_scale(cfg["logits_scaling"])
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    vocab = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    specials = {t.content for t in tok.get_added_tokens_decoder().values()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if t in specials else 1 for t, _ in vocab])
    merges = json.loads(tok.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    writer.add_chat_template(CHATML)

    def interleave(w: np.ndarray, n: int) -> np.ndarray:  # llama.cpp's LlamaModel.permute
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    def add(name: str, w: np.ndarray) -> None:
        """A tensor in the GGML type ``types`` gives its name's last two parts (``attn_v.weight``),
        quantized by gguf-py as llama.cpp's quantizer does; else float32."""
        kind = types.get(".".join(name.split(".")[-2:]))
        if kind is None:
            writer.add_tensor(name, np.ascontiguousarray(w))
            return
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(w, np.float32), qtype),
                          raw_dtype=qtype)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight",
             "model.norm.bias": "output_norm.bias", "lm_head.bias": "output.bias",  # Phi-2's
             "model.final_layernorm.weight": "output_norm.weight",
             "model.final_layernorm.bias": "output_norm.bias",
             "gpt_neox.embed_in.weight": "token_embd.weight", "embed_out.weight": "output.weight",
             "gpt_neox.final_layer_norm.weight": "output_norm.weight",
             "gpt_neox.final_layer_norm.bias": "output_norm.bias",
             "transformer.wte.weight": "token_embd.weight",
             "transformer.wpe.weight": "position_embd.weight",
             "transformer.ln_f.weight": "output_norm.weight",
             "transformer.ln_f.bias": "output_norm.bias",
             "transformer.word_embeddings.weight": "token_embd.weight"}  # (Falcon's)
    layer = {**GGUF_LAYER_NAMES, **(GEMMA_LAYER_NAMES if arch in ("gemma2", "gemma3") else
                                    OLMO2_LAYER_NAMES if arch == "olmo2" else
                                    PHI2_LAYER_NAMES if arch == "phi2" else
                                    GPTNEOX_LAYER_NAMES if arch == "gptneox" else
                                    FALCON_LAYER_NAMES if arch == "falcon" else
                                    APERTUS_LAYER_NAMES if arch == "apertus" else
                                    GPT2_LAYER_NAMES if arch in ("gpt2", "starcoder") else
                                    STARCODER2_LAYER_NAMES if arch == "starcoder2" else
                                    GLM4_LAYER_NAMES if arch == "glm4" else
                                    GPT_OSS_LAYER_NAMES if arch == "gpt-oss" else
                                    EXAONE_LAYER_NAMES if arch == "exaone" else
                                    SEED_OSS_LAYER_NAMES if arch == "seed_oss" else
                                    HUNYUAN_LAYER_NAMES if arch == "hunyuan-dense" else
                                    ERNIE_MOE_LAYER_NAMES if arch == "ernie4_5-moe" else {})}
    head_norms: dict[str, list[np.ndarray]] = {}  # StableLM 12B's per-head q/k LayerNorms
    stacks: dict[str, dict[int, np.ndarray]] = {}  # each layer's experts of one projection
    xielu: dict[str, dict[int, float]] = {}  # Apertus' activation scalars, by layer
    for name, w in weights.items():
        if ".act_fn." in name:  # ApertusModel: per-layer arrays of keys, as stored
            xielu.setdefault(name.rsplit(".", 1)[1], {})[int(name.split(".")[2])] = float(
                w.reshape(-1)[0])
            continue
        if name.endswith("block_sparse_moe.input_linear.weight"):  # GraniteMoeModel: split
            i = name.split(".")[2]
            add(f"blk.{i}.ffn_gate_exps.weight", w[:, :cfg["intermediate_size"]])
            add(f"blk.{i}.ffn_up_exps.weight", w[:, cfg["intermediate_size"]:])
            continue
        if arch == "gpt-oss" and (".mlp.experts." in name or name.endswith(".sinks")):
            # GptOssModel.modify_tensors: the sinks as a weight; each stack (E, in, out) as
            # (E, out, in), gate|up's interleaved outputs (and biases) split: gate the even ones
            i, kind = name.split(".")[2], name.rsplit(".", 1)[1]
            if kind == "sinks":
                add(f"blk.{i}.attn_sinks.weight", w)
            elif kind in ("gate_up_proj", "gate_up_proj_bias"):
                w = w.swapaxes(1, 2) if kind == "gate_up_proj" else w
                suffix = "weight" if kind == "gate_up_proj" else "bias"
                add(f"blk.{i}.ffn_gate_exps.{suffix}", w[:, 0::2])
                add(f"blk.{i}.ffn_up_exps.{suffix}", w[:, 1::2])
            elif kind == "down_proj":
                add(f"blk.{i}.ffn_down_exps.weight", w.swapaxes(1, 2))
            else:
                add(f"blk.{i}.ffn_down_exps.bias", w)
            continue
        if ".experts." in name:  # stacked per layer and projection
            _, _, i, _, _, e, proj, _ = name.split(".")
            stacked = EXPERT_STACKS[proj]
            if legacy_experts:
                add(f"blk.{i}.{stacked.removesuffix('_exps')}.{e}.weight", w)
            else:
                stacks.setdefault(f"blk.{i}.{stacked}.weight", {})[int(e)] = w
            continue
        if name.endswith(".moe_statics.e_score_correction_bias"):  # (1, E) as exp_probs_b
            add(f"blk.{name.split('.')[2]}.exp_probs_b.bias", w.reshape(-1))
            continue
        if ".norms." in name:  # StableLMModel._stack_qk_norm: one (heads, head_dim) tensor
            module = name.split(".norms.")[0]
            head_norms.setdefault(module, []).append((int(name.split(".")[-2]), w))
            continue
        if arch.startswith("gemma") and name == "lm_head.weight":
            continue
        if (arch.startswith("gemma") or arch == "nemotron") and name.endswith("norm.weight"):
            w = w + 1.0  # Gemma's RMSNorm and Nemotron's LayerNorm1P multiply by 1 + w
        if name in names:
            add(names[name], w)
            continue
        _, _, i, *rest = name.split(".")
        module, kind = ".".join(rest[:-1]), rest[-1]
        if arch == "gpt2" and module in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            w = w.T  # GPT2Model: Conv1D's (in, out) stored as (out, in)
        if module == "attention.query_key_value":  # GPTNeoXModel: regrouped into q|k|v
            w = w.reshape(heads, 3, head_dim, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
        if module == "self_attention.query_key_value":  # FalconModel: per group -> q|k|v
            group = w.reshape(kv_heads, heads // kv_heads + 2, head_dim, *w.shape[1:])
            w = np.concatenate([group[:, :-2].reshape(-1, *w.shape[1:]),
                                group[:, -2].reshape(-1, *w.shape[1:]),
                                group[:, -1].reshape(-1, *w.shape[1:])])
        if arch in LLAMA_PERMUTED and module == "self_attn.q_proj":
            w = interleave(w, heads)
        elif arch in LLAMA_PERMUTED and module == "self_attn.k_proj":
            w = interleave(w, kv_heads)
        add(f"blk.{i}.{layer[module]}.{kind}", w)
    for stacked, by_expert in stacks.items():
        add(stacked, np.stack([by_expert[e] for e in sorted(by_expert)]))
    for scalar, by_layer in xielu.items():
        getattr(writer, f"add_xielu_{scalar}")([by_layer[i] for i in sorted(by_layer)])
    for module, heads_w in head_norms.items():
        _, _, i, _, which = module.split(".")
        add(f"blk.{i}.attn_{which[0]}_norm.weight", np.stack([w for _, w in sorted(heads_w)]))
    scaling = (rope if rope.get("rope_type") in ("llama3", "longrope", "yarn")
               else cfg.get("rope_scaling"))
    if scaling and scaling.get("rope_type") == "yarn":  # TextModel.set_gguf_parameters
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        attention = (writer.add_rope_scaling_attn_factors if arch == "olmo2"  # (Olmo2Model's)
                     else writer.add_rope_scaling_yarn_attn_factor)
        for key, add_key in (("attention_factor", attention),
                             ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                             ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):
            if scaling.get(key) is not None:
                add_key(scaling[key])
    elif arch == "phi3":  # Phi3MiniModel: rotary dims, pretrained length, longrope tensors
        rotary = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
        original = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        writer.add_rope_dimension_count(rotary)
        writer.add_rope_scaling_orig_ctx_len(original)
        if scaling:
            scale = cfg["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
            writer.add_tensor("rope_factors_long.weight",
                              np.array(scaling["long_factor"], dtype=np.float32))
            writer.add_tensor("rope_factors_short.weight",
                              np.array(scaling["short_factor"], dtype=np.float32))
    elif scaling:  # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, in numpy
        inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        factors = []
        low = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
        high = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < high:
                factors.append(1.0)
            elif wavelength > low:
                factors.append(scaling["factor"])
            else:
                s = (scaling["original_max_position_embeddings"] / wavelength
                     - scaling["low_freq_factor"]) / (scaling["high_freq_factor"]
                                                       - scaling["low_freq_factor"])
                factors.append(1 / ((1 - s) / scaling["factor"] + s))
        writer.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
