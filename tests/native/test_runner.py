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
    # the compiler names the variant of the same weights that runs without it
    assert art.fallback_variants == ["q4f32_1"]
    with pytest.raises(MissingFeatureError) as err:
        Runner(art, _NoF16Backend(), num_pages=4)
    assert err.value.feature == "shader-f16"
    assert err.value.working_variants == ["q4f32_1"]
    assert err.value.message.endswith("which this device lacks; use q4f32_1 instead.")


def test_kernel_sets_have_one_shape_and_one_loader(tiny_artifact):
    """Every kernel set is ``kernel_sets[kind]`` with a form the loader knows, and its files
    (``kernel_files``) are all there; a set the artifact lacks, a form this wick does not know
    and an artifact of another format are refused with what to do."""
    import json

    from wick.engine.artifact import FORMS, WASM_KINDS, kernel_files
    from wick.engine.errors import ArtifactError
    from wick.engine.plan import load_kernel_set

    art = _artifact(tiny_artifact)
    sets = art.manifest["kernel_sets"]
    assert {"webgpu", "cpu", "wasm", "wasm_threads", "wasm_relaxed",
            "wasm_threads_relaxed"} <= set(sets)
    assert {kind: s["form"] for kind, s in sets.items() if kind != "cuda"} == {
        "webgpu": "shaders", "cpu": "library", **dict.fromkeys(WASM_KINDS, "library")}
    assert all(s["form"] in FORMS for s in sets.values())
    for s in sets.values():
        for f in kernel_files(s):
            assert (tiny_artifact / f["file"]).is_file() and len(f["sha256"]) == 64
    assert len(kernel_files(sets["webgpu"])) == len(sets["webgpu"]["kernels"]) > 1
    assert not {"kernels", "tir_functions", "cpu_kernels", "wasm_kernels"} & set(art.manifest)

    class Kind:  # a backend of a kind the artifact has no set for
        kind = "metal"

    with pytest.raises(ArtifactError, match="has no metal kernels.*wick compile --force") as e:
        art.kernel_set("metal")
    assert e.value.code == "artifact_stale"
    with pytest.raises(ArtifactError, match="has no metal kernels"):
        load_kernel_set(art, Kind(), set())
    odd = json.loads(json.dumps(art.manifest))
    odd["kernel_sets"]["metal"] = {"form": "bitcode", "file": "k.bc", "sha256": "0" * 64}
    with pytest.raises(ArtifactError, match="unknown form 'bitcode'"):
        load_kernel_set(Artifact(odd, art.read, "x"), Kind(), set())
    older = {**art.manifest, "format": 1}
    with pytest.raises(ArtifactError, match="has format 1, this wick reads format 2: recompile"):
        Artifact(older, art.read, "old")


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

    def counting_run(writes, dispatches, reads, step=None):
        runs.append((len(dispatches), step, [id(d) for d in dispatches]))
        return real_run(writes, dispatches, reads, step)

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
    assert all(n > 10 for n, _, _ in runs)
    # steps of the same shape reuse the dispatch list built the first time
    assert len(runner.decode._cache) <= 2 and len(runner.forward._cache) == 1
    # each step names itself: the plans it ran (prefill, then decode1) and their signatures;
    # the same key brought the same dispatch objects, another key other dispatches
    keys = [step for _, step, _ in runs]
    assert [[name for name, _ in k] for k in keys] == [["forward", "sample"]] + [
        ["decode1", "sample"]] * 5
    assert len(set(keys[1:])) == 1 and keys[0] != keys[1]
    assert all(ids == runs[1][2] for _, _, ids in runs[1:]) and runs[0][2] != runs[1][2]


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
