"""One generated continuation: its tokens, status, sampling state and detokenizer state.

A request holds ``n`` sequences. A sequence is passed through the whole engine: the scheduler
reads its token counts, the KV cache keys its page table by ``seq_id``, the core appends sampled
tokens and runs its detokenizer and stop checks.
"""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from .batch import MAX_TOP_LOGPROBS, SamplingRow
from .detokenize import IncrementalDetokenizer, StopStringFilter
from .grammar import GrammarMatcher
from .speculative import SequenceDrafter


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples and when it stops (already validated by the protocol layer)."""

    temperature: float = 1.0  # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 -> off
    max_tokens: int | None = None  # None -> until the context window (or the KV pool) is full
    stop: tuple[str, ...] = ()  # stop strings: never emitted
    stop_token_ids: tuple[int, ...] = ()  # e.g. the model's EOS ids: end with "stop", not emitted
    seed: int | None = None  # None -> fresh entropy
    min_p: float = 0.0  # 0 -> off
    # OpenAI: logit - frequency_penalty * count - presence_penalty * (count > 0), count = times
    # the token occurs in the output so far
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # transformers / vLLM: a token seen in the prompt or the output has its logit divided by
    # this (multiplied when negative); 1 -> off
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to the logit
    logprobs: bool = False  # return the sampled token's logprob
    top_logprobs: int = 0  # and this many most likely tokens' (needs logprobs)
    # -1: none; k >= 0: each prompt token's logprob (after the first) and the k most likely
    # tokens' at its position (the completions API's echo; max_tokens may then be 0)
    prompt_logprobs: int = -1
    # False: special tokens are text too (a harmony reply's markers, split off by the chat API)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        least = 0 if self.prompt_logprobs >= 0 else 1
        if self.max_tokens is not None and self.max_tokens < least:
            raise ValueError(f"max_tokens must be >= {least}, got {self.max_tokens}")
        if not -1 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"prompt_logprobs must be in [-1, {MAX_TOP_LOGPROBS}]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]")

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0)


def logit_adjustments(params: SamplingParams, prompt_tokens: frozenset[int],
                      output_counts: dict[int, int]) -> list[tuple[int, float, float]]:
    """The sparse (token, rep, add) entries of one row (see ``SamplingRow.adjust``): every
    token a penalty or bias touches, once, ascending. Costs O(distinct tokens seen), never a
    pass over the vocabulary."""
    p = params
    entries: dict[int, list[float]] = {}
    if p.repetition_penalty != 1.0:
        for t in prompt_tokens.union(output_counts):
            entries[t] = [p.repetition_penalty, 0.0]
    if p.frequency_penalty or p.presence_penalty:
        for t, count in output_counts.items():
            e = entries.setdefault(t, [1.0, 0.0])
            e[1] -= p.frequency_penalty * count + p.presence_penalty
    for t, bias in p.logit_bias:
        entries.setdefault(t, [1.0, 0.0])[1] += bias
    return [(t, rep, add) for t, (rep, add) in sorted(entries.items())]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # no KV in the cache: new, or preempted (its KV will be recomputed)
    RUNNING = "running"  # holds pages; prefilling in chunks or decoding
    FINISHED = "finished"  # see finish_reason


def sampling_key(seed: int | None, index: int) -> bytes:
    """The key of the uniforms of a request's ``index``-th sequence: from its seed (each choice
    its own), or fresh entropy."""
    if seed is None:
        return os.urandom(32)
    return hashlib.blake2b(f"wick-sampling/{seed}/{index}".encode(), digest_size=32).digest()


def uniform_at(key: bytes, position: int) -> float:
    """The uniform in [0, 1) that samples output token ``position`` of the sequence keyed
    ``key``: a function of the position, not the next draw of a stream. A step that samples
    positions it may not keep (speculative verification samples every drafted position, then
    keeps those that agree with the drafts) thus uses the same uniforms a plain step would, so
    seeded sampling gives the same tokens with speculation and without; so does a step begun
    and then undone (an abort, a preemption)."""
    digest = hashlib.blake2b(position.to_bytes(8, "little"), key=key, digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0 ** -53


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int  # unique in the engine; keys the KV page table
    request_id: str
    index: int  # the choice index within its request
    prompt_ids: list[int]
    params: SamplingParams
    max_output_tokens: int  # from max_tokens, the context window and the KV pool; >= 1
    detokenizer: IncrementalDetokenizer
    stop_filter: StopStringFilter = field(init=False)
    token_ids: list[int] = field(init=False)  # prompt + output: what attention must see
    sampling_key: bytes = field(init=False)  # keys its uniforms (uniform_at)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # leading token_ids whose K/V are in the cache
    finish_reason: str | None = None
    num_preemptions: int = 0
    matcher: GrammarMatcher | None = None  # the response format's grammar state, if any
    output_counts: dict[int, int] = field(init=False)  # token -> times in the output
    # prefix caching: the prompt tokens found in the cache when first scheduled (usage's
    # cached_tokens); the chained digests of its full pages (kv_cache.extend_page_digests);
    # and, for choice i > 0 of a request, choice 0, whose computed prompt it waits to share
    num_cached_tokens: int = 0
    page_digests: list[bytes] = field(init=False)
    leader: Sequence | None = None
    # speculation (engine/speculative.py): who drafts for it, and the drafts the core proposed
    # for the next step (the scheduler may verify them or not)
    drafter: SequenceDrafter | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    # prompt logprobs (SamplingParams.prompt_logprobs): positions whose row was read, so far
    num_prompt_logprobs_read: int = 0
    # an embedding input: its whole prompt runs in one step, whose row is its vector
    embed: bool = False
    _prompt_tokens: frozenset[int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sequence needs at least one prompt token")
        least = 0 if self.params.prompt_logprobs >= 0 or self.embed else 1
        if self.max_output_tokens < least:
            raise ValueError(f"max_output_tokens must be >= {least}, got "
                             f"{self.max_output_tokens}")
        self.token_ids = list(self.prompt_ids)
        self.sampling_key = sampling_key(self.params.seed, self.index)
        self.stop_filter = StopStringFilter(self.params.stop)
        self.output_counts = {}
        self.page_digests = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens whose K/V are not cached yet (the whole prompt, or the last sample)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def prompt_end(self) -> int:
        """The tokens its prefill computes: the whole prompt, or, when it makes no output (a
        prompt's logprobs only), all but the last prompt token (whose row would sample)."""
        if self.max_output_tokens or self.embed:
            return self.num_prompt_tokens
        return max(1, self.num_prompt_tokens - 1)

    def prompt_logprob_row(self, position: int, mask_words: int) -> SamplingRow:
        """The row that reads the logprob of prompt token ``position + 1`` from the logits at
        ``position``: its mask allows that token only, so the token "sampled" is the prompt's,
        and the logprobs (of the model's logits, before the mask) are its."""
        token = self.prompt_ids[position + 1]
        mask = bytearray(4 * mask_words)
        mask[token // 8] = 1 << (token % 8)
        return SamplingRow(temperature=0.0, top_p=1.0, top_k=0, uniform=0.0, mask=bytes(mask),
                           num_top_logprobs=self.params.prompt_logprobs)

    def sampling_row(self) -> SamplingRow:
        """The row for this step's sample. Its uniform depends on this sequence's key and the
        position sampled only, so the output does not depend on what else is batched with it."""
        return self.sampling_rows(())[0]

    def sampling_rows(self, drafts: Seq[int]) -> list[SamplingRow]:
        """The rows of a step that verifies ``drafts``: row ``j`` samples the output as it would
        be after ``drafts[:j]`` (its position's uniform, its penalties), so that each is the
        row a plain step would sample there."""
        p = self.params
        counts = self.output_counts
        if p.adjusts_logits and self._prompt_tokens is None:
            self._prompt_tokens = frozenset(self.prompt_ids)
        rows = []
        for j in range(len(drafts) + 1):
            if j and p.adjusts_logits:
                counts = dict(counts) if j == 1 else counts
                counts[drafts[j - 1]] = counts.get(drafts[j - 1], 0) + 1
            rows.append(SamplingRow(
                temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                uniform=uniform_at(self.sampling_key, self.num_output_tokens + j),
                min_p=p.min_p,
                # penalties and bias; the grammar's mask is filled by the core
                adjust=(logit_adjustments(p, self._prompt_tokens, counts)
                        if p.adjusts_logits else []),
                num_top_logprobs=p.top_logprobs if p.logprobs else -1,
            ))
        return rows

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_counts[token_id] = self.output_counts.get(token_id, 0) + 1

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
