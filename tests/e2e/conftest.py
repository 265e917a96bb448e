"""Fixtures of the end-to-end tests: compiled tiny models and SmolLM2, their engine cores (one
runner per artifact for the whole session) and the transformers references."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import SMOLLM2, load_hf, make_core

TINY_OPTIONS = {"prefill_chunk_size": 128, "max_batch_size": 8}
# the kernel set lavapipe runs (make_core's default backend): what an artifact no other test
# runs elsewhere is compiled with (without the CPU's and WebAssembly's LLVM builds and CUDA's
# lowering, a tiny model compiles in half the time)
WEBGPU_ONLY = ("webgpu",)
CPU_ONLY = ("cpu",)  # (the CPU backend's: SmolLM2's 4-bit variants, Qwen2.5)


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory):
    from tests.tiny_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-tied"), seed=1, tie=True)


@pytest.fixture(scope="session")
def tiny_deep_dir(tmp_path_factory):
    from tests.tiny_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-deep"), seed=2, layers=6)


@pytest.fixture(scope="session")
def tiny_hf(tiny_llama_dir):
    return load_hf(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_core(tiny_llama_dir, compiled):
    """EngineCore over the tiny untied 2-layer Llama, q0f32, 64 KV pages."""
    return make_core(compiled(tiny_llama_dir, "q0f32", **TINY_OPTIONS), num_pages=64)


# smollm2_path, smollm2_hf (transformers' SmolLM2): tests/conftest.py, shared with the browser tests


@pytest.fixture(scope="session")
def smollm2_cpu_core(compiled):
    """SmolLM2 q0f32 on the CPU kernel set, 128 KV pages: for tests of the engine's logic on a
    real model (the WGSL kernels run on the tiny models); take a sibling_core of it to change
    core options."""
    from wick.native.cpu_backend import CpuBackend

    return make_core(compiled(SMOLLM2, "q0f32"), CpuBackend.create(), num_pages=128)


@pytest.fixture(scope="session")
def hub_models(tmp_path_factory):
    """The stand-in Hub with two families' tiny models as hf:// repos (family_models.py)."""
    from tests.e2e.family_models import hub_with_family_models

    hub = hub_with_family_models(tmp_path_factory.mktemp("hub-models"))
    yield hub
    hub.close()


@pytest.fixture(scope="session")
def compiled_from_hub(hub_models, compiled):
    """compiled_from_hub(key) -> the artifact of HUB_REPOS[key], fetched through
    huggingface_hub from the stand-in Hub and compiled (q0f32, TINY_OPTIONS) once."""
    from tests.e2e.family_models import HUB_REPOS
    from tests.hub_standin import using

    def get(key: str):
        with using(hub_models, hub_models.cache):
            return compiled(f"hf://{HUB_REPOS[key]}", "q0f32", **TINY_OPTIONS)

    return get
