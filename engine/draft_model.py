"""A smaller model drafting for the engine's model (speculative decoding, issue #28): the
``draft`` method. Typically the same model compiled to 4 bits drafting for its f32/f16/8-bit
self (wick compiles every variant of a model), or a smaller model of the same family.

The drafter keeps a mirror of each generating sequence in its own KV pool, on its own runner.
Every engine step it first brings each mirror to the sequence's tokens (the K/V of drafts the
engine rejected is cut off, the tokens it kept and the one it sampled are computed, in chunks
of the draft model's prefill), then runs greedy decode steps, all mirrors batched, until each
has its drafts. Drafts are greedy (a point mass): the verify step's sample-and-compare keeps
the engine's output exact, greedy or sampled (engine/speculative.py).

Its routines are step generators (``Steps``): they yield the drafter's batches and are sent
each one's sampled tokens, so that one body serves a runner that steps at once (``drive``) and
one whose step is awaited (``drive_async``: the browser's WebGPU reads back through a
promise)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from collections.abc import Sequence as Seq
from contextlib import closing
from dataclasses import dataclass, field
from typing import TypeVar

from .batch import Batch, SamplingRow
from .kv_cache import kv_cache_for
from .model_info import ModelInfo

CATCH_UP_ROWS = 16  # at most this many new tokens of a mirror go in as one-token entries

T = TypeVar("T")
Steps = Generator[Batch, list, T]  # yields a batch, is sent its sampled tokens, returns T


def drive(steps: Steps[T], step: Callable[[Batch], list]) -> T:
    """Run ``steps`` with a runner that steps at once (a step's failure closes them)."""
    with closing(steps):
        result = None
        while True:
            try:  # (only the routine's own end is caught: a step's errors propagate)
                batch = steps.send(result)
            except StopIteration as done:
                return done.value
            result = step(batch)


async def drive_async(steps: Steps[T], step: Callable[[Batch], Awaitable[list]]) -> T:
    """Run ``steps`` with a runner whose step is awaited."""
    with closing(steps):
        result = None
        while True:
            try:
                batch = steps.send(result)
            except StopIteration as done:
                return done.value
            result = await step(batch)


@dataclass(slots=True)
class _Mirror:
    tokens: list[int] = field(default_factory=list)  # the sequence's, then the drafts
    computed: int = 0  # leading tokens whose K/V the draft pool holds
    drafts: list[int] = field(default_factory=list)
    wanted: int = 0


class DraftModel:
    """The drafting model's runner (a ``Runner`` over its own artifact) and KV pool."""

    def __init__(self, runner, info: ModelInfo, num_pages: int, location: str = "") -> None:
        self.runner = runner
        self.info = info
        self.location = location  # the draft artifact's directory (``wick serve`` hosts it)
        self.kv = kv_cache_for(info.page_size, num_pages, window=info.kv_window,
                               window_pool=info.kv_window_pool,
                               num_window_pages=getattr(runner, "num_window_pages", 0),
                               prefix_cache=False)
        self._mirrors: dict[int, _Mirror] = {}
        # what one draft costs, all told: the drafting's time over the drafts it made (its
        # steps, the catch-up on kept tokens, the host's work), a running mean (draft length)
        self.seconds_per_draft = 0.0
        self.num_proposals = 0

    def check_vocabulary(self, target: ModelInfo) -> None:
        """The drafter must speak the target's tokens."""
        from .errors import InvalidRequestError

        if self.info.vocab_size != target.vocab_size:
            raise InvalidRequestError(
                f"the draft model {self.info.model_id} has a vocabulary of "
                f"{self.info.vocab_size} tokens, {target.model_id} one of {target.vocab_size}: "
                "a draft model must share the model's tokenizer", param="speculative",
                code="draft_vocabulary")

    def release(self, seq_id: int) -> None:
        """Forget a sequence (finished or aborted): its pages go back."""
        if self._mirrors.pop(seq_id, None) is not None and self.kv.has(seq_id):
            self.kv.free(seq_id)

    def prefill_steps(self, prompts: dict[int, Seq[int]]) -> Steps[None]:
        """Compute new sequences' prompts (``{seq_id: prompt tokens}``; all but the last
        token, which drafting computes again for its logits) while the engine computes them,
        before their first token, as vLLM's drafters do: the draft model's prompt then counts
        to the time to first token instead of delaying the first drafts."""
        active = []
        for sid, tokens in prompts.items():
            m = self._mirrors.setdefault(sid, _Mirror())
            if m.computed == 0 and len(tokens) > 1:
                m.tokens, m.drafts, m.wanted = list(tokens[:-1]), [], 0
                active.append(sid)
        while active:
            batch_of = self._batch(active)
            if batch_of is None:
                break
            batch, chunks = batch_of
            yield batch  # (no sample rows)
            for sid, num_new, _ in chunks:
                self._mirrors[sid].computed += num_new
            active = [sid for sid in active
                      if self._mirrors[sid].computed < len(self._mirrors[sid].tokens)]

    def propose_steps(self, wanted: dict[int, tuple[Seq[int], int]]) -> Steps[dict[int, list[int]]]:
        """``{seq_id: (its tokens, how many drafts)}`` -> ``{seq_id: drafts}`` (fewer, or
        none, where the draft pool is full)."""
        t0 = time.perf_counter()
        for sid, (tokens, k) in wanted.items():
            m = self._mirrors.setdefault(sid, _Mirror())
            common = 0
            for a, b in zip(m.tokens[:m.computed], tokens[:-1]):
                if a != b:
                    break
                common += 1  # (the last token is computed again: its logits draft)
            if m.computed > common:
                self.kv.truncate(sid, common)  # drafts the engine did not keep
                m.computed = common
            # no position past the draft model's window
            k = max(0, min(k, self.info.context_window - len(tokens)))
            m.tokens, m.drafts, m.wanted = list(tokens), [], k
        active = [sid for sid in wanted if self._mirrors[sid].wanted > 0]
        while active:
            batch_of = self._batch(active)
            if batch_of is None:
                break
            batch, chunks = batch_of
            sampled = yield batch
            samples = iter(sampled)
            for sid, num_new, samples_here in chunks:
                m = self._mirrors[sid]
                m.computed += num_new
                if samples_here:
                    token = _token(next(samples))
                    m.drafts.append(token)
                    m.tokens.append(token)
            active = [sid for sid in active if len(self._mirrors[sid].drafts)
                      < self._mirrors[sid].wanted]
        made = sum(len(self._mirrors[sid].drafts) for sid in wanted)
        if made:
            # (the first is cold, as a first step of any shape: not timed, or it would make
            # drafts look dear until the drafter, drafting less, never learns otherwise)
            self.num_proposals += 1
            if self.num_proposals > 1:
                seconds = (time.perf_counter() - t0) / made
                self.seconds_per_draft += (seconds - self.seconds_per_draft) / min(
                    self.num_proposals - 1, 20)
        return {sid: self._mirrors[sid].drafts for sid in wanted}

    def _batch(self, active: list[int]) -> tuple[Batch, list] | None:
        """The next step of the drafter: each active mirror's tokens to compute (in chunks of
        the draft model's prefill). A few tokens (the tokens a verify step kept) go in as one
        one-token entry each, as a verify step does, so that the step runs the decode plan:
        in the tiled prefill plan two tokens cost as much as a whole tile (2.5 decode steps,
        SmolLM2 q4f32_1 on a CPU)."""
        budget = self.info.prefill_chunk_size
        rows_left = self.info.max_batch_size  # (the compiled bound on a step's entries)
        entries, token_ids, seq_ids, sample_rows, chunks = [], [], [], [], []
        decode_only = True  # (every mirror's tokens went in as one-token entries)
        for sid in active:
            m = self._mirrors[sid]
            num_new = min(len(m.tokens) - m.computed, budget)
            if num_new < 1 or rows_left < 1:
                continue
            target = m.computed + num_new
            if not self.kv.can_allocate(sid, target):
                m.wanted = len(m.drafts)  # the pool is full: this sequence drafts no more
                continue
            self.kv.allocate(sid, target)
            one_token_entries = num_new <= rows_left and num_new <= CATCH_UP_ROWS
            for start, n in ([(p, 1) for p in range(m.computed, target)] if one_token_entries
                             else [(m.computed, num_new)]):
                seq_ids.append(sid)
                entries.append((sid, start, n))
            rows_left -= num_new if one_token_entries else 1
            decode_only = decode_only and one_token_entries
            samples_here = target == len(m.tokens) and len(m.drafts) < m.wanted
            if samples_here:
                sample_rows.append(len(seq_ids) - 1)  # (the last entry's row)
            token_ids.extend(m.tokens[m.computed:target])
            chunks.append((sid, num_new, samples_here))
            budget -= num_new
            if budget < 1:
                break
        if not entries:
            return None
        batch = Batch(seq_ids=seq_ids, token_ids=token_ids, kv=self.kv.index_for(entries),
                      sample_rows=sample_rows,
                      sampling=[SamplingRow(temperature=0.0, top_p=1.0, top_k=0, uniform=0.0)
                                for _ in sample_rows],
                      decode_only=decode_only)
        return batch, chunks


def _token(entry) -> int:
    return int(getattr(entry, "token", entry))
