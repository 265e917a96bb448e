"""Which layers are windowed and which rotate (RoPE), per family config, against transformers'
own configs of the same values (its ``layer_types`` / ``no_rope_layers``, the lists its layers
read)."""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")


def _hf(**values):
    return {"num_hidden_layers": 8, "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
            "max_position_embeddings": 8192, **values}


@pytest.mark.parametrize("values", [
    {"sliding_window": 32, "sliding_window_pattern": 4},
    {"sliding_window": 32, "sliding_window_pattern": 3},
    {"sliding_window": None},
    {},  # (no key: transformers' 4096, hybrid)
])
def test_exaone4_windows_and_nope_layers_are_transformers(values):
    """EXAONE 4: the windowed layers are those transformers marks sliding; a hybrid model's
    global layers skip RoPE (its attention: ``sliding_window is None or is_sliding``)."""
    from transformers import Exaone4Config

    from wick.compiler.models.exaone4 import Config

    hf = _hf(**values)
    window = values.get("sliding_window", 4096)
    want = [t == "sliding_attention" for t in Exaone4Config(**hf).layer_types] \
        if window else [False] * 8
    c = Config.from_hf(hf)
    assert c.extra["sliding"] == want and c.sliding_window == window
    assert c.extra["rope"] == [window is None or s for s in want]
    specs = [c.attention(i, "float32") for i in range(8)]
    assert [s.window is not None for s in specs] == want
    assert [s.rope for s in specs] == c.extra["rope"]


def test_exaone4_string_pattern_repeats_and_ends_global():
    from wick.compiler.models.exaone4 import sliding_layers

    got = sliding_layers(_hf(num_hidden_layers=6, sliding_window=32,
                             sliding_window_pattern="LLG"))
    assert got == [True, True, False, True, True, False]
    got = sliding_layers(_hf(num_hidden_layers=5, sliding_window=32,
                             sliding_window_pattern="LLLG"))
    assert got == [True, True, True, False, False]  # (the last layer global)


@pytest.mark.parametrize("values", [{}, {"no_rope_layer_interval": 3},
                                    {"no_rope_layers": [1, 0, 1, 1, 0, 1, 1, 1]}])
def test_smollm3_nope_layers_are_transformers(values):
    from transformers import SmolLM3Config

    from wick.compiler.models.smollm3 import Config

    hf = _hf(**values)
    want = [bool(v) for v in SmolLM3Config(**hf).no_rope_layers]
    c = Config.from_hf(hf)
    assert [c.attention(i, "float32").rope for i in range(8)] == want
    assert not any(c.extra["sliding"])  # (no use_sliding_window)
