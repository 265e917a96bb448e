"""Model families, one module each. A family module provides:

- ``NAME`` (written to the manifest), ``HF_MODEL_TYPES`` (config.json ``model_type`` values it
  reads) and ``GGUF_ARCHITECTURES`` (``general.architecture`` values);
- ``GGUF_LAYER_NAMES``: llama.cpp tensor names of a layer -> HF names, beyond the common ones
  (``gguf_source.COMMON_LAYER_NAMES``); ``GGUF_PERMUTED_QK``: whether llama.cpp's converter
  interleaved the q/k rows (Llama only);
- ``LAYER_NORMS`` (optional): a layer's norm weights when the first is not
  ``input_layernorm`` (OLMo 2 norms after each block only);
- ``gguf_config(key, tensors)`` (optional): config.json keys read from the GGUF metadata beyond
  the common ones (``key(name, default)`` reads ``<arch>.<name>``; ``tensors``: the file's
  tensor names, where only their presence tells, as StableLM's q/k/v biases);
- ``GGUF_GLOBAL_NAMES`` (optional): llama.cpp names of tensors outside the layers -> HF names,
  beyond the common ones (GPT-2's learned positions). A bias neither table lists is named after
  its weight's module (gguf_source.listed_name);
- ``Config.from_hf(dict)``, ``Model(config, quant, target, max_param_bytes=...)`` with
  ``forward(*step inputs, kv_pages)`` and ``forward_spec()``, and
  ``convert_weights(config, hf_weights) -> {param name: array}`` (unquantized).

Most families are ``decoder.DecoderForCausalLM`` configured, with one piece overridden; ``bert``
is an encoder. A model whose ``task`` is ``"embed"`` (BERT, or a decoder with
sentence-transformers pooling files) returns pooled vectors (compiler/models/pooling.py).
"""

from types import ModuleType

from . import (apertus, arcee, bert, cohere, cohere2, ernie4_5, ernie4_5_moe, exaone, exaone4, falcon, gemma,
               gemma2, gemma3, glm, glm4, gpt2, gpt_oss, gpt_bigcode, gpt_neox, gptj, granite, granitemoe,
               helium, hunyuan,
               jais2, llama, ministral, mistral, mixtral, nemotron, olmo, olmo2, olmo3, olmoe,
               opt, phi, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, seed_oss, smollm3, stablelm, starcoder2)

FAMILIES: dict[str, ModuleType] = {m.NAME: m for m in (
    llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3, granite, smollm3, olmo2, olmo3,
    ernie4_5, exaone4, stablelm, phi, gpt_neox, gpt2, gpt_bigcode, starcoder2, cohere, cohere2,
    opt, nemotron, glm, glm4, seed_oss, arcee, helium, exaone, ministral, olmo, gptj, falcon,
    apertus, jais2, mixtral, qwen2_moe, qwen3_moe, olmoe, granitemoe, ernie4_5_moe, gpt_oss, hunyuan, bert)}
HF_MODEL_TYPES = {t: m for m in FAMILIES.values() for t in m.HF_MODEL_TYPES}
GGUF_ARCHITECTURES = {a: m for m in FAMILIES.values() for a in m.GGUF_ARCHITECTURES}


def family_for(model_type: str) -> ModuleType:
    """The family of a config.json ``model_type``."""
    try:
        return HF_MODEL_TYPES[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type!r} is not supported yet; supported: "
                         f"{', '.join(sorted(HF_MODEL_TYPES))}") from None


def family_for_gguf(architecture: str) -> ModuleType | None:
    return GGUF_ARCHITECTURES.get(architecture)
