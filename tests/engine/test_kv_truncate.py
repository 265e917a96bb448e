"""KVCache.truncate: a sequence gives back the tail a verify step rejected (speculative
decoding, issue #28). Pages and refcounts stay right and the prefix cache names only tokens
that were accepted, checked against a model of the device's pages under random interleavings
of growth, rejection, commits, prefix hits and frees, with and without a window."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wick.engine.kv_cache import (KVCache, PairedKVCache, extend_page_digests, kv_cache_for,
                                  pages_for)

PS = 4


def digests_of(tokens: list[int]) -> list[bytes]:
    return extend_page_digests([], tokens, PS, len(tokens) // PS)


def test_rejected_drafts_give_back_their_pages_and_only_accepted_tokens_are_cached():
    kv = KVCache(8, PS)
    prompt = list(range(10))
    kv.allocate(1, len(prompt) + 5)  # the prompt and 5 drafted tokens: 15 slots, 4 pages
    assert len(kv.page_table(1)) == 4 and kv.free_pages == 4
    kv.truncate(1, 12)  # 2 drafts accepted
    assert kv.num_tokens(1) == 12 and len(kv.page_table(1)) == 3 and kv.free_pages == 5
    accepted = prompt + [100, 101]
    kv.commit(1, digests_of(accepted), 12)
    hit = kv.lookup(digests_of(accepted), 12)
    assert hit.num_tokens == 8 and hit.pages == kv.page_table(1)[:2]  # the last token computes
    with pytest.raises(ValueError, match="prefix cache"):
        kv.truncate(1, 11)  # page 2 is cached: never written again
    kv.truncate(1, 12)  # nothing to cut
    kv.free(1)
    assert kv.free_pages + kv.cached_pages == kv.num_pages and kv.cached_pages == 3


def test_truncation_is_refused_beyond_what_the_sequence_holds():
    kv = KVCache(8, PS)
    with pytest.raises(ValueError, match="holds no pages"):
        kv.truncate(1, 0)
    kv.allocate(1, 6)
    with pytest.raises(ValueError, match="cannot truncate 6 tokens to 7"):
        kv.truncate(1, 7)
    kv.truncate(1, 0)
    assert kv.page_table(1) == () and kv.free_pages == 8 and kv.has(1)
    kv.allocate(1, 3)  # and it grows again from there
    assert len(kv.page_table(1)) == 1


def test_a_window_cannot_be_cut_back_past_the_keys_it_gave_up():
    kv = KVCache(8, PS, window=6)
    kv.allocate(1, 12)
    kv.allocate(1, 20)  # the query at 12 sees keys from 7 on: page 0 (keys 0-3) went back
    assert kv.dropped_pages(1) == 1
    with pytest.raises(ValueError, match="left the cache"):
        kv.truncate(1, 7)  # a query at 7 needs keys from 2 on
    kv.truncate(1, 9)  # one at 9 from 4 on
    assert kv.num_tokens(1) == 9 and len(kv.page_table(1)) == 2


def test_paired_pools_cut_both_or_neither():
    kv = kv_cache_for(PS, 8, window_pool=6, num_window_pages=6)
    assert isinstance(kv, PairedKVCache)
    kv.allocate(1, 12)
    kv.allocate(1, 20)
    with pytest.raises(ValueError, match="left the cache"):
        kv.truncate(1, 7)  # the main pool could, the local one cannot
    assert kv.main.num_tokens(1) == kv.local.num_tokens(1) == 20
    kv.truncate(1, 13)
    assert kv.main.num_tokens(1) == kv.local.num_tokens(1) == 13
    assert len(kv.main.page_table(1)) == 4


# ---------------------------------------------------------------------------------------------
# Random interleavings against a model of the device


class Device:
    """What each page slot holds, as sequences write the tokens they compute; the sequences'
    own view (tokens so far, how many are accepted and offered to the cache)."""

    def __init__(self, kv: KVCache) -> None:
        self.kv = kv
        self.slots: dict[int, list[int | None]] = {p: [None] * PS for p in range(kv.num_pages)}
        self.tokens: dict[int, list[int]] = {}
        self.offered: dict[int, int] = {}  # seq -> leading pages offered (or taken from) the cache
        self.named: dict[bytes, tuple[int, ...]] = {}  # digest -> the tokens of its page

    def write(self, seq: int, start: int) -> None:
        """The sequence computes its tokens from ``start`` on: they land in its pages."""
        table, dropped = self.kv.page_table(seq), self.kv.dropped_pages(seq)
        for pos in range(start, len(self.tokens[seq])):
            page = table[pos // PS - dropped]
            assert not self.kv.is_cached(page), "a cached page was written"
            self.slots[page][pos % PS] = self.tokens[seq][pos]

    def commit(self, seq: int, accepted: int) -> None:
        tokens = self.tokens[seq][:accepted]
        digests = digests_of(tokens)
        for j, d in enumerate(digests):
            self.named[d] = tuple(tokens[j * PS:(j + 1) * PS])
        self.kv.commit(seq, digests, accepted)
        self.offered[seq] = max(self.offered.get(seq, 0), accepted // PS)

    def check(self) -> None:
        kv = self.kv
        held: dict[int, int] = {}
        for seq in self.tokens:
            table = kv.page_table(seq)
            assert kv.num_tokens(seq) == len(self.tokens[seq])
            assert len(table) == max(0, pages_for(len(self.tokens[seq]), PS)
                                     - kv.dropped_pages(seq))
            for p in table:
                held[p] = held.get(p, 0) + 1
        for p in range(kv.num_pages):
            assert kv.refcount(p) == held.get(p, 0)
        assert kv.free_pages + kv.cached_pages + len(held) == kv.num_pages
        for digest, page in kv._page_of.items():  # the cache names what the page holds
            assert tuple(self.slots[page]) == self.named[digest]


BASES = ([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9])
OPS = st.tuples(st.sampled_from(["start", "draft", "verify", "commit", "free"]),
                st.integers(0, 2), st.integers(0, 40), st.integers(0, 8))


@pytest.mark.parametrize("window", [None, 9])
@given(ops=st.lists(OPS, max_size=60))
@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_random_speculation_keeps_pages_refcounts_and_the_cache_right(window, ops):
    kv = KVCache(16, PS, window=window)
    dev = Device(kv)
    for op, seq, a, b in ops:
        if op == "start" and seq not in dev.tokens:
            prompt = BASES[a % 2][:5 + b % 5] + [50 + a % 3]
            hit = kv.lookup(digests_of(prompt), len(prompt))
            if not kv.can_allocate(seq, len(prompt), hit):
                continue
            kv.allocate(seq, len(prompt), hit)
            dev.tokens[seq] = list(prompt)
            dev.offered[seq] = hit.num_tokens // PS
            dev.write(seq, hit.num_tokens)
            dev.commit(seq, len(prompt))
        elif seq not in dev.tokens:
            continue
        elif op == "draft":  # k drafted tokens computed in one verify step
            k = 1 + b % 6
            if not kv.can_allocate(seq, len(dev.tokens[seq]) + k):
                continue
            start = len(dev.tokens[seq])
            kv.allocate(seq, start + k)
            dev.tokens[seq] += [100 + (a + i) % 7 for i in range(k)]
            dev.write(seq, start)
        elif op == "verify":  # the tail past n rejected
            n = a % (len(dev.tokens[seq]) + 1)
            first_key = kv.dropped_pages(seq) * PS
            allowed = n >= dev.offered[seq] * PS and (
                window is None or max(0, n - window + 1) >= first_key)
            if not allowed:
                with pytest.raises(ValueError):
                    kv.truncate(seq, n)
            else:
                kv.truncate(seq, n)
                del dev.tokens[seq][n:]
        elif op == "commit":
            dev.commit(seq, len(dev.tokens[seq]) - b % 3 if len(dev.tokens[seq]) > 2 else 0)
        elif op == "free":
            kv.free(seq)
            del dev.tokens[seq], dev.offered[seq]
        dev.check()
    for seq in list(dev.tokens):
        kv.free(seq)
    assert kv.free_pages + kv.cached_pages == kv.num_pages
