"""The manifest's model.sampling_defaults: a checkpoint's generation_config.json, else the
built-in registry's model card (compiler/compile.py ``_sampling_section``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tvm")

from wick.compiler.compile import _sampling_section  # noqa: E402
from wick.compiler.hf_source import load_config  # noqa: E402
from wick.compiler.sources import builtin_models  # noqa: E402


def test_a_checkpoints_generation_config_gives_them(tmp_path):
    from tests.tiny_models import make_tiny_llama

    path = make_tiny_llama(tmp_path / "m", seed=4)
    gen = json.loads((path / "generation_config.json").read_text()) if (
        path / "generation_config.json").is_file() else {}
    (path / "generation_config.json").write_text(json.dumps(
        {**gen, "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    hf = load_config(path)
    assert _sampling_section(str(path), hf) == {
        "values": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
        "source": "generation_config.json"}


def test_a_gguf_builtin_gets_its_model_card():
    card = builtin_models()["smollm2-135m-instruct"]["sampling"]
    assert card == {"temperature": 0.2, "top_p": 0.9}  # (SmolLM2-Instruct's model card)
    assert _sampling_section("smollm2-135m-instruct", {}) == {
        "values": card, "source": "model card, wick's registry"}
    assert _sampling_section("/some/file.gguf", {}) is None
