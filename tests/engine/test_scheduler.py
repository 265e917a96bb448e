from __future__ import annotations

import pytest

from engine_fakes import ByteTokenizer
from wick.engine import (
    IncrementalDetokenizer,
    KVCache,
    KVCacheFullError,
    SamplingParams,
    Scheduler,
    Sequence,
    SequenceStatus,
)


def make_seq(seq_id: int, prompt_len: int, max_output: int = 8) -> Sequence:
    prompt = [97 + (seq_id + i) % 26 for i in range(prompt_len)]
    return Sequence(
        seq_id=seq_id, request_id=f"r{seq_id}", index=0, prompt_ids=prompt,
        params=SamplingParams(temperature=0.0, seed=seq_id), max_output_tokens=max_output,
        detokenizer=IncrementalDetokenizer(ByteTokenizer(), prompt),
    )


def run_step(sched: Scheduler, token: int = 120):
    """Schedule, then do what the core does after the runner: advance and append samples."""
    batch = sched.schedule()
    if batch is None:
        return None
    qo = batch.kv.qo_indptr
    by_id = {s.seq_id: s for s in [*sched.running, *sched.waiting]}
    for i, sid in enumerate(batch.seq_ids):
        by_id[sid].num_computed_tokens += qo[i + 1] - qo[i]
    for row in batch.sample_rows:
        by_id[batch.seq_ids[row]].append_token(token)
    return batch


def chunk_sizes(batch) -> list[int]:
    qo = batch.kv.qo_indptr
    return [qo[i + 1] - qo[i] for i in range(len(batch.seq_ids))]


def test_chunked_prefill_respects_the_budget_and_samples_only_at_the_end():
    sched = Scheduler(KVCache(64, 4), max_batch_size=4, prefill_chunk_size=8)
    seq = make_seq(0, 20)
    sched.add(seq)
    sizes, samples = [], []
    for _ in range(3):
        batch = run_step(sched)
        sizes.append(chunk_sizes(batch))
        samples.append(batch.sample_rows)
        assert batch.num_tokens <= 8
    assert sizes == [[8], [8], [4]]
    assert samples == [[], [], [0]]  # only the last prompt chunk samples
    assert seq.num_computed_tokens == 20 and seq.num_output_tokens == 1
    batch = run_step(sched)  # now it decodes its sampled token
    assert chunk_sizes(batch) == [1] and batch.kv.q_positions == [20]
    assert batch.token_ids == [120]


def test_decodes_and_a_new_prefill_share_a_step():
    sched = Scheduler(KVCache(64, 4), max_batch_size=4, prefill_chunk_size=8)
    a, b = make_seq(0, 3), make_seq(1, 3)
    sched.add(a)
    sched.add(b)
    batch = run_step(sched)
    assert batch.seq_ids == [0, 1] and batch.sample_rows == [0, 1]
    c = make_seq(2, 10)
    sched.add(c)
    batch = run_step(sched)
    # a and b decode (1 token each, oldest first), c prefills with the remaining 6 of 8.
    assert batch.seq_ids == [0, 1, 2]
    assert chunk_sizes(batch) == [1, 1, 6]
    assert batch.sample_rows == [0, 1]  # c's chunk is not its last
    assert batch.kv.q_positions[:2] == [3, 3]
    batch = run_step(sched)
    assert chunk_sizes(batch) == [1, 1, 4] and batch.sample_rows == [0, 1, 2]


def test_max_batch_size_limits_sequences_per_step():
    sched = Scheduler(KVCache(64, 4), max_batch_size=2, prefill_chunk_size=100)
    for i in range(3):
        sched.add(make_seq(i, 2))
    batch = run_step(sched)
    assert batch.seq_ids == [0, 1]
    assert [s.seq_id for s in sched.waiting] == [2]
    assert run_step(sched).seq_ids == [0, 1]  # running ones keep their slots


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_preemption_frees_the_newest_and_requeues_it_first(prefix_cache):
    # 4 pages of 4 tokens = 16 slots. Two 7-token prompts take 2 pages each.
    kv = KVCache(4, 4, prefix_cache=prefix_cache)
    sched = Scheduler(kv, max_batch_size=4, prefill_chunk_size=32)
    a, b = make_seq(0, 7), make_seq(1, 7)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both prefill: 8 tokens known each, 7 cached
    assert kv.free_pages == 0
    batch = run_step(sched)  # both decode position 7: still fits in 2 pages each
    assert batch.seq_ids == [0, 1] and kv.free_pages == 0
    batch = run_step(sched)  # position 8 needs a third page: b (newest) is preempted
    assert batch.seq_ids == [0]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0
    assert b.num_preemptions == 1 and sched.num_preemptions == 1
    assert list(sched.waiting) == [b]
    assert kv.page_table(1) == () and len(kv.page_table(0)) == 3
    sched.remove(a)  # a finishes: b comes back and recomputes prompt + its 2 outputs
    # ... except, with the prefix cache, its first page: a's third page evicted b's second
    # (released tail first), and its first was still cached
    batch = run_step(sched)
    reused = 4 if prefix_cache else 0
    assert batch.seq_ids == [1] and chunk_sizes(batch) == [9 - reused]
    assert batch.token_ids == b.token_ids[reused:9] and batch.sample_rows == [0]
    assert batch.kv.q_positions == list(range(reused, 9))
    assert b.num_cached_tokens == 0  # usage counts what the prompt found the first time


def test_a_sequence_that_can_never_fit_fails_at_add():
    sched = Scheduler(KVCache(2, 4), max_batch_size=4, prefill_chunk_size=32)
    with pytest.raises(KVCacheFullError, match="may grow to 9 tokens but the KV cache holds 8"):
        sched.add(make_seq(0, 5, max_output=4))
    assert not sched.has_work


def blake2b_uniform(seed: int, choice: int, position: int) -> float:
    """The rule as stated (engine/sequence.py): 53 bits of a keyed BLAKE2b of the position."""
    import hashlib

    key = hashlib.blake2b(f"wick-sampling/{seed}/{choice}".encode(), digest_size=32).digest()
    h = hashlib.blake2b(position.to_bytes(8, "little"), key=key, digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / 2 ** 53


def test_each_sample_uses_the_uniform_of_its_seed_and_position_whatever_the_batch():
    alone = Scheduler(KVCache(64, 4), max_batch_size=4, prefill_chunk_size=64)
    alone.add(make_seq(5, 3))
    draws = [run_step(alone).sampling[0].uniform for _ in range(3)]
    assert draws == [blake2b_uniform(5, 0, i) for i in range(3)]
    # beside other sequences, and after a step that was scheduled and then undone
    mixed = Scheduler(KVCache(64, 4), max_batch_size=4, prefill_chunk_size=64)
    for i in (1, 5, 9):
        mixed.add(make_seq(i, 3 + i))
    mixed.schedule()  # undone: nothing computed, nothing appended
    got = []
    for _ in range(3):
        batch = run_step(mixed)
        got.append(batch.sampling[batch.sample_rows.index(batch.seq_ids.index(5))].uniform)
    assert got == draws


def test_uniforms_are_uniform_and_differ_by_seed_and_choice():
    from wick.engine.sequence import sampling_key, uniform_at

    key = sampling_key(7, 0)
    draws = [uniform_at(key, i) for i in range(20000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    counts = [0] * 10
    for u in draws:
        counts[int(u * 10)] += 1
    chi2 = sum((c - 2000) ** 2 / 2000 for c in counts)
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001
    others = {uniform_at(sampling_key(7, 1), 0), uniform_at(sampling_key(8, 0), 0), draws[0]}
    assert len(others) == 3
    assert uniform_at(sampling_key(None, 0), 0) != uniform_at(sampling_key(None, 0), 0)


def test_separate_prefill_never_mixes_and_takes_turns():
    """Batch-invariant mode: a step is prompt work only or one token per generating sequence
    only (marked decode_only); with both pending they alternate, so neither starves."""
    sched = Scheduler(KVCache(256, 4), max_batch_size=8, prefill_chunk_size=16, separate_prefill=True)
    first = make_seq(0, 5, max_output=20)
    sched.add(first)
    batch = run_step(sched)
    assert not batch.decode_only and chunk_sizes(batch) == [5]
    for i in range(1, 4):  # prompts keep arriving while `first` generates
        sched.add(make_seq(i, 30, max_output=20))
    kinds = []
    for _ in range(16):
        batch = run_step(sched)
        by_id = {s.seq_id: s for s in sched.running}
        sizes = chunk_sizes(batch)
        if batch.decode_only:
            assert set(sizes) == {1}
            # every row a generating sequence, none of them mid-prompt
            assert all(by_id[s].num_computed_tokens > by_id[s].num_prompt_tokens
                       for s in batch.seq_ids)
        else:
            assert all(by_id[s].num_computed_tokens <= by_id[s].num_prompt_tokens
                       for s in batch.seq_ids)
        kinds.append("d" if batch.decode_only else "p")
    assert kinds[:4] == ["d", "p", "d", "p"], kinds  # turns while prompts wait
    assert "dd" in "".join(kinds)  # once every prompt is in, decode steps only
    # the mixed scheduler marks a step decode_only only when it happens to be one
    mixed = Scheduler(KVCache(64, 4), max_batch_size=4, prefill_chunk_size=16)
    mixed.add(make_seq(9, 3, max_output=8))
    assert not run_step(mixed).decode_only  # the prompt
    assert run_step(mixed).decode_only  # its first decode
    mixed.add(make_seq(10, 3))
    batch = run_step(mixed)
    assert chunk_sizes(batch) == [1, 3] and not batch.decode_only  # decode and prompt mixed
