"""Model families. Each family module exposes ``Config.from_hf(dict)``, ``Model(config, quant,
target)`` with ``forward(*step_inputs, *kv_pages)`` and ``forward_spec()``, and
``convert_weights(config, hf_weights) -> {param name: array}`` (unquantized)."""

from . import llama

FAMILIES = {"llama": llama}
HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "smollm": "llama"}


def family_for(model_type: str):
    try:
        return FAMILIES[HF_MODEL_TYPES[model_type]]
    except KeyError:
        raise ValueError(
            f"model type {model_type!r} is not supported yet; supported: {', '.join(sorted(HF_MODEL_TYPES))}"
        ) from None
