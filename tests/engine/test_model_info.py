from __future__ import annotations

import pytest

from wick.engine import ArtifactError, ModelInfo

MANIFEST = {
    "model_id": "SmolLM2-135M-Instruct",
    "quantization": "q4f16_1",
    "model": {
        "family": "llama", "vocab_size": 49152, "context_window": 8192, "page_size": 16,
        "prefill_chunk_size": 2048, "max_batch_size": 32, "bos_token_id": 1,
        "eos_token_ids": [2], "add_bos_token": False, "chat_template": "{{ x }}",
    },
}


def test_from_manifest_reads_every_field():
    info = ModelInfo.from_manifest(MANIFEST)
    assert info == ModelInfo(
        model_id="SmolLM2-135M-Instruct", quantization="q4f16_1", family="llama",
        vocab_size=49152, context_window=8192, page_size=16, prefill_chunk_size=2048,
        max_batch_size=32, bos_token_id=1, eos_token_ids=(2,), add_bos_token=False,
        chat_template="{{ x }}",
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"vocab_size": None}, "model.vocab_size"),
        ({"eos_token_ids": [50000]}, "eos_token_ids"),
        ({"page_size": 0}, "page_size"),
        ({"add_bos_token": "yes"}, "add_bos_token"),
        ({"chat_template": 3}, "chat_template"),
    ],
)
def test_bad_manifest_names_the_key(change, words):
    bad = {**MANIFEST, "model": {**MANIFEST["model"], **change}}
    with pytest.raises(ArtifactError) as e:
        ModelInfo.from_manifest(bad)
    assert words in e.value.message and "wick-artifact.json" in e.value.message


def test_missing_key():
    model = dict(MANIFEST["model"])
    del model["family"]
    with pytest.raises(ArtifactError) as e:
        ModelInfo.from_manifest({**MANIFEST, "model": model})
    assert e.value.code == "artifact_missing_key" and "'model.family'" in e.value.message
