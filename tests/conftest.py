"""Shared fixtures: one WICK_HOME per test session (compiled artifacts and the SmolLM2 download
are cached there and reused by every test), a tiny random Llama built offline, the GPU backend."""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Set before anything imports wick: the compile cache lives here for the whole session.
os.environ.setdefault("WICK_HOME", str(ROOT / ".wick-test-cache"))
# ... and the kernel builds, for a test's compile into a WICK_HOME of its own too
os.environ.setdefault("WICK_KERNEL_CACHE", str(Path(os.environ["WICK_HOME"]) / "kernel-builds"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# scripts/test.sh (the README's test command, and CI) sets it: there a test whose tools
# (node and npm, Chromium, playwright) are missing fails, since the setup installs them
REQUIRE_TOOLS = os.environ.get("WICK_REQUIRE_TOOLS") == "1"


def tool_missing(reason: str) -> None:
    """Skip the test for a missing tool, or, where every tool must be there, fail it."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{reason} (WICK_REQUIRE_TOOLS=1: scripts/setup.sh --test installs it)")
    pytest.skip(reason)


def wick_process_env(**extra: str) -> dict[str, str]:
    """The environment of a wick process a test starts (the CLI, `wick serve`): this one's,
    with torch unimportable (tests/no_torch/sitecustomize.py), as in a user's install."""
    path = os.pathsep.join(filter(None, [str(ROOT / "tests" / "no_torch"),
                                         os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


# ------------------------------------------------------------------ two workers (pytest-xdist)
# scripts/test.sh runs the suite on two workers (`-n 2 --dist loadscope`). A module's tests stay
# on one worker (its module fixtures: one browser, one compile, one server); modules that start
# Ray share a group, so no two Ray clusters run at once. The workers share WICK_HOME: a compile
# takes the build lock there, so a second worker asking for the same artifact waits and reuses it.
ONE_WORKER_GROUPS = {"tests/server/test_replicas.py": "ray"}
# the longest groups start first, about longest first (a CI run's per-module times): the run's
# last minutes are then short modules on both workers, not one long module on one while the
# other idles (a 41 s module handed out last left a worker idle for a minute). Gemma's browser
# module comes soon after its e2e module (the artifact they share is compiled once: the build
# lock makes the other worker wait for it).
LONGEST_FIRST = ("ray", "tests/e2e/test_gemma3_270m.py", "tests/browser/test_gemma3.py",
                 "tests/e2e/test_qwen25.py", "tests/e2e/test_quantized.py",
                 "tests/server/test_cli.py", "tests/browser/test_extension.py",
                 "tests/browser/test_build_and_routes.py", "tests/e2e/test_families.py",
                 "tests/browser/test_engine.py", "tests/browser/test_wasm.py",
                 "tests/e2e/test_batch_invariance.py", "tests/e2e/test_tiny_parity.py",
                 "tests/e2e/test_embeddings.py", "tests/native/test_cuda_backend.py",
                 "tests/browser/test_loading.py", "tests/server/test_api.py",
                 "tests/compiler/test_cpu_attention.py", "tests/e2e/test_real_shapes.py",
                 "tests/e2e/test_speculative_real.py", "tests/browser/test_embeddings.py",
                 "tests/compiler/test_cpu_sampling_kernels.py", "tests/browser/test_export.py")


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: absent without it)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with our groups: the module, or its ONE_WORKER_GROUPS
        group, the LONGEST_FIRST ones handed out first. (xdist's own loadgroup marks are not
        read by pytest 9.2, which keeps node ids elsewhere.)"""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return ONE_WORKER_GROUPS.get(module, module)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                for scope in reversed(LONGEST_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self.ordered = True
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


@contextmanager
def file_lock(path: Path):
    """An exclusive lock between the workers (and any other process) on ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# this run's id (the same in every worker; a fresh --basetemp-less root is per run anyway)
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", "run")


def run_temp(tmp_path_factory) -> Path:
    """This run's temporary root: under pytest-xdist, the folder of every worker's basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make) -> Path:
    """``make(path)`` run once per test run for every worker: the same directory (so its
    compiles share one cache entry and one recorded source)."""
    root = run_temp(tmp_path_factory)
    path, made = root / name, root / f".{name}.{RUN}.made"
    with file_lock(root / f".{name}.lock"):
        if not made.exists():
            shutil.rmtree(path, ignore_errors=True)
            assert make(path) == path
            made.touch()
    return path


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

    return made_once(tmp_path_factory, "tiny-llama0", make_tiny_llama)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The built-in SmolLM2-135M-Instruct GGUF."""
    from wick.compiler.sources import resolve_source

    return resolve_source("smollm2-135m-instruct").path


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The built-in all-MiniLM-L6-v2 (an HF directory); skips where it cannot be fetched."""
    from wick.compiler.sources import resolve_source

    try:
        return resolve_source("all-minilm-l6-v2").path
    except Exception as err:  # noqa: BLE001 - no registry here
        pytest.skip(f"all-minilm-l6-v2 could not be fetched: {err}")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_path):
    """transformers' SmolLM2 from the same GGUF (dequantized to float32), loaded once for the
    browser and end-to-end tests."""
    from tests.e2e.helpers import load_hf

    return load_hf(smollm2_path.parent, gguf_file=smollm2_path.name)


# The tiny Llama's small build (context 128, chunks of 64, 4 sequences): the browser tests'
# model and the native backend tests' (tests/native), each variant compiled once per session.
TINY_SMALL = {"context_window": 128, "prefill_chunk_size": 64, "max_batch_size": 4}
TINY_SHARD_BYTES = 96 << 10  # several shards: per-shard caching, resuming, deferred uploads


@pytest.fixture(scope="session")
def tiny_artifact(tiny_llama_dir, compiled) -> Path:
    """The tiny Llama in q0f32, small build, in several shards."""
    return compiled(tiny_llama_dir, "q0f32", shard_max_bytes=TINY_SHARD_BYTES, **TINY_SMALL)


@pytest.fixture(scope="session")
def tiny_f16_artifact(tiny_llama_dir, compiled) -> Path:
    """The same model as q4f16_1 (SwiftShader has no shader-f16: the browser must refuse it)."""
    return compiled(tiny_llama_dir, "q4f16_1", **TINY_SMALL)


@pytest.fixture(scope="session")
def tiny_long_artifact(tmp_path_factory, compiled) -> Path:
    """A tiny Llama with a 2048-token window, q0f32, up to 8 sequences: room for a
    tool-calling system prompt (~800 byte tokens). The structured-output tests' model, in the
    browser (tests/browser) and through the REST API (tests/server): one compile for both."""
    from tests.tiny_models import make_tiny_llama

    src = make_tiny_llama(tmp_path_factory.mktemp("tiny-long") / "tiny-llama-long", seed=3,
                          context=2048)
    return compiled(src, "q0f32", context_window=2048, max_batch_size=8)


@pytest.fixture(scope="session")
def compiled():
    """compiled(model, quantization, kernel_sets=None, **options) -> artifact dir, cached for
    the session; ``kernel_sets`` as compile_model's (None: every one). An artifact compiled
    with more sets (same options) serves a request for fewer."""
    from wick.compiler.compile import compile_model

    cache: dict = {}  # (model, quantization, options) -> [(its kernel sets or None, dir)]

    def get(model: str, quantization: str, kernel_sets=None, **options) -> Path:
        key = (str(model), quantization, tuple(sorted(options.items())))
        want = None if kernel_sets is None else set(kernel_sets)
        for have, art_dir in cache.get(key, []):
            if have is None or (want is not None and want <= have):
                return art_dir
        art_dir = compile_model(str(model), quantization, kernel_sets=kernel_sets, **options)
        cache.setdefault(key, []).append((want, art_dir))
        return art_dir

    return get
