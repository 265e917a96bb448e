"""engine/backend.py's Backend base class: what a backend that says nothing gets, and the
mistake it refuses (an asynchronous step the runner would never await)."""

from __future__ import annotations

import asyncio

import pytest

from wick.engine.backend import Backend, KernelSet, KernelSpec


def test_the_defaults_are_a_synchronous_webgpu_device():
    b = Backend()
    assert (b.kind, b.prefers_f32, b.is_software, b.reads_async) == ("webgpu", False, False, False)
    assert b.profile_json() == "{}" and b.close() is None
    with pytest.raises(NotImplementedError, match="loads no kernel library"):
        b.load(KernelSet("library", {}, (), "lib.so", b""))
    with pytest.raises(NotImplementedError, match="runs no WGSL kernels"):
        b.load(KernelSet("shaders", {}, ()))


def test_load_hands_each_form_to_its_hook():
    """One ``load(kernel_set)`` for the engine; a backend implements its forms' hooks."""
    spec = KernelSpec("k", "@compute fn k() {}", "k", ("read",), False)

    class Both(Backend):
        def load_kernels(self, kernels):
            return ("shaders", tuple(kernels))

        def load_library(self, entry, path, data):
            return (entry["form"], path, data)

    b = Both()
    assert b.load(KernelSet("shaders", {}, (spec,))) == ("shaders", (spec,))
    assert b.load(KernelSet("library", {"form": "library"}, (), "a/k.so", b"lib")) == (
        "library", "a/k.so", b"lib")
    assert b.load(KernelSet("source", {"form": "source"}, (), "a/k.cu", b"src")) == (
        "source", "a/k.cu", b"src")


def test_run_async_runs_the_step_of_a_synchronous_backend():
    class Echo(Backend):
        def run(self, writes, dispatches, reads, step=None):
            return [bytes(r) for r in reads] + [repr(step).encode()]

    assert asyncio.run(Echo().run_async([], [], [b"ab"])) == [b"ab", b"None"]
    assert asyncio.run(Echo().run_async([], [], [b"ab"], ("forward", ()))) == [
        b"ab", b"('forward', ())"]  # (the step's key reaches run)


def test_a_backend_with_its_own_run_async_must_say_it_reads_async():
    with pytest.raises(TypeError, match="reads_async"):
        class Forgot(Backend):
            async def run_async(self, writes, dispatches, reads, step=None):
                return []

    class Said(Backend):
        reads_async = True

        async def run_async(self, writes, dispatches, reads, step=None):
            return []

    assert Said.reads_async
