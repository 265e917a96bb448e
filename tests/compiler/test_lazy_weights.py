"""Weights read on demand (compiler/lazy_weights.py): numpy's operations on them give numpy's
results, and a compile reads each source tensor only when it writes its parameter, so it holds
one module's floats at a time (tracemalloc counts numpy's buffers), with the same bytes out as
converting everything first."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from wick.compiler import compile as compile_mod
from wick.compiler import quantization
from wick.compiler.lazy_weights import LazyArray, read
from wick.compiler.models import family_for
from wick.compiler.models.layers import MAX_BINDING_BYTES
from wick.compiler.quantization import get_quantization, quantize
from wick.compiler.rope_rows import pairs_to_halves
from wick.compiler.sources import resolve_source
from tests.tiny_models import make_tiny_model, write_gguf


def _lazy(array: np.ndarray, reads: list) -> LazyArray:
    def compute():
        reads.append(array.shape)
        return array.copy()
    return LazyArray(compute, array.shape, array.dtype)


def test_numpy_operations_are_deferred_and_equal_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal((4, 6)).astype(np.float32)
    reads: list = []
    la, lb = _lazy(a, reads), _lazy(b, reads)
    cases = {
        "concatenate": (np.concatenate([la, lb]), np.concatenate([a, b])),
        "concatenate axis 1": (np.concatenate([la[:4], lb], axis=1),
                               np.concatenate([a[:4], b], axis=1)),
        "stack": (np.stack([la, la], axis=1), np.stack([a, a], axis=1)),
        "add a scalar": (la + 1.0, a + 1.0),
        "scalar first": (1 - la, 1 - a),
        "broadcast": (la * lb[:1], a * b[:1]),
        "astype": (la.astype(np.float16), a.astype(np.float16)),
        "reshape": (la.reshape(2, -1, 3), a.reshape(2, -1, 3)),
        "T": (la.T, a.T),
        "swapaxes": (la.reshape(2, 4, 6).swapaxes(1, 2), a.reshape(2, 4, 6).swapaxes(1, 2)),
        "rows reordered": (pairs_to_halves(la, 2), pairs_to_halves(a, 2)),
        "zeros_like": (np.zeros_like(la), np.zeros_like(a)),
        "where": (np.where(la > 0, la, 0), np.where(a > 0, a, 0)),
        "power": (np.power(la, 2), np.power(a, 2)),
    }
    assert reads == []  # (shapes and dtypes came from rules and stand-ins, not the data)
    for what, (lazy, want) in cases.items():
        assert isinstance(lazy, LazyArray), what
        assert (lazy.shape, lazy.dtype) == (want.shape, want.dtype), what
        np.testing.assert_array_equal(np.asarray(lazy), want, err_msg=what)
    assert reads  # (read when asked)
    assert float(la.max()) == float(a.max())  # (a method without a rule reads the array)
    assert float(la[2, 3]) == float(a[2, 3])  # (a scalar, as Apertus reads its xIELU ones)
    with pytest.raises(TypeError, match="in place"):
        la[0] = 1.0
    with pytest.raises(TypeError, match="out="):
        np.add(la, 1, out=la)
    with pytest.raises(ValueError, match="do not agree"):  # (now, not when written)
        np.concatenate([la, lb.T])
    np.testing.assert_array_equal(np.unique(la), np.unique(a))  # (a data-shaped result)
    assert bool(LazyArray(lambda: np.zeros(1), (1,), np.float64)) is False


@pytest.mark.parametrize("kind", ["safetensors", "gguf"])
def test_a_compile_holds_one_module_of_floats_at_a_time(tmp_path, monkeypatch, kind):
    # (quantize's temporaries a block of 64 rows at a time here, below one module's floats)
    monkeypatch.setattr(quantization, "QUANTIZE_BLOCK_BYTES", 64 * 4 * 256)
    hf = make_tiny_model(tmp_path / "hf", "llama", layers=8, hidden_size=256,
                         intermediate_size=1024, merges=[("\u0120", "\u0120")])
    path = hf if kind == "safetensors" else write_gguf(hf, tmp_path / "m.gguf")
    family, quant = family_for("llama"), get_quantization("q4f32_1")
    source = resolve_source(str(path))

    tracemalloc.start()
    try:
        loaded = source.load()
        cfg = family.Config.from_hf(loaded.config)
        converted = family.convert_weights(cfg, loaded.weights)
        loading = tracemalloc.get_traced_memory()[0]
        _, _, named = compile_mod.build_module(family, cfg, quant, MAX_BINDING_BYTES, None)
        names = [name for name, _ in named]
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        written = 0
        for _, array in compile_mod._convert(names, converted, lambda linear: quant,
                                             MAX_BINDING_BYTES, source.path):
            written += array.nbytes  # (each parameter dropped once written, as the writer does)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()

    floats = {name: read(array) for name, array in converted.items()}
    total = sum(a.nbytes for a in floats.values())
    largest = max(a.nbytes for a in floats.values())
    assert total > 20e6 and written > 0
    assert loading < total / 20  # loading read headers, not tensors
    # one module's floats (and their packed twin) at a time, not the model's
    assert peak < 3 * largest and peak < total / 5, (peak, largest, total)
    # and the bytes written are those of converting everything first
    eager = list(compile_mod._convert(names, floats, lambda linear: quant, MAX_BINDING_BYTES,
                                      source.path))
    lazy = list(compile_mod._convert(names, converted, lambda linear: quant, MAX_BINDING_BYTES,
                                     source.path))
    assert [n for n, _ in lazy] == [n for n, _ in eager]
    for (name, got), (_, want) in zip(lazy, eager):
        assert got.dtype == want.dtype and np.array_equal(got, want), name


@pytest.mark.parametrize("name", ["q4f32_1", "q4f16_1", "q8f32_1"])
def test_quantize_by_blocks_of_rows_gives_the_whole_matrix_bits(monkeypatch, name):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((300, 128)).astype(np.float32)
    weight[7, :32] = np.arange(32) % 16 * 0.25 - 1.0  # (a group on a grid: kept exactly)
    whole = quantize(weight, get_quantization(name))
    monkeypatch.setattr(quantization, "QUANTIZE_BLOCK_BYTES", 7 * 4 * 128)  # 7 rows a block
    blocks = quantize(weight, get_quantization(name))
    for a, b in zip(whole, blocks):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_gguf_tensors_dequantized_by_blocks_of_rows_equal_the_whole(tmp_path, monkeypatch):
    from wick.compiler import gguf_source

    hf = make_tiny_model(tmp_path / "hf", "llama", layers=2, merges=[("\u0120", "\u0120")])
    path = write_gguf(hf, tmp_path / "m.gguf", types={"attn_q.weight": "Q8_0",
                                                       "ffn_down.weight": "Q4_0",
                                                       "token_embd.weight": "Q8_0"})
    source = resolve_source(str(path))
    loaded = source.load()
    whole = {name: np.asarray(a) for name, a in loaded.weights.items()}  # (one block each)
    monkeypatch.setattr(gguf_source, "DEQUANTIZE_BLOCK_BYTES", 3 * 4 * 64)  # 3 rows a block
    assert {"Q8_0", "Q4_0"} <= set(loaded.source_dtypes.values())
    for name, lazy in loaded.weights.items():
        assert np.array_equal(np.asarray(lazy), whole[name]), name
