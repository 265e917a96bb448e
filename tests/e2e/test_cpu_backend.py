"""The CPU backend (native/cpu_backend.py) running artifacts' CPU kernel sets: the tiny-model
engine tests of test_tiny_parity.py again on it (logits and greedy tokens against transformers,
pages, chunked prefill, continuous batching, preemption), the same seeded samples and logprobs as
the WGSL kernels on lavapipe, SmolLM2 against transformers, and which backend ``device`` picks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import TINY_OPTIONS
from tests.e2e.helpers import (
    hf_greedy,
    ids_of,
    kv_cache_of,
    make_core,
    prefill_logits,
    run_core,
)
# the same tests, collected again here with this module's CPU fixtures
from tests.e2e.test_tiny_parity import (  # noqa: F401
    test_chunked_prefill_gives_the_same_tokens,
    test_concurrent_sequences_equal_solo_and_transformers,
    test_greedy_32_tokens_match_transformers,
    test_long_prompt_across_pages_and_page_boundaries,
    test_prefill_logits_match_transformers,
)
from wick.engine.api import EngineAPI
from wick.engine.sequence import SamplingParams


@pytest.fixture(scope="module")
def cpu():
    from wick.native.cpu_backend import CpuBackend

    return CpuBackend.create()


@pytest.fixture(scope="module")
def tiny_core(tiny_llama_dir, compiled, cpu):
    """The session's tiny Llama (q0f32) on the CPU backend."""
    return make_core(compiled(tiny_llama_dir, "q0f32", **TINY_OPTIONS), cpu, num_pages=64)


@pytest.fixture(scope="module")
def model(tiny_core, tiny_hf):
    return tiny_core, tiny_hf


def test_a_step_is_calls_of_the_kernel_library(tiny_core):
    from wick.engine.backend import Call

    backend = tiny_core.runner.backend
    assert backend.kind == "cpu" and backend.threads >= 1
    seen = []
    run = backend.run

    def spy(writes, dispatches, reads, step=None):
        seen.extend(dispatches)
        return run(writes, dispatches, reads, step)

    backend.run = spy
    try:
        prefill_logits(tiny_core.runner, [ids_of(20, 1)])
    finally:
        del backend.run
    assert len(seen) > 10 and all(isinstance(d, Call) for d in seen)


def test_a_step_goes_to_the_library_in_one_call_with_the_same_bits(tiny_core):
    """The library's wick_run_calls runs a step's calls in one foreign call (the same address
    arrays reused for a repeated step); the logits are the bits of calling each kernel
    through ctypes, as a library without that entry point is run."""
    backend = tiny_core.runner.backend
    assert backend._run_calls is not None
    prompts = [ids_of(20, 1), ids_of(9, 2)]
    batched = prefill_logits(tiny_core.runner, prompts)
    steps = dict(backend._steps)
    assert steps and prefill_logits(tiny_core.runner, prompts).tobytes() == batched.tobytes()
    assert backend._steps.keys() == steps.keys()  # (the same step again: its arrays reused)
    run_calls, backend._run_calls = backend._run_calls, None
    try:
        one_by_one = prefill_logits(tiny_core.runner, prompts)
    finally:
        backend._run_calls = run_calls
    assert one_by_one.tobytes() == batched.tobytes()


@pytest.fixture(scope="module")
def tiny_q4(tiny_llama_dir, compiled, cpu, backend):
    """The tiny Llama in q4f32_1 on both backends: (cpu core, lavapipe core)."""
    art = compiled(tiny_llama_dir, "q4f32_1", **TINY_OPTIONS)
    return make_core(art, cpu, num_pages=64), make_core(art, backend, num_pages=64)


def test_q4_logits_equal_the_wgsl_kernels(tiny_q4):
    on_cpu, on_gpu = tiny_q4
    prompts = [ids_of(23, 7), ids_of(3, 8)]
    a, b = prefill_logits(on_cpu.runner, prompts), prefill_logits(on_gpu.runner, prompts)
    diff = np.abs(a - b).max()
    print(f"q4f32_1 logits, CPU kernels vs WGSL on lavapipe: max diff {diff:.2e}")
    assert diff < 1e-4


def test_seeded_samples_and_logprobs_equal_the_wgsl_kernels(tiny_q4):
    """The sampling, logit-processing and logprob twins (compiler/sampling.py, logits.py)
    against the WGSL kernels: same tokens for the same seed, same logprobs."""
    outs = []
    for core in tiny_q4:
        r = EngineAPI(core).completions.create(
            prompt=ids_of(12, 9), max_tokens=12, temperature=0.9, top_p=0.9, top_k=40, seed=7,
            n=2, logprobs=3, frequency_penalty=0.5, logit_bias={"65": 3.0})
        outs.append(r)
    cpu, gpu = outs
    for c, g in zip(cpu.choices, gpu.choices):
        assert c.text == g.text
        assert c.logprobs.tokens == g.logprobs.tokens
        np.testing.assert_allclose(c.logprobs.token_logprobs, g.logprobs.token_logprobs,
                                   atol=1e-4)
        for tc, tg in zip(c.logprobs.top_logprobs, g.logprobs.top_logprobs):
            assert list(tc) == list(tg)
    assert cpu.choices[0].text != cpu.choices[1].text  # really sampled


def test_structured_output_on_the_cpu_backend(tiny_core):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = EngineAPI(tiny_core).chat.completions.create(
        messages=[{"role": "user", "content": "a number"}], max_tokens=24, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    import json

    import jsonschema

    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(text), schema)
    else:  # a random model may not close the object in 24 tokens: a valid prefix so far
        assert text.startswith("{")


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers(smollm2_cpu_core, smollm2_hf):
    core = smollm2_cpu_core  # (the session's: test_smollm2.py's tests run on it too)
    prompt = core.prompt_ids("The three primary colors are")
    (got,) = run_core(core, [prompt], SamplingParams(temperature=0.0, max_tokens=16))
    want = hf_greedy(smollm2_hf, prompt, 16)
    print(f"wick cpu: {core.tokenizer.decode(got)!r}")
    assert got == want


def test_auto_picks_the_cpu_backend_over_a_software_gpu():
    """This machine has no GPU, only lavapipe: "auto" must mean the CPU kernels, "vulkan" the
    software adapter."""
    from wick.native.devices import create_backend

    auto = create_backend("auto")
    assert auto.kind == "cpu"
    vulkan = create_backend("vulkan")
    assert getattr(vulkan, "kind", "webgpu") == "webgpu" and vulkan.is_software


def test_f16_variants_run_on_the_cpu_too(tiny_llama_dir, compiled, cpu, backend):
    """Asked for explicitly, a q4f16_1 artifact runs on the CPU backend and agrees with the
    WGSL kernels within f16 rounding; by default the CPU gets the float32 twin."""
    from wick.server.local import pick_quantization

    art = compiled(tiny_llama_dir, "q4f16_1", **TINY_OPTIONS)
    on_cpu = make_core(art, cpu, num_pages=16)
    on_gpu = make_core(art, backend, num_pages=16)
    prompts = [ids_of(21, 11)]
    a, b = prefill_logits(on_cpu.runner, prompts), prefill_logits(on_gpu.runner, prompts)
    assert np.abs(a - b).max() < 2e-2 * max(1.0, np.abs(b).max())
    assert int(a[0].argmax()) == int(b[0].argmax())
    assert pick_quantization("smollm2-135m-instruct", None, cpu.features, cpu.prefers_f32) == "q4f32_1"


# ---------------------------------------------------------------------- the kernel runtime


def test_the_library_needs_only_libc_and_its_pool_splits_loops(tiny_llama_dir, compiled):
    """kernels.so is linked with wick's kernel runtime (compiler/kernel_runtime.c): it asks
    the dynamic linker for libc, libm and ld.so only (no TVM), the manifest says so; with 2 threads
    the pool's helper runs parallel-loop tasks whose results equal 1 thread's bit for bit."""
    import json
    import subprocess

    from wick.engine.artifact import MANIFEST_NAME, host_cpu_flags
    from wick.native.cpu_backend import CpuBackend

    art = compiled(tiny_llama_dir, "q0f32", **TINY_OPTIONS)
    entry = json.loads((art / MANIFEST_NAME).read_text())["kernel_sets"]["cpu"]
    assert entry["runtime"] == 1 and set(entry["cpu_flags"]) <= host_cpu_flags()
    dynamic = subprocess.run(["readelf", "-d", str(art / entry["file"])], capture_output=True,
                             text=True, check=True).stdout
    needed = {line.split("[")[1].split("]")[0] for line in dynamic.splitlines()
              if "(NEEDED)" in line}
    assert needed and all(n.startswith(("libc.so", "libm.so", "ld-linux")) for n in needed), needed

    prompts = [ids_of(40, 3), ids_of(7, 4)]
    one, two = CpuBackend(threads=1), CpuBackend(threads=2)
    core1, core2 = make_core(art, one, num_pages=64), make_core(art, two, num_pages=64)
    lib = two._libraries[0]
    before = lib.helper_tasks()
    logits2 = prefill_logits(core2.runner, prompts)
    assert lib.helper_tasks() > before  # the helper thread took tasks
    before = lib.helper_tasks()
    logits1 = prefill_logits(core1.runner, prompts)  # (the same library: its pool set to 1)
    assert lib.helper_tasks() == before
    assert np.array_equal(logits1, logits2)


def test_two_engines_step_at_once_on_one_library(tiny_llama_dir, compiled):
    """Two engines of one artifact in two threads share the library's pool: a loop launched
    while the other thread's holds it runs alone, and both get what they get solo."""
    import threading

    from wick.native.cpu_backend import CpuBackend

    art = compiled(tiny_llama_dir, "q0f32", **TINY_OPTIONS)
    cores = [make_core(art, CpuBackend(threads=2), num_pages=64) for _ in range(2)]
    prompts = [[ids_of(60, 10 + i)] for i in range(2)]

    def logits(i: int) -> np.ndarray:
        out = prefill_logits(cores[i].runner, prompts[i])
        kv_cache_of(cores[i].runner).free(0)
        return out

    solo = [logits(i) for i in range(2)]
    results: dict[int, list] = {0: [], 1: []}

    def work(i: int) -> None:
        for _ in range(5):
            results[i].append(logits(i))

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        assert len(results[i]) == 5
        assert all(np.array_equal(r, solo[i]) for r in results[i])


def test_a_kernels_own_check_names_the_kernel_and_what_failed(tiny_core):
    """A call whose tensors do not fit the kernel: its check's message, through the
    runtime's error slot, in a DeviceError naming the kernel (no crash)."""
    from wick.engine.backend import Call, TensorRef
    from wick.engine.errors import DeviceError

    backend = tiny_core.runner.backend
    buffer = backend.alloc(64)
    try:
        with pytest.raises(DeviceError, match=r"CPU kernel \S+ failed: \S+"):
            backend.run([], [Call(0, (TensorRef(buffer, 0, (4,), "float32"),))], [])
    finally:
        backend.free(buffer)


def test_a_library_the_cpu_cannot_run_is_refused_with_what_to_do(tiny_core):
    from wick.engine.artifact import cpu_kernels_misfit, host_cpu_flags
    from wick.engine.errors import ArtifactError
    from wick.native.cpu_backend import CpuBackend

    here = sorted(host_cpu_flags())
    assert cpu_kernels_misfit({"runtime": 1, "cpu_flags": here, "mcpu": "x"}) is None
    old = cpu_kernels_misfit({"mcpu": "x", "functions": []})  # before the kernel runtime
    assert "TVM's runtime" in old and "wick compile --force" in old
    newer = cpu_kernels_misfit({"runtime": 2, "cpu_flags": here, "mcpu": "x"})
    assert "kernel runtime 2" in newer and "wick compile --force" in newer
    if here:
        why = cpu_kernels_misfit({"runtime": 1, "cpu_flags": [*here, "avx9000"], "mcpu": "zen9"})
        assert "'zen9'" in why and "lacks avx9000" in why and "wick compile --force" in why
    with pytest.raises(ArtifactError) as e:
        CpuBackend(threads=1).load_library({"mcpu": "x", "functions": ["f"]}, "k.so", b"")
    assert e.value.code == "artifact_stale"
