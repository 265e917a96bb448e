"""compiler/targets/build_cache.py: an LLVM kernel build is kept and reused for the same
functions, target facts, TVM and compiler; anything else, a damaged entry or
WICK_KERNEL_CACHE=off builds again."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("tvm")

from tests.compiler.test_cpu_gemm import te_f32_matmul  # noqa: E402
from wick.compiler import targets  # noqa: E402
from wick.compiler.targets import build_cache, cpu, wasm  # noqa: E402
from wick.compiler.targets.cpu import CpuSet  # noqa: E402
from wick.compiler.targets.cuda import CudaSet  # noqa: E402
from wick.compiler.targets.webgpu import WebGPUSet  # noqa: E402

SMALL = {"matmul_a": te_f32_matmul(16, 16)}


@pytest.fixture
def builds(monkeypatch, tmp_path):
    """The cache in a directory of its own; counts the CPU and WebAssembly builds run."""
    monkeypatch.setenv("WICK_KERNEL_CACHE", str(tmp_path / "kernels"))
    ran = []
    for module in (cpu, wasm):
        def counted(lowered, _build=module.build, _name=module.__name__):
            ran.append(_name.rpartition(".")[2])
            return _build(lowered)
        monkeypatch.setattr(module, "build", functools.wraps(module.build)(counted))
    return ran


def build(functions):
    sets = {"webgpu": WebGPUSet([], {}), "cpu": CpuSet(functions), "cuda": CudaSet()}
    return targets.build_all(sets, lambda *_: None)


def files_and_entries(out):
    return {kind: (got.files, got.entry) for kind, got in out.items()}


def test_a_build_is_reused_for_the_same_functions_only(builds, tmp_path):
    first = build(SMALL)
    assert sorted(builds) == ["cpu", "wasm"]
    again = build({"matmul_a": te_f32_matmul(16, 16)})  # (the same function, made again)
    assert sorted(builds) == ["cpu", "wasm"]  # nothing built
    assert files_and_entries(again) == files_and_entries(first)
    assert len(list((tmp_path / "kernels").iterdir())) == 3  # (cpu, wasm, wasm_relaxed)
    build({"matmul_a": te_f32_matmul(16, 32)})  # another shape
    build({"matmul_b": te_f32_matmul(16, 16)})  # another name
    assert sorted(builds) == ["cpu"] * 3 + ["wasm"] * 3


def test_another_cpu_or_compiler_builds_again(builds, monkeypatch):
    build(SMALL)
    facts = cpu.build_facts()
    monkeypatch.setattr(cpu, "build_facts", lambda: {**facts, "mcpu": "another"})
    build(SMALL)
    assert sorted(builds) == ["cpu", "cpu", "wasm"]
    monkeypatch.setattr(build_cache, "compiler_digest", lambda: "edited")
    build(SMALL)
    assert sorted(builds) == ["cpu"] * 3 + ["wasm"] * 2


def test_a_damaged_entry_is_built_again(builds, tmp_path):
    first = build(SMALL)
    for stored in (tmp_path / "kernels").glob("*/cpu.0"):
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 0xFF
        stored.write_bytes(bytes(data))
    assert files_and_entries(build(SMALL)) == files_and_entries(first)
    assert sorted(builds) == ["cpu", "cpu", "wasm"]
    build(SMALL)  # (the rebuilt entry is whole again)
    assert sorted(builds) == ["cpu", "cpu", "wasm"]
    for index in (tmp_path / "kernels").glob("*/built.json"):
        index.write_text("[]")  # (JSON, but not an index)
    assert files_and_entries(build(SMALL)) == files_and_entries(first)
    assert sorted(builds) == ["cpu"] * 3 + ["wasm"] * 2


def test_off_builds_every_time_and_keeps_nothing(builds, monkeypatch, tmp_path):
    monkeypatch.setenv("WICK_KERNEL_CACHE", "off")
    monkeypatch.setenv("WICK_HOME", str(tmp_path / "home"))
    build(SMALL)
    build(SMALL)
    assert sorted(builds) == ["cpu", "cpu", "wasm", "wasm"]
    assert not (tmp_path / "home").exists() and not (tmp_path / "kernels").exists()


def test_the_most_recently_used_entries_are_kept(builds, monkeypatch, tmp_path):
    monkeypatch.setattr(build_cache, "KEEP", 2)
    build(SMALL)  # three entries: cpu's, wasm's and wasm_relaxed's (one goes)
    build({"matmul_b": te_f32_matmul(16, 16)})  # two more: the first two go
    assert len(list((tmp_path / "kernels").iterdir())) == 2
    build(SMALL)
    assert sorted(builds) == ["cpu"] * 3 + ["wasm"] * 3
