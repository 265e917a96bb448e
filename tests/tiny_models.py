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


def byte_level_tokenizer():
    """A byte-level BPE tokenizer with no merges (every byte is a token) plus ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
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
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "query_pre_attn_scalar": 24,
                                                     "pad_token_id": 0}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 32, "query_pre_attn_scalar": 24,
                                                         "pad_token_id": 0}),
}


def make_tiny_model(out: Path, family: str = "llama", *, seed: int = 0, layers: int = 2,
                    tie: bool = False, context: int = 512, extra_tokens: list[str] = (),
                    chat_template: str = CHATML, **config) -> Path:
    """A random ``family`` model of 2..6 layers with the byte-level tokenizer, saved as an HF
    directory (safetensors, f32). ``extra_tokens`` become added (not special) tokens, as Qwen3's <think>."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    tok = byte_level_tokenizer()
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
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:  # not all ones: a wrong norm weight must show
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out, safe_serialization=True)
    return out
