"""Shared fixtures: one WICK_HOME per test session (compiled artifacts and the SmolLM2 download
are cached there and reused by every test), a tiny random Llama built offline, the GPU backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Set before anything imports wick: the compile cache lives here for the whole session.
os.environ.setdefault("WICK_HOME", str(ROOT / ".wick-test-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def wick_home() -> Path:
    return Path(os.environ["WICK_HOME"])


@pytest.fixture(scope="session")
def backend():
    """The native wgpu backend (lavapipe on CI)."""
    from wick.native.wgpu_backend import WgpuBackend

    return WgpuBackend.create()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A random 2-layer Llama (GQA, untied head) saved as an HF directory."""
    from tests.tiny_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def compiled():
    """compiled(model, quantization, **options) -> artifact dir, cached for the session."""
    from wick.compiler.compile import compile_model

    cache: dict = {}

    def get(model: str, quantization: str, **options) -> Path:
        key = (str(model), quantization, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = compile_model(str(model), quantization, **options)
        return cache[key]

    return get
