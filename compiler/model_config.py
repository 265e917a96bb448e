"""The sanity of a model's config, checked as its source is read (before its weights are): a
damaged or mistyped config.json (``num_hidden_layers: 1e9``, ``hidden_size: -4``) is named
as such, instead of failing later in a way that blames the weights file. No TVM here: the
sources import it."""

from __future__ import annotations

from typing import Any

from ..engine.errors import WickError


class InvalidConfig(WickError):
    """A value in the model's config that no model has (a negative size, a billion layers):
    the config is damaged or hand-edited; the message names the field."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "invalid_model_config"


class UnsupportedConfig(WickError):
    """The checkpoint's config (or the asked quantization) needs something this family does
    not implement; the message says what, and what works instead where something does."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "unsupported_model"


# (field, lowest, highest): far beyond any published model, so that only a damaged config
# (or a typo) fails here, not when its weights do not match
CONFIG_BOUNDS = (("vocab_size", 1, 1 << 24), ("hidden_size", 1, 1 << 16),
                 ("intermediate_size", 1, 1 << 20), ("num_hidden_layers", 1, 1024),
                 ("num_attention_heads", 1, 1024), ("num_key_value_heads", 1, 1024),
                 ("head_dim", 1, 1024), ("max_position_embeddings", 1, 1 << 24),
                 ("sliding_window", 1, 1 << 24))


def check_config(hf: dict[str, Any], where: str = "the model's config") -> None:
    """Refuse values no model has, naming ``where`` and the field: sizes are whole numbers
    within ``CONFIG_BOUNDS``, the attention heads a multiple of the key/value heads, epsilons
    and RoPE bases positive. Checked as a source is read, before its weights are."""
    def bad(name: str, rule: str) -> InvalidConfig:
        return InvalidConfig(f"{where}: '{name}' is {hf[name]!r}; it must be {rule}. The "
                             "config is damaged or was edited by mistake.")

    for name, low, high in CONFIG_BOUNDS:
        value = hf.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not float(value).is_integer() or not low <= value <= high:
            raise bad(name, f"a whole number from {low} to {high}")
    heads, kv = hf.get("num_attention_heads"), hf.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise bad("num_key_value_heads", f"a divisor of num_attention_heads ({heads})")
    for name in ("rms_norm_eps", "rope_theta"):
        value = hf.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < float("inf")):
            raise bad(name, "a positive number")
    if hf.get("hidden_size") and heads and not hf.get("head_dim") and hf["hidden_size"] < heads:
        raise bad("hidden_size", f"at least num_attention_heads ({heads})")
