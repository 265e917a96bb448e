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

Every page is usable (no reserved page 0). Not yet here: reference counts and the prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from .batch import KVIndex
from .errors import KVCacheFullError


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // page_size)


class KVCache:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
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

    def has(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence has room reserved for (0 if it holds no pages)."""
        return self._capacity_of.get(seq_id, 0)

    def page_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self._tables.get(seq_id, ()))

    def pages_needed(self, seq_id: int, num_tokens: int) -> int:
        """More pages the sequence needs to hold ``num_tokens`` tokens in total."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, pages_for(num_tokens, self.page_size) - have)

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        return self.pages_needed(seq_id, num_tokens) <= len(self._free)

    # -- changes --------------------------------------------------------------------------------

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """Make the sequence hold room for ``num_tokens`` tokens in total (grows, never shrinks)."""
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
            used = pages_for(kv_len, ps)
            qo_indptr.append(qo_indptr[-1] + num_new)
            page_values.extend(table[:used])
            page_indptr.append(len(page_values))
            last_page_len.append((kv_len - 1) % ps + 1)
            for pos in range(start, kv_len):
                q_positions.append(pos)
                append_slots.append(table[pos // ps] * ps + pos % ps)
        return KVIndex(
            qo_indptr=qo_indptr,
            page_indptr=page_indptr,
            page_values=page_values,
            last_page_len=last_page_len,
            k_rope_pos_offset=[0] * (len(qo_indptr) - 1),
            q_positions=q_positions,
            append_slots=append_slots,
        )
