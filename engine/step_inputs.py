"""The inputs of one model step, defined once.

The compiler declares ``forward``'s tensor arguments from ``STEP_INPUTS`` (compiler/models), the
runner sizes and fills its input buffers from it (engine/runner.py), and ``step_values`` reads
each one off a scheduled ``Batch`` (whose index arrays ``KVCache.index_for`` builds). Adding an
input is one entry here plus where its values come from; nothing else lists them.

Dimensions are named by what bounds them: ``n`` new tokens in the step, ``b`` sequences, ``b1``
= b + 1, ``p`` pages the step references, ``wp`` pages of the windowed layers' own pool.

``WINDOW_INPUTS`` exist only in models with two page pools (Gemma: global and windowed layers,
engine/kv_cache.py ``PairedKVCache``); their windowed layers read them in place of the
``page_*``, ``last_page_len``, ``k_rope_pos_offset`` and ``append_slots`` inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .batch import Batch


@dataclass(frozen=True, slots=True)
class StepInput:
    name: str
    dims: tuple[str, ...]
    values: Callable[[Batch], list[int]]  # the host values of one step
    dtype: str = "int32"


def _kv(field: str) -> Callable[[Batch], list[int]]:
    return lambda batch: getattr(batch.kv, field)


STEP_INPUTS: tuple[StepInput, ...] = (
    StepInput("input_ids", ("n",), lambda batch: batch.token_ids),
    StepInput("q_positions", ("n",), _kv("q_positions")),  # absolute position (RoPE)
    StepInput("append_slots", ("n",), _kv("append_slots")),  # page * page_size + slot
    StepInput("qo_indptr", ("b1",), _kv("qo_indptr")),
    StepInput("page_indptr", ("b1",), _kv("page_indptr")),
    StepInput("page_values", ("p",), _kv("page_values")),
    StepInput("last_page_len", ("b",), _kv("last_page_len")),
    StepInput("k_rope_pos_offset", ("b",), _kv("k_rope_pos_offset")),
    # row of each sequence's last new token: the rows whose logits the step returns
    StepInput("logit_positions", ("b",), lambda batch: [end - 1 for end in batch.kv.qo_indptr[1:]]),
)

def _window(field: str) -> Callable[[Batch], list[int]]:
    return lambda batch: getattr(batch.kv.window, field)


WINDOW_PREFIX = "window_"
# the windowed layers' pool: (input name, the main input it stands for there, dims)
WINDOW_INPUTS: tuple[StepInput, ...] = tuple(
    StepInput(WINDOW_PREFIX + name, dims, _window(name)) for name, dims in (
        ("append_slots", ("n",)), ("page_indptr", ("b1",)), ("page_values", ("wp",)),
        ("last_page_len", ("b",)), ("k_rope_pos_offset", ("b",))))



def step_bounds(max_tokens: int, max_batch: int, num_pages: int,
                num_window_pages: int = 0) -> dict[str, int]:
    """The largest size of each dimension a compiled artifact and its KV pools allow. Every
    entry lists its sequence's pages, and several entries may list the same ones (the choices
    of a request share their prompt's; a verify step gives a sequence one entry per token it
    checks), so a step references at most a pool's pages once per entry."""
    return {"n": max_tokens, "b": max_batch, "b1": max_batch + 1, "p": num_pages * max_batch,
            "wp": num_window_pages * max_batch}


def step_values(batch: Batch, inputs: tuple[StepInput, ...] = STEP_INPUTS,
                bounds: dict[str, int] | None = None) -> dict[str, list[int]]:
    """Each input's values for ``batch``. Given ``bounds``, the page lists are padded (with
    zeros) to a power of two: the step's shapes then change a few times over a sequence's
    life instead of at every new page, and so do the dispatch lists and CUDA graphs cached per
    shape. The padding is never read: kernels read a sequence's pages between its
    ``page_indptr`` entries, which end before it."""
    values = {i.name: i.values(batch) for i in inputs}
    if bounds:
        for i in inputs:
            if i.dims[0] in PADDED_DIMS:
                pages = values[i.name]
                values[i.name] = pages + [0] * (padded_pages(len(pages), bounds[i.dims[0]])
                                                - len(pages))
    return values


PADDED_DIMS = ("p", "wp")


def padded_pages(count: int, bound: int) -> int:
    """``count`` rounded up to a power of two (at least 16), at most ``bound``."""
    size = 16
    while size < count:
        size *= 2
    return max(count, min(size, bound))
