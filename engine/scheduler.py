"""Decides each step: which sequences prefill (chunked), which decode, who is preempted.

It never touches the GPU; its output is a ``Batch`` (``batch.py``). Policy, in this order:

1. Running sequences, oldest first: each gets its remaining known tokens (a decode = 1 token, a
   chunked prefill = the rest of its prompt) within the step's token budget. When the page pool
   cannot hold a chunk, the NEWEST running sequence is preempted by recompute (its pages freed,
   back to the front of the waiting queue, its KV recomputed later) until it can.
2. Waiting sequences, first come first served, while the budget, ``max_batch_size`` and the page
   pool allow (not in a step that had to preempt: the pool is known to be short).

Prefix caching (when the cache has it on, see ``kv_cache``): a sequence admitted from the
queue first takes the pages the cache holds for its tokens and computes only the rest; a
preempted one gets back what is still cached. Pages are offered to the cache once computed:
at the start of each step for running sequences, and when one finishes or is preempted.
Choices 1..n-1 of a request wait in the queue until choice 0 has computed the prompt's full
pages, then share them.

Mixed prefill + decode batches are the normal case. A sequence samples in a step only when its
chunk reaches the end of its known tokens; a prompt chunk that is not the last samples nothing.

``separate_prefill=True`` (batch-invariant mode) never mixes them: a step is either prompt work
only, or one new token for each generating sequence only (``Batch.decode_only``); when both
wait, they take turns. Then a generating sequence's tokens always run through the same
kernels, whatever else is scheduled.
"""

from __future__ import annotations

from collections import deque

from .batch import Batch
from .errors import KVCacheFullError
from .kv_cache import NO_HIT, KVCache, extend_page_digests, pages_for
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, kv: KVCache, *, max_batch_size: int, prefill_chunk_size: int,
                 separate_prefill: bool = False, vocab_size: int = 0) -> None:
        if max_batch_size < 1 or prefill_chunk_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} and prefill_chunk_size="
                             f"{prefill_chunk_size} must be >= 1")
        self.kv = kv
        self.max_batch_size = max_batch_size
        # new tokens per step, all sequences together (the compiled prefill's bound, or less)
        self.prefill_chunk_size = prefill_chunk_size
        self.separate_prefill = separate_prefill
        self.mask_words = (vocab_size + 31) // 32  # a grammar bitmask's words (prompt rows)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self.num_preemptions = 0
        self._last_was_decode = False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        most = len(seq.prompt_ids) + seq.max_output_tokens
        limit = self.kv.sequence_tokens(self.prefill_chunk_size)
        if limit is not None and pages_for(most, self.kv.page_size) > self.kv.num_pages:
            # The core checks this first; a sequence that could never fit would hang forever.
            raise KVCacheFullError(
                f"sequence {seq.seq_id} may grow to {most} tokens but the KV cache holds "
                f"{self.kv.capacity_tokens}"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Forget a finished or aborted sequence and give back its pages."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._commit(seq)
        self.kv.free(seq.seq_id)

    def next_step_decodes(self) -> bool:
        """Whether the next step gives generating sequences their next token (in
        batch-invariant mode prompt steps and decode steps take turns): only then are drafts
        worth proposing."""
        if not self.separate_prefill:
            return True
        return self._decode_step() is not False

    def _decode_step(self) -> bool | None:
        """None: a mixed step; else whether the step is a decode step."""
        if not self.separate_prefill:
            return None
        generating = any(_generating(s) for s in self.running)
        prompts = bool(self.waiting) or any(not _generating(s) for s in self.running)
        return generating and (not prompts or not self._last_was_decode)

    def schedule(self) -> Batch | None:
        """The next step's batch, or None when there is nothing to run."""
        for seq in self.running:
            self._commit(seq)
        decode_step = self._decode_step()
        if decode_step is not None:
            self._last_was_decode = decode_step
        budget = self.prefill_chunk_size
        chunks: list[tuple[Sequence, int, list[int]]] = []  # (sequence, new tokens, drafts)
        rows = 0  # entries of the step so far (the compiled bound: max_batch_size)
        preempted = False

        i = 0
        while i < len(self.running) and rows < self.max_batch_size and budget > 0:
            seq = self.running[i]
            if decode_step is not None and _generating(seq) != decode_step:
                i += 1  # not this step's kind
                continue
            num_new = self._prompt_rows_cap(
                seq, seq.num_computed_tokens, min(seq.num_uncomputed_tokens, budget), rows)
            if num_new < 1:
                break  # the step's entries are used up
            target = seq.num_computed_tokens + num_new
            drafts = self._drafts(seq, num_new, budget, rows)
            if drafts:  # verified only where the pool has room now: never preempt for them
                drafts = drafts if self.kv.can_allocate(seq.seq_id, target + len(drafts)) else []
            while not drafts and not self.kv.can_allocate(seq.seq_id, target):
                if len(self.running) == 1:
                    raise KVCacheFullError(
                        f"sequence {seq.seq_id} needs room for {target} tokens; the KV cache "
                        f"holds {self.kv.capacity_tokens}"
                    )
                self._preempt(self.running[-1])  # the newest; never one scheduled already
                preempted = True
                if seq.status is not SequenceStatus.RUNNING:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # it preempted itself: it was the newest
            self.kv.allocate(seq.seq_id, target + len(drafts))
            chunks.append((seq, num_new, drafts))
            budget -= num_new + len(drafts)
            rows += len(drafts) + (
                num_new if _reads_prompt_logprobs(seq, seq.num_computed_tokens) else 1)
            i += 1

        while (not preempted and not decode_step and self.waiting
               and rows < self.max_batch_size and budget > 0):
            seq = self.waiting[0]
            if self._waits_for_leader(seq):
                break  # FIFO: nobody overtakes the head of the queue
            hit = NO_HIT
            if seq.params.prompt_logprobs < 0 and not seq.embed:  # (prompt logprobs need every position's logits)
                hit = self.kv.lookup(
                    self._digests(seq, (seq.num_tokens - 1) // self.kv.page_size),
                    seq.num_tokens)
            num_new = self._prompt_rows_cap(seq, hit.num_tokens,
                                            min(seq.num_tokens - hit.num_tokens, budget), rows)
            if num_new < 1 or (seq.embed and num_new < seq.num_tokens):
                break  # (an embedding input is one step's, whole: it waits for a step with room)
            if not self.kv.can_allocate(seq.seq_id, hit.num_tokens + num_new, hit):
                break
            self.waiting.popleft()
            self.kv.allocate(seq.seq_id, hit.num_tokens + num_new, hit)
            seq.num_computed_tokens = hit.num_tokens
            if not seq.num_preemptions:
                seq.num_cached_tokens = hit.num_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chunks.append((seq, num_new, []))
            budget -= num_new
            rows += num_new if _reads_prompt_logprobs(seq, hit.num_tokens) else 1

        if not chunks:
            return None
        return self._batch(chunks, decode_only=all(_generating(seq) for seq, _, _ in chunks))

    def _prompt_rows_cap(self, seq: Sequence, start: int, num_new: int, rows: int) -> int:
        """A chunk's new tokens, for a sequence whose prompt logprobs are asked: each prompt
        token whose logprob is still to read is an entry of its own (its logits are read), so
        the step's entry bound caps the chunk, and the prefill ends at ``seq.prompt_end``.
        Positions read before (a preempted sequence recomputes them) are an ordinary chunk."""
        if not _reads_prompt_logprobs(seq, start):
            read = seq.num_prompt_logprobs_read
            return min(num_new, read - start) if start < read else num_new
        return min(num_new, seq.prompt_end - start, self.max_batch_size - rows)

    def _drafts(self, seq: Sequence, num_new: int, budget: int, rows: int) -> list[int]:
        """The proposed drafts (``seq.spec_token_ids``) this step can verify: a generating
        sequence's, as many as the step's token budget and its compiled entry bound allow."""
        drafts = seq.spec_token_ids
        if not drafts or num_new != 1 or seq.num_uncomputed_tokens != 1:
            return []
        # (a sliding window is no bound: the pages that leave it when the sequence grows are
        # those before the window of its first entry, KVCache.allocate)
        room = min(len(drafts), budget - 1, self.max_batch_size - rows - 1)
        return drafts[:room] if room > 0 else []

    def _digests(self, seq: Sequence, num_pages: int) -> list[bytes]:
        if not self.kv.prefix_cache:
            return []
        return extend_page_digests(seq.page_digests, seq.token_ids, self.kv.page_size, num_pages)

    def _commit(self, seq: Sequence) -> None:
        """Offer the cache the sequence's computed full pages (never an encoder input's: its
        K/V depend on the tokens after them too)."""
        if self.kv.prefix_cache and not seq.embed:
            full = seq.num_computed_tokens // self.kv.page_size
            self.kv.commit(seq.seq_id, self._digests(seq, full), seq.num_computed_tokens)

    def _waits_for_leader(self, seq: Sequence) -> bool:
        """Choice i > 0 waits while choice 0 computes the prompt's full pages it will share
        (never for a leader that is not running: that one is queued ahead of it, or done)."""
        lead = seq.leader
        if (lead is None or not self.kv.prefix_cache or seq.params.prompt_logprobs >= 0
                or lead.status is not SequenceStatus.RUNNING):
            return False
        shared = (lead.num_prompt_tokens - 1) // self.kv.page_size * self.kv.page_size
        return lead.num_computed_tokens < shared

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._commit(seq)
        self.kv.free(seq.seq_id)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)  # first in line again: it was admitted before the others

    def _batch(self, chunks: list[tuple[Sequence, int, list[int]]], decode_only: bool) -> Batch:
        token_ids: list[int] = []
        seq_ids: list[int] = []
        entries = []
        sample_rows: list[int] = []
        sampling = []
        spec: dict[int, list[int]] = {}
        prompt_rows: dict[int, int] = {}
        for seq, num_new, drafts in chunks:
            start = seq.num_computed_tokens
            if _reads_prompt_logprobs(seq, start):
                # one entry per prompt token; a row reads the next prompt token's logprob,
                # the last known token's row samples (when the sequence makes output)
                for pos in range(start, start + num_new):
                    if pos + 1 < seq.num_prompt_tokens:
                        sampling.append(seq.prompt_logprob_row(pos, self.mask_words))
                        prompt_rows[seq.seq_id] = prompt_rows.get(seq.seq_id, 0) + 1
                        sample_rows.append(len(seq_ids))
                    elif pos + 1 == seq.num_tokens:
                        sampling.append(seq.sampling_row())
                        sample_rows.append(len(seq_ids))
                    seq_ids.append(seq.seq_id)
                    entries.append((seq.seq_id, pos, 1))
                    token_ids.append(seq.token_ids[pos])
                continue
            if drafts:  # a verify step: one entry per token, each sampling its next token
                spec[seq.seq_id] = drafts
                for j, token in enumerate([seq.token_ids[start], *drafts]):
                    sample_rows.append(len(seq_ids))
                    seq_ids.append(seq.seq_id)
                    entries.append((seq.seq_id, start + j, 1))
                    token_ids.append(token)
                sampling.extend(seq.sampling_rows(drafts))
                continue
            if start + num_new == seq.num_tokens:
                sample_rows.append(len(seq_ids))
                sampling.append(seq.sampling_row())
            seq_ids.append(seq.seq_id)
            entries.append((seq.seq_id, start, num_new))
            token_ids.extend(seq.token_ids[start:start + num_new])
        return Batch(
            seq_ids=seq_ids,
            token_ids=token_ids,
            kv=self.kv.index_for(entries),
            sample_rows=sample_rows,
            sampling=sampling,
            decode_only=decode_only,
            spec_token_ids=spec,
            prompt_rows=prompt_rows,
        )


def _reads_prompt_logprobs(seq: Sequence, start: int) -> bool:
    """Whether a chunk from ``start`` reads prompt logprobs (asked for, and not all read:
    a preempted sequence computes again what it read before as an ordinary chunk)."""
    return (seq.params.prompt_logprobs >= 0 and start < seq.num_prompt_tokens - 1
            and start >= seq.num_prompt_logprobs_read)


def _generating(seq: Sequence) -> bool:
    """Past its prompt: its next step brings the one token it sampled last."""
    return seq.num_computed_tokens >= seq.num_prompt_tokens
