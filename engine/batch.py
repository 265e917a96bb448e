"""What one engine step asks the model to do: the Scheduler's output, the Runner's input.

A step runs a ragged batch: every scheduled sequence contributes a chunk of new tokens (a whole
or partial prompt when prefilling, one token when decoding). All chunks are concatenated into one
token array; attention reads each sequence's pages through the index arrays below, which are
exactly the arrays TVM's paged-attention TIR kernels read (``tvm.relax.frontend.nn.llm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs; the logprobs kernel returns this many


@dataclass(slots=True)
class SamplingRow:
    """How to pick the next token of one sequence in this step."""

    temperature: float  # 0 -> greedy (argmax)
    top_p: float  # 1.0 -> off
    top_k: int  # 0 -> off
    uniform: float  # a draw in [0, 1) from the sequence's seeded RNG
    min_p: float = 0.0  # 0 -> off
    # the grammar's allowed tokens: ceil(V / 32) little-endian int32 words, bit i % 32 of word
    # i // 32 set = token i allowed (xgrammar's layout); None -> every token
    mask: bytes | None = None
    # sparse logit adjustments (token, rep, add), token ascending: x -> (x * rep if x < 0 else
    # x / rep) + add on the model's logit (see compiler/logits.py)
    adjust: list[tuple[int, float, float]] = field(default_factory=list)
    # logprobs: -1 none; 0 the sampled token's; k also the k most likely tokens'
    num_top_logprobs: int = -1

    @property
    def needs_processing(self) -> bool:
        return self.mask is not None or bool(self.adjust)


@dataclass(frozen=True, slots=True)
class SampledToken:
    """A sampled token with its logprobs (the model's log-softmax, before any processing),
    for rows that asked for them; ``top`` holds (token, logprob) pairs, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class KVIndex:
    """Index arrays for one step, built by ``KVCache.index_for``. Shapes in comments.

    b = number of sequences in the step, n = total new tokens, page_size = tokens per page.
    """

    qo_indptr: list[int]  # (b+1,) new-token ranges per sequence in the flat token array
    page_indptr: list[int]  # (b+1,) ranges into page_values per sequence
    page_values: list[int]  # (nnz_pages,) page ids of each sequence, in order
    last_page_len: list[int]  # (b,) tokens used in each sequence's last page (after append)
    # (b,) position of each sequence's first listed key: 0, or past the pages a sliding
    # window freed (see KVCache)
    k_rope_pos_offset: list[int]
    q_positions: list[int]  # (n,) absolute position of each new token (RoPE)
    append_slots: list[int]  # (n,) page_id * page_size + slot where each new token's K/V goes
    # a model with two page pools (kv_cache.PairedKVCache): the windowed layers' arrays
    window: "KVIndex | None" = None


@dataclass(slots=True)
class Batch:
    """A verify step (speculation, ``spec_token_ids``) gives a sequence one entry per token
    it checks, and a prefill that returns the prompt's logprobs (``prompt_rows``) one per prompt
    token: its entries are consecutive in ``seq_ids``, one token each, each a sample row."""

    seq_ids: list[int]  # (b,) the sequence of each entry, in step order
    token_ids: list[int]  # (n,) new tokens of all sequences, concatenated
    kv: KVIndex
    sample_rows: list[int] = field(default_factory=list)  # indexes into seq_ids that need a token
    sampling: list[SamplingRow] = field(default_factory=list)  # one per sample_rows entry
    # every row is a generating sequence's one new token (no prompt in the step): the runner
    # then uses its decode plans, else forward
    decode_only: bool = False
    # seq_id -> the drafted tokens this step verifies (after the sequence's last token)
    spec_token_ids: dict[int, list[int]] = field(default_factory=dict)
    # seq_id -> how many of its (leading) sample rows read prompt tokens' logprobs
    # (``Sequence.prompt_logprob_row``) rather than sample
    prompt_rows: dict[int, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
