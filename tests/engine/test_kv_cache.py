from __future__ import annotations

import pytest

from wick.engine import KVCache, KVCacheFullError


def test_prompt_spanning_three_pages():
    kv = KVCache(num_pages=8, page_size=4)
    kv.allocate(7, 10)
    assert kv.page_table(7) == (0, 1, 2)
    assert kv.free_pages == 5
    idx = kv.index_for([(7, 0, 10)])
    assert idx.qo_indptr == [0, 10]
    assert idx.page_indptr == [0, 3]
    assert idx.page_values == [0, 1, 2]
    assert idx.last_page_len == [2]
    assert idx.k_rope_pos_offset == [0]
    assert idx.q_positions == list(range(10))
    assert idx.append_slots == list(range(10))


def _four_sequence_cache() -> KVCache:
    kv = KVCache(num_pages=16, page_size=4)
    kv.allocate(0, 10)  # A: pages 0 1 2
    kv.allocate(1, 3)  # B: page 3
    kv.allocate(2, 4)  # C: page 4
    kv.allocate(3, 6)  # D: pages 5 6
    kv.free(1)  # page 3 is free again and the lowest free id
    kv.allocate(4, 9)  # E: pages 3 7 8
    kv.append(0, 1)  # A decodes its 11th token: still 3 pages
    kv.append(2, 1)  # C decodes its 5th token: a new page, 9
    return kv


def test_four_sequences_mixed_decode_chunk_and_prefill():
    kv = _four_sequence_cache()
    assert kv.page_table(0) == (0, 1, 2)
    assert kv.page_table(2) == (4, 9)
    assert kv.page_table(3) == (5, 6)
    assert kv.page_table(4) == (3, 7, 8)
    assert kv.free_pages == 16 - 10
    # A decodes (10 cached + 1), C decodes (4 + 1), D prefills a middle chunk (2 cached + 4),
    # E prefills its whole 9-token prompt.
    idx = kv.index_for([(0, 10, 1), (2, 4, 1), (3, 2, 4), (4, 0, 9)])
    assert idx.qo_indptr == [0, 1, 2, 6, 15]
    assert idx.page_indptr == [0, 3, 5, 7, 10]
    assert idx.page_values == [0, 1, 2, 4, 9, 5, 6, 3, 7, 8]
    assert idx.last_page_len == [3, 1, 2, 1]
    assert idx.k_rope_pos_offset == [0, 0, 0, 0]
    assert idx.q_positions == [10, 4, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert idx.append_slots == [10, 36, 22, 23, 24, 25, 12, 13, 14, 15, 28, 29, 30, 31, 32]


def test_index_matches_the_kernels_causal_rule():
    """``batch_prefill_paged_kv``: row r of a sequence sees column c iff
    c < kv_len - qo_len + r + 1, with kv_len from the page count and last_page_len."""
    kv = _four_sequence_cache()
    entries = [(0, 10, 1), (2, 4, 1), (3, 2, 4), (4, 0, 9)]
    idx = kv.index_for(entries)
    for i, (seq_id, start, num_new) in enumerate(entries):
        npages = idx.page_indptr[i + 1] - idx.page_indptr[i]
        kv_len = (npages - 1) * kv.page_size + idx.last_page_len[i]
        qo_len = idx.qo_indptr[i + 1] - idx.qo_indptr[i]
        assert (kv_len, qo_len) == (start + num_new, num_new)
        for r in range(qo_len):
            visible = kv_len - qo_len + r + 1
            pos = idx.q_positions[idx.qo_indptr[i] + r]
            assert visible == pos + 1  # a token sees itself and everything before it
            # and its K/V goes exactly where the page table puts position `pos`
            page = kv.page_table(seq_id)[pos // kv.page_size]
            assert idx.append_slots[idx.qo_indptr[i] + r] == page * kv.page_size + pos % 4


def test_allocate_fails_clearly_and_free_returns_pages():
    kv = KVCache(num_pages=3, page_size=4)
    assert kv.can_allocate(0, 12) and not kv.can_allocate(0, 13)
    kv.allocate(0, 9)
    assert kv.free_pages == 0
    assert kv.num_tokens(0) == 9
    kv.append(0, 3)  # 12 tokens still fit in 3 pages
    assert kv.free_pages == 0
    with pytest.raises(KVCacheFullError, match="needs 1 more KV pages, only 0 are free"):
        kv.append(0, 1)
    kv.free(0)
    assert kv.free_pages == 3
    assert kv.page_table(0) == ()
    kv.free(0)  # idempotent
    assert kv.free_pages == 3


def test_index_for_requires_allocated_room():
    kv = KVCache(num_pages=4, page_size=4)
    kv.allocate(1, 5)
    with pytest.raises(ValueError, match="6 tokens in this step but room for 5"):
        kv.index_for([(1, 5, 1)])
    with pytest.raises(ValueError, match="sequence 2"):
        kv.index_for([(2, 0, 1)])


def test_last_page_exactly_full():
    kv = KVCache(num_pages=4, page_size=4)
    kv.allocate(0, 8)
    idx = kv.index_for([(0, 7, 1)])
    assert idx.page_values == [0, 1]
    assert idx.last_page_len == [4]
    assert idx.append_slots == [7]
    assert idx.q_positions == [7]


def test_sliding_window_frees_the_pages_behind_it():
    """window 8, pages of 4: a sequence growing one token at a time holds at most the pages its
    next token's window touches; the rest go back to the pool, and the index arrays list the
    kept pages from the first kept key on."""
    kv = KVCache(num_pages=6, page_size=4, window=8)
    kv.allocate(0, 5)  # a 5-token prompt
    for start in range(5, 40):
        assert kv.can_allocate(0, start + 1)
        kv.allocate(0, start + 1)
        index = kv.index_for([(0, start, 1)])
        dropped = kv.dropped_pages(0)
        first_needed = max(0, start - 8 + 1)
        assert dropped * 4 <= first_needed < dropped * 4 + 4  # nothing kept that is not needed
        assert index.k_rope_pos_offset == [dropped * 4]
        listed = index.page_values
        assert len(listed) == len(kv.page_table(0)) <= 3
        assert index.append_slots == [listed[start // 4 - dropped] * 4 + start % 4]
        assert kv.free_pages == 6 - len(listed)
    # 40 tokens in a pool of 24 slots: only possible because pages were freed
    assert kv.num_tokens(0) == 40 > kv.capacity_tokens
    kv.free(0)
    assert kv.free_pages == 6 and kv.dropped_pages(0) == 0


def test_sliding_window_prefill_chunks_keep_what_their_first_query_sees():
    kv = KVCache(num_pages=16, page_size=4, window=6)
    kv.allocate(0, 10)
    kv.index_for([(0, 0, 10)])
    kv.allocate(0, 20)  # the chunk's first query (10) sees keys from 5 on: page 1 onwards
    index = kv.index_for([(0, 10, 10)])
    assert kv.dropped_pages(0) == 1 and index.k_rope_pos_offset == [4]
    assert index.page_indptr == [0, 4]  # pages 1..4 of tokens 4..19
    with pytest.raises(ValueError, match="left the cache"):
        kv.index_for([(0, 3, 1)])  # a query whose window reaches a freed page


def test_without_a_window_nothing_is_dropped():
    kv = KVCache(num_pages=16, page_size=4)
    kv.allocate(0, 40)
    assert kv.dropped_pages(0) == 0 and kv.index_for([(0, 39, 1)]).k_rope_pos_offset == [0]


def test_paired_pools_grow_together_and_only_the_local_one_slides():
    from wick.engine.kv_cache import PairedKVCache

    kv = PairedKVCache(KVCache(num_pages=16, page_size=4), KVCache(4, 4, window=6))
    for target in range(1, 41):
        assert kv.can_allocate(0, target)
        kv.allocate(0, target)
        index = kv.index_for([(0, target - 1, 1)])
        assert index.page_indptr == [0, -(-target // 4)]  # the main pool keeps every page
        local = index.window
        assert len(local.page_values) <= 3 and local.k_rope_pos_offset == [
            kv.local.dropped_pages(0) * 4]
        assert local.q_positions == index.q_positions == [target - 1]
    assert kv.main.free_pages == 6 and kv.local.free_pages >= 1
    assert not kv.can_allocate(0, 65)  # the main pool is full: 16 pages of 4
    kv.free(0)
    assert kv.main.free_pages == 16 and kv.local.free_pages == 4
