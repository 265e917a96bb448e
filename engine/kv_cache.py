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

Every page is usable (no reserved page 0).

Prefix cache (``prefix_cache=True``): a page whose tokens are all computed is offered to the
cache under a digest of its tokens chained to its parent page's digest (so a digest names the
page's tokens and everything before them). A new or resumed sequence looks up the digests of
its own full pages and holds the pages found, instead of computing them again. Chained digests
rather than a radix tree: the unit shared is a page anyway, a flat dict is the whole index,
and a windowed pool must find the pages inside a window whose older ancestors left the pool,
which a tree could only do by keeping the dead path.

- Pages are reference counted. A cached page is never written: a sequence writes only at
  positions it has not computed, and a page is offered only once all its tokens are computed.
  A hit is whole pages and always leaves the last known token to compute (it yields the
  logits), so a shared part that ends inside a page has that page recomputed, privately.
- A cached page no sequence holds is *evictable*; it is reused (its digest forgotten) only
  when no free page is left, least recently released first. A finished sequence releases its
  pages tail first, so a shared head outlives the tails that follow it.
- Windowed pools: a hit needs only the pages of the window of its first query (older pages
  may be gone); pages that slid out of a sequence's window are released to the cache like any
  others: their digests still name exactly their tokens and prefix.
- When idle the pool is whole: ``free_pages + cached_pages == num_pages``.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .batch import KVIndex
from .errors import KVCacheFullError


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // page_size)


def window_pages(window: int, step_tokens: int, page_size: int) -> int:
    """Pages a windowed sequence holds at most during a step of ``step_tokens`` tokens: its
    window, the step's tokens, and one page for where the window starts inside a page."""
    return pages_for(window + step_tokens, page_size) + 1


def extend_page_digests(digests: list[bytes], token_ids: Sequence[int], page_size: int,
                        num_pages: int) -> list[bytes]:
    """Grow ``digests`` (in place) to the chained digests of the first ``num_pages`` full pages
    of ``token_ids``: page j's digest covers its tokens and, through its parent's, all before."""
    for j in range(len(digests), num_pages):
        parent = digests[j - 1] if j else b""
        tokens = array("l", token_ids[j * page_size:(j + 1) * page_size]).tobytes()
        digests.append(hashlib.sha256(parent + tokens).digest())
    return digests


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """What the cache can give a sequence before it computes anything: ``num_tokens`` tokens'
    K/V in ``pages``, from absolute page ``first_page`` on (a window does not need older ones).
    ``local``: the windowed pool's hit of a ``PairedKVCache``."""

    num_tokens: int = 0
    first_page: int = 0
    pages: tuple[int, ...] = ()
    local: PrefixHit | None = None


NO_HIT = PrefixHit()


class KVCache:
    def __init__(self, num_pages: int, page_size: int, window: int | None = None, *,
                 prefix_cache: bool = True) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.window = window
        self.prefix_cache = prefix_cache
        self._dropped: dict[int, int] = {}  # seq_id -> leading pages released (behind the window)
        # A heap: the lowest free id is handed out first. Deterministic reuse keeps tests and
        # traces readable.
        self._free: list[int] = list(range(num_pages))
        self._ref: list[int] = [0] * num_pages  # sequences holding each page
        self._tables: dict[int, list[int]] = {}  # seq_id -> page ids, in token order
        self._capacity_of: dict[int, int] = {}  # seq_id -> tokens the seq may hold (reserved)
        self._page_of: dict[bytes, int] = {}  # digest -> the cached page holding it
        self._digest_of: dict[int, bytes] = {}  # cached page -> its digest
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unheld; LRU first
        self._offered: dict[int, int] = {}  # seq_id -> leading pages already offered the cache
        self.num_evictions = 0

    # -- queries --------------------------------------------------------------------------------

    @property
    def free_pages(self) -> int:
        """Pages holding nothing."""
        return len(self._free)

    @property
    def cached_pages(self) -> int:
        """Pages no sequence holds whose K/V the cache keeps for a later hit (evictable)."""
        return len(self._evictable)

    @property
    def available_pages(self) -> int:
        """Pages an allocation may take: free ones, then evicted ones."""
        return len(self._free) + len(self._evictable)

    @property
    def held_pages(self) -> int:
        """Pages at least one sequence holds."""
        return sum(1 for r in self._ref if r)

    def refcount(self, page: int) -> int:
        return self._ref[page]

    def is_cached(self, page: int) -> bool:
        """Whether the page is in the prefix cache (then it is never written again)."""
        return page in self._digest_of

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

    def lookup(self, digests: Sequence[bytes], num_tokens: int,
               max_pages: int | None = None) -> PrefixHit:
        """The longest hit for a sequence of ``num_tokens`` known tokens whose full pages have
        ``digests``: whole pages, leaving at least its last token to compute, at most
        ``max_pages`` pages. Changes nothing."""
        if not self.prefix_cache:
            return NO_HIT
        cap = min(len(digests), max(0, (num_tokens - 1) // self.page_size))
        if max_pages is not None:
            cap = min(cap, max_pages)
        best, run_start, found = 0, 0, []
        for j in range(cap):
            page = self._page_of.get(digests[j])
            found.append(page)
            if page is None:
                if self.window is None:
                    break
                run_start = j + 1  # a window may still start after this gap
            elif run_start <= self._first_needed_page((j + 1) * self.page_size):
                best = j + 1
        if not best:
            return NO_HIT
        first = self._first_needed_page(best * self.page_size)
        return PrefixHit(best * self.page_size, first, tuple(found[first:best]))

    def _first_needed_page(self, num_tokens: int) -> int:
        """The first page the query at position ``num_tokens`` sees."""
        if self.window is None:
            return 0
        return max(0, num_tokens - self.window + 1) // self.page_size

    def can_allocate(self, seq_id: int, num_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """Whether ``allocate(seq_id, num_tokens, hit)`` would succeed."""
        if hit.num_tokens and seq_id not in self._tables:
            need = max(0, pages_for(num_tokens, self.page_size) - hit.first_page - len(hit.pages))
            taken = sum(1 for p in hit.pages if not self._ref[p])  # leave the evictable set
            return need <= self.available_pages - taken
        released = sum(1 for p in self._tables.get(seq_id, ())[:self._behind(seq_id)]
                       if self._ref[p] == 1)
        return self.pages_needed(seq_id, num_tokens) <= self.available_pages + released

    def _behind(self, seq_id: int) -> int:
        """Held pages no future query can see: all their tokens are before the window of the
        next token the sequence computes (its reserved tokens so far)."""
        if self.window is None or seq_id not in self._tables:
            return 0
        first_needed = self._first_needed_page(self._capacity_of[seq_id])
        behind = first_needed - self.dropped_pages(seq_id)
        return max(0, min(behind, len(self._tables[seq_id])))

    # -- changes --------------------------------------------------------------------------------

    def allocate(self, seq_id: int, num_tokens: int, hit: PrefixHit = NO_HIT) -> None:
        """Make the sequence hold room for ``num_tokens`` tokens in total (grows, never shrinks).
        A sequence that holds nothing yet first takes ``hit``'s pages (``lookup``): their
        tokens count as computed."""
        if hit.num_tokens and seq_id not in self._tables:
            self._hold(seq_id, hit)
        behind = self._behind(seq_id)
        if behind:  # first give back what slid out of the window
            table = self._tables[seq_id]
            for page in table[:behind]:
                self._release(page)
            del table[:behind]
            self._dropped[seq_id] = self.dropped_pages(seq_id) + behind
        need = self.pages_needed(seq_id, num_tokens)
        if need > self.available_pages:
            raise KVCacheFullError(
                f"sequence {seq_id} needs {need} more KV pages, only {self.available_pages} "
                "are free"
            )
        table = self._tables.setdefault(seq_id, [])
        for _ in range(need):
            table.append(self._take())
        self._capacity_of[seq_id] = max(self._capacity_of.get(seq_id, 0), num_tokens)

    def _hold(self, seq_id: int, hit: PrefixHit) -> None:
        for page in hit.pages:
            if not self._ref[page]:
                del self._evictable[page]
            self._ref[page] += 1
        self._tables[seq_id] = list(hit.pages)
        self._dropped[seq_id] = hit.first_page
        self._capacity_of[seq_id] = hit.num_tokens
        self._offered[seq_id] = hit.num_tokens // self.page_size  # cached already

    def _take(self) -> int:
        if self._free:
            page = heapq.heappop(self._free)
        else:  # the least recently released cached page forgets its digest
            page, _ = self._evictable.popitem(last=False)
            del self._page_of[self._digest_of.pop(page)]
            self.num_evictions += 1
        self._ref[page] = 1
        return page

    def _release(self, page: int) -> None:
        self._ref[page] -= 1
        if self._ref[page] < 0:
            raise AssertionError(f"KV page {page} released more often than held")
        if not self._ref[page]:
            if page in self._digest_of:
                self._evictable[page] = None  # the most recently released: evicted last
            else:
                heapq.heappush(self._free, page)

    def append(self, seq_id: int, num_new_tokens: int = 1) -> None:
        """Room for ``num_new_tokens`` more tokens after the ones already reserved."""
        self.allocate(seq_id, self.num_tokens(seq_id) + num_new_tokens)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Shrink the sequence to its first ``num_tokens`` tokens (speculation: the drafted
        tokens a verify step rejected are written again). Pages wholly past them go back,
        tail first; the page holding the new end stays. Only tokens never offered the prefix
        cache can be cut (a cached page is never written again), and, with a window, only
        back to a position whose window the pool still holds."""
        self.check_truncate(seq_id, num_tokens)
        ps, dropped = self.page_size, self.dropped_pages(seq_id)
        table = self._tables[seq_id]
        keep = max(0, pages_for(num_tokens, ps) - dropped)
        for page in reversed(table[keep:]):
            self._release(page)
        del table[keep:]
        self._capacity_of[seq_id] = num_tokens

    def check_truncate(self, seq_id: int, num_tokens: int) -> None:
        """Raise ValueError where ``truncate(seq_id, num_tokens)`` may not cut."""
        if seq_id not in self._tables:
            raise ValueError(f"sequence {seq_id} holds no pages")
        if not 0 <= num_tokens <= self._capacity_of[seq_id]:
            raise ValueError(f"sequence {seq_id}: cannot truncate {self._capacity_of[seq_id]} "
                             f"tokens to {num_tokens}")
        cached = self._offered.get(seq_id, 0) * self.page_size
        if num_tokens < cached:
            raise ValueError(f"sequence {seq_id}: its first {cached} tokens are in the prefix "
                             f"cache; cannot truncate to {num_tokens}")
        first_key = self.dropped_pages(seq_id) * self.page_size
        if self.window is not None and max(0, num_tokens - self.window + 1) < first_key:
            raise ValueError(f"sequence {seq_id}: the keys a query at {num_tokens} needs left "
                             "the cache")

    def commit(self, seq_id: int, digests: Sequence[bytes], num_computed: int) -> None:
        """Offer the cache the sequence's pages whose tokens are all computed (its first
        ``num_computed`` tokens; ``digests`` covers at least their full pages). A page whose
        digest another page already holds stays private."""
        if not self.prefix_cache or seq_id not in self._tables:
            return
        full = num_computed // self.page_size
        start = self._offered.get(seq_id, 0)
        if full <= start:
            return
        dropped, table = self.dropped_pages(seq_id), self._tables[seq_id]
        for j in range(max(start, dropped), full):
            digest = digests[j]
            if digest not in self._page_of:
                page = table[j - dropped]
                self._page_of[digest] = page
                self._digest_of[page] = digest
        self._offered[seq_id] = full

    def reset_prefix_cache(self) -> None:
        """Forget every cached page (their device contents can no longer be trusted, or a user
        asked): unheld ones become free; held ones stay with their sequences, uncached."""
        for page in self._evictable:
            heapq.heappush(self._free, page)
        self._evictable.clear()
        self._page_of.clear()
        self._digest_of.clear()

    def free(self, seq_id: int) -> None:
        """Give back all pages of the sequence (a no-op if it holds none): cached ones become
        evictable, tail first; the rest free."""
        table = self._tables.pop(seq_id, [])
        self._capacity_of.pop(seq_id, None)
        self._dropped.pop(seq_id, None)
        self._offered.pop(seq_id, None)
        for page in reversed(table):
            self._release(page)

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
    the main pool's arrays with the local pool's in ``KVIndex.window``. A prefix hit is one
    both pools can give (each keeps its own cache under the same digests)."""

    def __init__(self, main: KVCache, local: KVCache) -> None:
        if local.window is None or main.page_size != local.page_size:
            raise ValueError("the local pool needs a window and the main pool's page size")
        if main.prefix_cache != local.prefix_cache:
            raise ValueError("both pools cache prefixes, or neither")
        self.main, self.local = main, local
        self.page_size = main.page_size
        self.window = None  # the sequence limit is the main pool's (see KVCache.window)

    @property
    def prefix_cache(self) -> bool:
        return self.main.prefix_cache

    @property
    def num_pages(self) -> int:
        return self.main.num_pages

    @property
    def free_pages(self) -> int:
        return self.main.free_pages

    @property
    def cached_pages(self) -> int:
        return self.main.cached_pages

    @property
    def available_pages(self) -> int:
        return self.main.available_pages

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

    def lookup(self, digests: Sequence[bytes], num_tokens: int) -> PrefixHit:
        main = self.main.lookup(digests, num_tokens)
        if not main.num_tokens:
            return NO_HIT
        local = self.local.lookup(digests, num_tokens, max_pages=main.num_tokens // self.page_size)
        if not local.num_tokens:
            return NO_HIT
        pages = local.num_tokens // self.page_size
        return PrefixHit(local.num_tokens, 0, main.pages[:pages], local)

    def can_allocate(self, seq_id: int, num_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        return (self.main.can_allocate(seq_id, num_tokens, hit)
                and self.local.can_allocate(seq_id, num_tokens, hit.local or NO_HIT))

    def allocate(self, seq_id: int, num_tokens: int, hit: PrefixHit = NO_HIT) -> None:
        local_hit = hit.local or NO_HIT
        if not self.local.can_allocate(seq_id, num_tokens, local_hit):
            self.local.allocate(seq_id, num_tokens, local_hit)  # raises KVCacheFullError
        self.main.allocate(seq_id, num_tokens, hit)
        self.local.allocate(seq_id, num_tokens, local_hit)

    def append(self, seq_id: int, num_new_tokens: int = 1) -> None:
        self.allocate(seq_id, self.num_tokens(seq_id) + num_new_tokens)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        self.main.check_truncate(seq_id, num_tokens)  # both may cut, or neither changes
        self.local.check_truncate(seq_id, num_tokens)
        self.main.truncate(seq_id, num_tokens)
        self.local.truncate(seq_id, num_tokens)

    def commit(self, seq_id: int, digests: Sequence[bytes], num_computed: int) -> None:
        self.main.commit(seq_id, digests, num_computed)
        self.local.commit(seq_id, digests, num_computed)

    def reset_prefix_cache(self) -> None:
        self.main.reset_prefix_cache()
        self.local.reset_prefix_cache()

    def free(self, seq_id: int) -> None:
        self.main.free(seq_id)
        self.local.free(seq_id)

    def index_for(self, entries: Iterable[tuple[int, int, int]]) -> KVIndex:
        entries = list(entries)
        index = self.main.index_for(entries)
        index.window = self.local.index_for(entries)
        return index


def kv_cache_for(page_size: int, num_pages: int, *, window: int | None = None,
                 window_pool: int | None = None, num_window_pages: int = 0,
                 prefix_cache: bool = True) -> KVCache | PairedKVCache:
    """The cache a model needs (``ModelInfo.kv_window`` / ``kv_window_pool``): one pool, one
    pool that slides, or a main pool with a sliding one for the windowed layers."""
    main = KVCache(num_pages, page_size, window=window, prefix_cache=prefix_cache)
    if not window_pool:
        return main
    return PairedKVCache(main, KVCache(num_window_pages, page_size, window=window_pool,
                                       prefix_cache=prefix_cache))
