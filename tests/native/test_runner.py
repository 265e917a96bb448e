"""The Runner on the native backend: feature checks, one submit per step, cached plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from wick.engine import EngineAPI, ModelInfo
from wick.engine.artifact import Artifact
from wick.engine.errors import MissingFeatureError
from wick.engine.runner import Runner
from wick.native.tokenizer import HFTokenizer


def _artifact(path: Path) -> Artifact:
    return Artifact.load(lambda p: (path / p).read_bytes(), str(path))


class _NoF16Backend:
    """Stands in for a device without shader-f16: the Runner must refuse before using it."""

    name = "test device without shader-f16"
    features = frozenset({"subgroups"})
    max_storage_binding = 128 << 20
    max_buffer_size = 256 << 20
    storage_offset_alignment = 256

    def __getattr__(self, item):
        raise AssertionError(f"the runner used the device ({item}) before checking features")


def test_f16_artifact_on_device_without_shader_f16_names_working_variants(tiny_f16_artifact):
    art = _artifact(tiny_f16_artifact)
    assert art.required_features == ["shader-f16"]
    with pytest.raises(MissingFeatureError) as err:
        Runner(art, _NoF16Backend(), num_pages=4)
    assert err.value.feature == "shader-f16"
    assert "q4f32_1" in err.value.message and "q0f32" in err.value.message


def test_engine_picks_f32_variant_and_rejects_f16_without_feature():
    from wick.compiler.compile import default_quantization
    from wick.server.local import _check_feature

    assert default_quantization("smollm2-135m-instruct") == "q4f16_1"
    # f16 overflows; its Q4_K_M keeps most tensors wider than 4 bits (tests/e2e/test_gemma3_270m.py)
    assert default_quantization("gemma-3-270m") == "q4f32_m"
    with pytest.raises(MissingFeatureError, match="q4f32_1"):
        _check_feature("q0f16", set())
    _check_feature("q4f32_1", set())  # no error
    from wick.server.local import pick_quantization

    assert pick_quantization("smollm2-135m-instruct", None, set()) == "q4f32_1"
    assert pick_quantization("smollm2-135m-instruct", None, {"shader-f16"}) is None  # its own
    assert pick_quantization("gemma-3-270m", None, set()) == "q4f32_m"


def test_one_submit_per_engine_step_and_dispatch_lists_are_reused(tiny_artifact, backend):
    art = _artifact(tiny_artifact)
    runner = Runner(art, backend, num_pages=16)
    runs = []
    real_run = backend.run

    def counting_run(writes, dispatches, reads):
        runs.append(len(dispatches))
        return real_run(writes, dispatches, reads)

    backend.run = counting_run
    try:
        api = EngineAPI.from_runner(runner, HFTokenizer(art.tokenizer_json()),
                                    ModelInfo.from_manifest(art.manifest), num_pages=16)
        steps = []
        real_step = runner.step
        runner.step = lambda batch: steps.append(batch) or real_step(batch)
        r = api.completions.create(prompt="hello world", max_tokens=6, temperature=0)
        assert r.usage.completion_tokens == 6
    finally:
        backend.run = real_run
    # one backend call per engine step, each with the whole model's kernels in it
    assert len(runs) == len(steps) == 6
    assert all(n > 10 for n in runs)
    # steps of the same shape reuse the dispatch list built the first time
    assert len(runner.decode._cache) <= 2 and len(runner.forward._cache) == 1


def test_deferred_weights_filled_from_placements_equal_uploaded(tiny_artifact, backend):
    """upload_weights=False (the browser's path) writes nothing: the placements cover every
    parameter byte once, and filling them from the shard files gives the uploaded runner's tokens."""
    path = tiny_artifact  # (in shards of 96 KiB)
    art = _artifact(path)
    assert len(art.manifest["shards"]) > 1

    def generate(runner: Runner) -> list[int]:
        api = EngineAPI.from_runner(runner, HFTokenizer(art.tokenizer_json()),
                                    ModelInfo.from_manifest(art.manifest), num_pages=16)
        return api.completions.create(prompt="hello world", max_tokens=6, temperature=0).choices[0].text

    uploaded = Runner(art, backend, num_pages=16)
    writes = []
    real_write = backend.write
    backend.write = lambda buffer, offset, data: writes.append(buffer) or real_write(buffer, offset, data)
    try:
        deferred = Runner(art, backend, num_pages=16, upload_weights=False)
    finally:
        backend.write = real_write
    assert writes == []  # no weight passed through the engine
    placements = deferred.weight_placements
    assert sorted((w.shard, w.offset, w.nbytes) for w in placements) == sorted(
        (p.shard, p.offset, p.nbytes) for p in art.params)
    assert len({w.buffer for w in placements}) == len(art.params)
    for w in placements:
        shard = (path / art.manifest["shards"][w.shard]["file"]).read_bytes()
        backend.write(w.buffer, 0, shard[w.offset:w.offset + w.nbytes])
    assert generate(deferred) == generate(uploaded)
