"""The paged KV cache manager: page pool, per-sequence page tables, and the index arrays.

No GPU here. The device holds ``num_pages`` pages of ``page_size`` token slots per layer; this
class decides which pages belong to which sequence and builds, for each step, the small arrays
TVM's paged-attention kernels read (``KVIndex`` in ``batch.py``).

Kernel semantics the arrays must match (``batch_prefill_paged_kv`` in
``tvm.relax.frontend.nn.llm``): for sequence i, its KV length is
``kv_len = (num_pages_i - 1) * page_size + last_page_len[i]`` read from
``page_values[page_indptr[i]:page_indptr[i+1]]``; its queries are rows
``qo_indptr[i]..qo_indptr[i+1]`` and query row r may see key column c iff
``c < kv_len - qo_len + r + 1`` (causal, new tokens last). So the pages listed must cover exactly
the tokens already cached plus this step's new ones, which are written first at ``append_slots``.

Sliding window (``window``: a model whose every layer sees only the last ``window`` keys): the
pages whose tokens are all before the window of the next token a sequence computes are freed
when it grows (the window's lower bound only rises), so a sequence holds about
``window / page_size`` pages however long it runs. Its page list then starts at absolute page
``dropped``; ``k_rope_pos_offset`` tells the attention kernel the position of the first listed
key (TVM's global kernel is never used with a window).

Every page is usable (no reserved page 0). Not yet here: reference counts and the prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from .batch import KVIndex
from .errors import KVCacheFullError


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // page_size)


def window_pages(window: int, step_tokens: int, page_size: int) -> int:
    """Pages a windowed sequence holds at most during a step of ``step_tokens`` tokens: its
    window, the step's tokens, and one page for where the window starts inside a page."""
    return pages_for(window + step_tokens, page_size) + 1


class KVCache:
    def __init__(self, num_pages: int, page_size: int, window: int | None = None) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.window = window
        self._dropped: dict[int, int] = {}  # seq_id -> leading pages freed (behind the window)
        # Lowest page ids first: pop() from the end of a reversed list. Deterministic reuse
        # keeps tests and traces readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}  # seq_id -> page ids, in token order
        self._capacity_of: dict[int, int] = {}  # seq_id -> tokens the seq may hold (reserved)

    # -- queries --------------------------------------------------------------------------------

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one sequence could ever hold (the whole pool)."""
        return self.num_pages * self.page_size

    def sequence_tokens(self, step_tokens: int) -> int | None:
        """The most tokens one sequence can reach, its steps bringing up to ``step_tokens`` new
        tokens: the whole pool; or, with a window, None (no bound from the cache) when the pool
        holds what one step of one sequence needs (its window, the step's tokens, and a page
        on each side for alignment)."""
        if self.window is None:
            return self.capacity_tokens
        if self.num_pages >= self.window_pages(step_tokens):
            return None
        return self.capacity_tokens

    def window_pages(self, step_tokens: int) -> int:
        """Pages a windowed sequence holds at most during a step of ``step_tokens`` tokens."""
        return window_pages(self.window, step_tokens, self.page_size)

    def has(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence has room reserved for (0 if it holds no pages)."""
        return self._capacity_of.get(seq_id, 0)

    def page_table(self, seq_id: int) -> tuple[int, ...]:
        """The pages the sequence holds, in token order (from absolute page ``dropped``)."""
        return tuple(self._tables.get(seq_id, ()))

    def dropped_pages(self, seq_id: int) -> int:
        """Leading pages the sequence gave back because they left its window."""
        return self._dropped.get(seq_id, 0)

    def pages_needed(self, seq_id: int, num_tokens: int) -> int:
        """More pages the sequence needs to hold ``num_tokens`` tokens in total."""
        have = self.dropped_pages(seq_id) + len(self._tables.get(seq_id, ()))
        return max(0, pages_for(num_tokens, self.page_size) - have)

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        return self.pages_needed(seq_id, num_tokens) <= len(self._free) + self._behind(seq_id)

    def _behind(self, seq_id: int) -> int:
        """Held pages no future query can see: all their tokens are before the window of the
        next token the sequence computes (its reserved tokens so far)."""
        if self.window is None or seq_id not in self._tables:
            return 0
        first_needed = max(0, self._capacity_of[seq_id] - self.window + 1)
        behind = first_needed // self.page_size - self.dropped_pages(seq_id)
        return max(0, min(behind, len(self._tables[seq_id])))

    # -- changes --------------------------------------------------------------------------------

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """Make the sequence hold room for ``num_tokens`` tokens in total (grows, never shrinks)."""
        behind = self._behind(seq_id)
        if behind:  # first give back what slid out of the window
            table = self._tables[seq_id]
            self._free.extend(table[:behind])
            self._free.sort(reverse=True)
            del table[:behind]
            self._dropped[seq_id] = self.dropped_pages(seq_id) + behind
        need = self.pages_needed(seq_id, num_tokens)
        if need > len(self._free):
            raise KVCacheFullError(
                f"sequence {seq_id} needs {need} more KV pages, only {len(self._free)} are free"
            )
        table = self._tables.setdefault(seq_id, [])
        for _ in range(need):
            table.append(self._free.pop())
        self._capacity_of[seq_id] = max(self._capacity_of.get(seq_id, 0), num_tokens)

    def append(self, seq_id: int, num_new_tokens: int = 1) -> None:
        """Room for ``num_new_tokens`` more tokens after the ones already reserved."""
        self.allocate(seq_id, self.num_tokens(seq_id) + num_new_tokens)

    def free(self, seq_id: int) -> None:
        """Give back all pages of the sequence (a no-op if it holds none)."""
        table = self._tables.pop(seq_id, [])
        self._capacity_of.pop(seq_id, None)
        self._dropped.pop(seq_id, None)
        # Kept in descending order so pop() hands out the lowest free id next.
        self._free.extend(table)
        self._free.sort(reverse=True)

    # -- the step's index arrays ------------------------------------------------------------------

    def index_for(self, entries: Iterable[tuple[int, int, int]]) -> KVIndex:
        """Index arrays for one step. Each entry is ``(seq_id, start_pos, num_new_tokens)``.

        ``start_pos`` tokens of the sequence are already in the cache; the step appends
        ``num_new_tokens`` after them. Room for ``start_pos + num_new_tokens`` must be allocated.
        """
        ps = self.page_size
        qo_indptr = [0]
        page_indptr = [0]
        page_values: list[int] = []
        last_page_len: list[int] = []
        first_key: list[int] = []
        q_positions: list[int] = []
        append_slots: list[int] = []
        for seq_id, start, num_new in entries:
            if num_new < 1 or start < 0:
                raise ValueError(f"sequence {seq_id}: bad chunk start={start} new={num_new}")
            kv_len = start + num_new
            table = self._tables.get(seq_id)
            if table is None or self._capacity_of[seq_id] < kv_len:
                raise ValueError(
                    f"sequence {seq_id}: {kv_len} tokens in this step but room for "
                    f"{self.num_tokens(seq_id)} allocated"
                )
            dropped = self.dropped_pages(seq_id)
            if self.window is not None and max(0, start - self.window + 1) < dropped * ps:
                raise ValueError(f"sequence {seq_id}: a query at {start} needs keys that left "
                                 "the cache")
            used = pages_for(kv_len, ps) - dropped
            qo_indptr.append(qo_indptr[-1] + num_new)
            page_values.extend(table[:used])
            page_indptr.append(len(page_values))
            last_page_len.append((kv_len - 1) % ps + 1)
            first_key.append(dropped * ps)
            for pos in range(start, kv_len):
                q_positions.append(pos)
                append_slots.append(table[pos // ps - dropped] * ps + pos % ps)
        return KVIndex(
            qo_indptr=qo_indptr,
            page_indptr=page_indptr,
            page_values=page_values,
            last_page_len=last_page_len,
            k_rope_pos_offset=first_key,
            q_positions=q_positions,
            append_slots=append_slots,
        )


class PairedKVCache:
    """Two page pools for a model whose layers differ: global layers keep every page
    (``main``), windowed ones only their window's (``local``, a ``KVCache`` with a window and
    its own, smaller device buffers). Gemma 2 and 3 are such models (Gemma 3: five windowed
    layers to one global). A sequence holds pages in both; the scheduler sees one cache whose
    every change applies to both, and whose capacity is the main pool's. ``index_for`` gives
    the main pool's arrays with the local pool's in ``KVIndex.window``."""

    def __init__(self, main: KVCache, local: KVCache) -> None:
        if local.window is None or main.page_size != local.page_size:
            raise ValueError("the local pool needs a window and the main pool's page size")
        self.main, self.local = main, local
        self.page_size = main.page_size
        self.window = None  # the sequence limit is the main pool's (see KVCache.window)

    @property
    def num_pages(self) -> int:
        return self.main.num_pages

    @property
    def free_pages(self) -> int:
        return self.main.free_pages

    @property
    def capacity_tokens(self) -> int:
        return self.main.capacity_tokens

    def sequence_tokens(self, step_tokens: int) -> int | None:
        return self.main.sequence_tokens(step_tokens)

    def has(self, seq_id: int) -> bool:
        return self.main.has(seq_id)

    def num_tokens(self, seq_id: int) -> int:
        return self.main.num_tokens(seq_id)

    def page_table(self, seq_id: int) -> tuple[int, ...]:
        return self.main.page_table(seq_id)

    def pages_needed(self, seq_id: int, num_tokens: int) -> int:
        return self.main.pages_needed(seq_id, num_tokens)

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        return (self.main.can_allocate(seq_id, num_tokens)
                and self.local.can_allocate(seq_id, num_tokens))

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        if not self.local.can_allocate(seq_id, num_tokens):
            self.local.allocate(seq_id, num_tokens)  # raises KVCacheFullError, naming it
        self.main.allocate(seq_id, num_tokens)
        self.local.allocate(seq_id, num_tokens)

    def append(self, seq_id: int, num_new_tokens: int = 1) -> None:
        self.allocate(seq_id, self.num_tokens(seq_id) + num_new_tokens)

    def free(self, seq_id: int) -> None:
        self.main.free(seq_id)
        self.local.free(seq_id)

    def index_for(self, entries: Iterable[tuple[int, int, int]]) -> KVIndex:
        entries = list(entries)
        index = self.main.index_for(entries)
        index.window = self.local.index_for(entries)
        return index


def kv_cache_for(page_size: int, num_pages: int, *, window: int | None = None,
                 window_pool: int | None = None, num_window_pages: int = 0
                 ) -> KVCache | PairedKVCache:
    """The cache a model needs (``ModelInfo.kv_window`` / ``kv_window_pool``): one pool, one
    pool that slides, or a main pool with a sliding one for the windowed layers."""
    main = KVCache(num_pages, page_size, window=window)
    if not window_pool:
        return main
    return PairedKVCache(main, KVCache(num_window_pages, page_size, window=window_pool))
