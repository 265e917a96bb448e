"""compiler/kernel_memo.py: a kernel builder runs once per distinct set of arguments."""

from __future__ import annotations

from wick.compiler import kernel_memo
from wick.compiler.kernel_memo import built_once


def test_a_builder_runs_once_per_distinct_arguments():
    calls = []

    @built_once
    def build(n, scale=1.0, scaling=None):
        calls.append((n, scale, scaling))
        return object()

    first = build(4, scale=0.5, scaling={"rope_type": "llama3", "factor": 8.0})
    assert build(4, scale=0.5, scaling={"factor": 8.0, "rope_type": "llama3"}) is first
    assert len(calls) == 1
    # what TVMScript would build differently is another key: 1 and 1.0, a changed dict value
    assert build(4, scale=1) is not build(4, scale=1.0)
    assert build(4, scale=0.5, scaling={"rope_type": "llama3", "factor": 4.0}) is not first
    assert len(calls) == 4


def test_it_keeps_the_most_recently_used_kernels_only(monkeypatch):
    monkeypatch.setattr(kernel_memo, "KEEP", 2)
    calls = []

    @built_once
    def build(n):
        calls.append(n)
        return object()

    one, two = build(1), build(2)
    assert build(1) is one  # (1 is now the most recently used)
    build(3)  # ... so 2 is dropped
    assert build(1) is one and len(calls) == 3
    assert build(2) is not two and calls == [1, 2, 3, 2]


def test_an_argument_it_cannot_key_is_built_every_time():
    calls = []

    @built_once
    def build(values):
        calls.append(values)
        return object()

    unkeyable = {1, 2}  # (a set: no key is made of it)
    assert build(unkeyable) is not build(unkeyable)
    assert len(calls) == 2


def test_the_kernels_are_the_same_objects_for_a_second_compile_of_a_shape():
    from wick.compiler.models.cpu_attention import cpu_attention_prim_func
    from wick.compiler.sampling import sampling_prim_func_cpu

    assert sampling_prim_func_cpu(256, "float32") is sampling_prim_func_cpu(256, "float32")
    assert sampling_prim_func_cpu(256, "float32") is not sampling_prim_func_cpu(512, "float32")
    args = (4, 2, 16, "float32", 0.25)
    assert cpu_attention_prim_func(*args, signature="paged") is \
        cpu_attention_prim_func(*args, signature="paged")
