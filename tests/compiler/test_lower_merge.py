"""compiler/lower.py ``merge``: the one rule that joins the lowerings of several Relax modules
(forward + sampler, decode, decode1) into one set of plans over every kernel set. Checked on
stand-in sets (a function is its content) so that the rule, not TVM, is what is tested; the
real sets are checked by compiling (the e2e tests) and by their own merging tests."""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")

from wick.compiler.lower import Lowered, merge  # noqa: E402


class StandInSet:
    """A lowered set whose functions are plain values; two are the same when equal."""

    def __init__(self, functions: dict[str, object]) -> None:
        self.functions = functions

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def merging(self, other: "StandInSet", prefix: str) -> "StandInJoin":
        return StandInJoin(self, other)


class StandInJoin:
    def __init__(self, base: StandInSet, other: StandInSet) -> None:
        self.functions, self.theirs = dict(base.functions), other.functions

    def same(self, mine: str, theirs: str) -> bool:
        return mine in self.functions and self.functions[mine] == self.theirs[theirs]

    def add(self, theirs: str, name: str) -> None:
        self.functions.setdefault(name, self.theirs[theirs])

    def result(self) -> StandInSet:
        return StandInSet(self.functions)


def lowered(plan: str, gpu: dict, cpu: dict) -> Lowered:
    calls = [{"op": "call", "func": name, "args": []} for name in gpu]
    return Lowered({plan: {"name": plan, "instrs": [{"op": "alloc"}, *calls]}}, {"w": {}},
                   {"gpu": StandInSet(gpu), "cpu": StandInSet(cpu)})


def calls(out: Lowered, plan: str) -> list[str]:
    return [i["func"] for i in out.plans[plan]["instrs"] if i["op"] == "call"]


def test_a_function_keeps_its_name_only_where_every_set_agrees():
    base = lowered("forward", {"norm": 1, "attn": 2, "head": 3}, {"norm": 1, "attn": 20, "head": 3})
    decode = lowered("decode", {"norm": 1, "attn": 2, "head": 4, "rope": 5},
                     {"norm": 1, "attn": 21, "head": 4, "rope": 5})
    out = merge(base, decode, prefix="decode_")
    # same everywhere: shared; differs on the CPU only (attention's twin) or on both: apart;
    # new: its own name
    assert calls(out, "forward") == ["norm", "attn", "head"]
    assert calls(out, "decode") == ["norm", "decode_attn", "decode_head", "rope"]
    for kind, attn in (("gpu", 2), ("cpu", 21)):
        assert out.sets[kind].functions["decode_attn"] == attn
        assert set(out.sets[kind].functions) == {"norm", "attn", "head", "decode_attn",
                                                 "decode_head", "rope"}
    assert out.plans["decode"]["instrs"][0] == {"op": "alloc"}
    # a third group whose attention is decode's finds it under the name decode's merge gave
    decode1 = lowered("decode1", {"attn": 2, "head": 6}, {"attn": 21, "head": 6})
    out = merge(out, decode1, prefix="decode1_")
    assert calls(out, "decode1") == ["decode_attn", "decode1_head"]
    assert set(out.plans) == {"forward", "decode", "decode1"}


def test_sets_that_lower_different_functions_are_refused():
    """One plan calls a function by one name in every set: a set missing one is a compiler bug,
    said at once rather than a plan calling what a set lacks."""
    good = lowered("forward", {"norm": 1}, {"norm": 1})
    odd = lowered("decode", {"norm": 1, "rope": 2}, {"norm": 1})
    with pytest.raises(ValueError, match="lower different functions"):
        merge(good, odd, prefix="decode_")


def test_a_kernel_set_choice_lowers_and_builds_only_what_it_names():
    """``wick compile --kernel-sets``: the chosen builds, the lowerings they read (the
    WebAssembly sets are built from the CPU's), in the artifact's order; all of them is None
    (the default's cache key); an unknown or empty choice names what to choose from."""
    from wick.compiler.targets import builders, chosen_kernel_sets, targets

    assert chosen_kernel_sets("wasm, webgpu") == ("webgpu", "wasm")
    assert chosen_kernel_sets(n for n in ["cuda", "cpu"]) == ("cpu", "cuda")
    assert chosen_kernel_sets(["cuda", "wasm", "cpu", "webgpu", "wasm_relaxed"]) is None
    assert chosen_kernel_sets(["cuda", "wasm", "cpu", "webgpu"]) == ("webgpu", "cpu", "wasm",
                                                                   "cuda")
    assert list(targets(("webgpu", "wasm"))) == ["webgpu", "cpu"]
    assert list(targets(("cuda",))) == ["cuda"]
    assert [name for name, *_ in builders(("wasm", "webgpu"))] == ["webgpu", "wasm"]
    assert [name for name, *_ in builders()] == ["webgpu", "cpu", "wasm", "wasm_relaxed", "cuda"]
    for bad, said in (("cpu,metal", "unknown kernel set metal"), ("", "no kernel set given")):
        with pytest.raises(ValueError,
                           match=said + ": choose from webgpu, cpu, wasm, wasm_relaxed, cuda"):
            chosen_kernel_sets(bad)
