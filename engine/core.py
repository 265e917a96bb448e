"""The engine core: one request lifecycle over one runner. Each step is three calls:
schedule (``Scheduler``) -> execute (``runner.step``: the one call that crosses into the device)
-> postprocess (append tokens, detokenize, stop checks, finish, free pages).

The core is synchronous and single-threaded. The facades in ``api.py`` drive it: the sync one by
calling ``step()`` until its request is done, the async one from one background step loop (using
``begin_step``/``finish_step`` around an awaitable runner call where the runner has one).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import time
import uuid
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field
from typing import Any, Protocol

from .batch import Batch, SampledToken
from .chat_template import render_chat_template
from .detokenize import IncrementalDetokenizer
from .errors import ContextLengthExceededError, InvalidRequestError, WickError
from .grammar import VOCAB_RAW, CompiledGrammar, GrammarBackend, GrammarMatcher, VocabInfo
from .grammar_limits import GrammarLimits
from .kv_cache import kv_cache_for
from .model_info import ModelInfo
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .ngram_draft import NgramIndex
from .speculative import NGRAM_MAX, SequenceDrafter, SpeculativeConfig

# prediction tokens kept past a request's max_tokens (a prediction that tokenizes a little
# longer than the output still drafts to its end)
PREDICTION_SLACK = 64
from .draft_length import StepCost
from .draft_model import DraftModel, Steps, drive, drive_async
from .metrics import EngineMetrics
from .tokenizer import Tokenizer
from .utf8_guard import Utf8Guard, Utf8Table


class StepRunner(Protocol):
    """Executes one batch on the device. Returns one entry per ``batch.sample_rows`` entry, in
    order: the sampled token id, or a ``SampledToken`` (the id and its logprobs) for rows whose
    ``SamplingRow.num_top_logprobs >= 0``. A runner may also define ``async def
    step_async(batch)``, which the async facade awaits instead (the browser's WebGPU readback
    is a JS promise)."""

    def step(self, batch: Batch) -> list[int | SampledToken]: ...


@dataclass(slots=True)
class SequenceOutput:
    """What one step produced for one sequence."""

    request_id: str
    index: int  # choice index within the request
    text: str  # newly certain text (may be "": held back for UTF-8 or a possible stop string)
    token_ids: list[int]  # tokens kept this step (0, 1, or several after a verify step)
    finish_reason: str | None  # "stop" | "length" | "abort" once finished
    num_prompt_tokens: int
    num_output_tokens: int  # so far, including a stop token
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    # the sampled token's logprobs when the request asked for them (see SampledToken)
    logprobs: list[SampledToken] = field(default_factory=list)
    # speculation so far: drafted tokens the model kept, and those it did not
    num_accepted_drafts: int = 0
    num_rejected_drafts: int = 0
    # prompt tokens' logprobs read this step (SamplingParams.prompt_logprobs), in order from
    # the prompt's second token
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    # an embedding input's vector (float32 values), when it finishes
    embedding: Seq[float] | None = None


@dataclass(slots=True)
class RequestStats:
    """Timings of one finished request (for a chat CLI's ``/stats``)."""

    prompt_tokens: int
    completion_tokens: int
    prefill_s: float  # first scheduled -> first token
    decode_s: float  # first token -> last token
    cached_tokens: int = 0  # prompt tokens the prefix cache gave (not computed)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens computed per second (cached ones cost nothing)."""
        computed = self.prompt_tokens - self.cached_tokens
        return computed / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # The first token comes out of prefill; decode made the rest.
        n = self.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


@dataclass(slots=True)
class EngineStats:
    last_request: RequestStats | None = None
    num_steps: int = 0
    last_step_host_ms: float = 0.0  # schedule + postprocess of the last step
    last_step_runner_ms: float = 0.0
    total_host_ms: float = 0.0
    max_batch_seen: int = 0  # most sequences in one step so far
    tokens_computed: int = 0  # tokens the runner was given (prompt chunks, decode inputs)
    grammar_masks: int = 0  # grammar bitmasks applied so far
    # sha256 over every mask applied, in order: two engines that constrained the same requests
    # the same way (the server and the browser worker) show the same digest
    grammar_mask_digest: str = ""
    # speculation: verify steps (one per sequence verified), drafted and accepted tokens
    spec_verify_steps: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        """Drafted tokens the model kept."""
        d = self.spec_drafted_tokens
        return self.spec_accepted_tokens / d if d else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens a verify step yields on average: the accepted drafts and the model's own."""
        n = self.spec_verify_steps
        return (self.spec_accepted_tokens + n) / n if n else 0.0

    def speculation(self) -> dict[str, float]:
        """The speculation counters as ``/health`` and the browser's ``stats()`` show them."""
        return {"verify_steps": self.spec_verify_steps,
                "drafted_tokens": self.spec_drafted_tokens,
                "accepted_tokens": self.spec_accepted_tokens,
                "acceptance_rate": round(self.spec_acceptance_rate, 4),
                "mean_accepted_length": round(self.spec_mean_accepted_length, 4)}

    @property
    def mean_step_host_ms(self) -> float:
        return self.total_host_ms / self.num_steps if self.num_steps else 0.0


@dataclass(slots=True, eq=False)
class _Request:
    request_id: str
    sequences: list[Sequence]
    num_prompt_tokens: int
    arrival: float  # (the engine's clock) when it was added
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.sequences)


@dataclass(slots=True)
class StepState:
    """What ``begin_step`` hands to ``finish_step``."""

    batch: Batch | None
    outputs: list[SequenceOutput] = field(default_factory=list)  # from aborts
    started: float = 0.0
    host_s: float = 0.0


class EngineCore:
    def __init__(
        self,
        runner: StepRunner,
        tokenizer: Tokenizer,
        info: ModelInfo,
        *,
        num_pages: int,
        max_batch_size: int | None = None,
        prefill_chunk_size: int | None = None,
        batch_invariant: bool = True,
        prefix_cache: bool = True,
        grammar: GrammarBackend | None = None,
        vocab: VocabInfo | None = None,
        grammar_limits: GrammarLimits = GrammarLimits(),
        speculative: SpeculativeConfig | dict | str | None = None,
        draft: DraftModel | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``batch_invariant`` (the default): never mix prompt and decode work in a step, so
        that a request's tokens do not depend on what else runs (``Runner``). ``False`` mixes
        them (chunked prefill beside decodes: more throughput while prompts arrive, at the
        price of rounding that depends on the batch). ``prefix_cache`` (the default): reuse
        the KV of prompt pages computed before (``kv_cache``). ``grammar`` compiles response formats
        (None: requests that need one are refused), within ``grammar_limits`` (checked before
        it sees a grammar); ``vocab`` gives each token's bytes for logprobs. ``speculative``
        (``SpeculativeConfig``, its dict or method name): draft for every sequence
        (engine/speculative.py); without it only requests with a ``prediction`` draft.
        ``draft``: the drafting model of method ``draft`` (engine/draft_model.py)."""
        # The compiled kernels bound the step: smaller limits are fine, larger ones are not.
        for name, value, bound in (("max_batch_size", max_batch_size, info.max_batch_size),
                                   ("prefill_chunk_size", prefill_chunk_size,
                                    info.prefill_chunk_size)):
            if value is not None and not 1 <= value <= bound:
                raise ValueError(f"{name}={value} must be in [1, {bound}] (the compiled bound)")
        self.runner = runner
        self.tokenizer = tokenizer
        self.info = info
        self.grammar = grammar
        self.grammar_limits = grammar_limits
        self.vocab = vocab
        self._utf8: Utf8Table | None = None  # built at the first grammar over byte tokens
        self.kv = kv_cache_for(info.page_size, num_pages, window=info.kv_window,
                               window_pool=info.kv_window_pool,
                               num_window_pages=getattr(runner, "num_window_pages", 0),
                               prefix_cache=prefix_cache)
        self.scheduler = Scheduler(
            self.kv,
            max_batch_size=max_batch_size or info.max_batch_size,
            prefill_chunk_size=prefill_chunk_size or info.prefill_chunk_size,
            separate_prefill=batch_invariant,
            vocab_size=info.vocab_size,
        )
        self.speculative = SpeculativeConfig.parse(speculative)
        if (self.speculative is not None and self.speculative.method == "draft") != (
                draft is not None):
            raise InvalidRequestError("speculative method 'draft' needs its draft model (and "
                                      "a draft model needs that method)", param="speculative",
                                      code="invalid_value")
        if draft is not None:
            draft.check_vocabulary(info)
        self.draft = draft
        self.step_cost = StepCost()  # what a verify row adds to a decode step
        self.stats = EngineStats()
        self.metrics = EngineMetrics()  # (monitoring: pyserver/metrics.py exposes them)
        # the runner's last failure ("Type: message") until it next runs a batch: a device lost
        # stays so, and health checks read it (a scheduling or request error is not the runner's)
        self.runner_error: str | None = None
        self._mask_hash = hashlib.sha256()
        self._clock = clock
        self._seq_ids = itertools.count()
        self._requests: dict[str, _Request] = {}  # unfinished only
        self._seqs: dict[int, Sequence] = {}  # seq_id -> live sequence
        self._aborts: list[str] = []  # applied at the start of the next step
        self._bos_text = self._special_text(info.bos_token_id)
        self._eos_text = self._special_text(info.eos_token_ids[0] if info.eos_token_ids else None)

    # -- prompts ------------------------------------------------------------------------------

    @property
    def max_total_tokens(self) -> int:
        """The most tokens (prompt + output) one sequence can have: the context window, or the
        whole KV pool when that is smaller (a sliding window frees pages as it goes)."""
        limit = self.kv.sequence_tokens(self.scheduler.prefill_chunk_size)
        return self.info.context_window if limit is None else min(self.info.context_window, limit)

    def chat_prompt_ids(self, messages: list[dict[str, Any]], **template_vars: Any) -> list[int]:
        """Render the chat template (with ``template_vars``, e.g. ``tools``) and tokenize
        (with the BOS rule of ``prompt_ids``)."""
        return self.prompt_ids(self.render_chat(messages, **template_vars))

    def render_chat(self, messages: list[dict[str, Any]], **template_vars: Any) -> str:
        """The prompt text of ``messages``, ready for the assistant's reply."""
        return render_chat_template(
            self.info.chat_template, messages, bos_token=self._bos_text, eos_token=self._eos_text,
            add_generation_prompt=True, **template_vars,
        )

    def prompt_ids(self, text: str) -> list[int]:
        """Tokenize a prompt; prepend BOS when the model wants one and the text lacks it.

        Many chat templates write ``{{ bos_token }}`` themselves: the tokenizer then already
        produces BOS from the text, and adding another would give the model a double BOS.
        """
        ids = self.tokenizer.encode(text)
        bos = self.info.bos_token_id
        if self.info.add_bos_token and bos is not None:
            has_bos = ids[:1] == [bos] or bool(self._bos_text and text.startswith(self._bos_text))
            if not has_bos:
                ids = [bos, *ids]
        return ids

    def _special_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # -- requests -----------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: Seq[int],
        params: SamplingParams,
        *,
        n: int = 1,
        request_id: str | None = None,
        prompt_param: str = "messages",
        grammar: CompiledGrammar | None = None,
        prediction: Seq[int] | None = None,
    ) -> str:
        """Validate and queue a request of ``n`` sequences, each following ``grammar`` when
        given (``self.grammar.compile(spec)``), each drafting from ``prediction`` (tokens of
        the text the output is expected to resemble) when given. Raises before any device
        work."""
        if self.info.task == "embed":
            raise InvalidRequestError(f"{self.info.model_id} is an embedding model: it makes "
                                      "no text (use embeddings)", param="model",
                                      code="model_not_generative")
        prompt = list(prompt_ids)
        if not prompt:
            raise InvalidRequestError("The prompt is empty.", param=prompt_param,
                                      code="invalid_value")
        vocab = self.info.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"Token ids {bad[:5]} are outside the vocabulary [0, {vocab}).",
                param=prompt_param, code="invalid_value",
            )
        if n < 1:
            raise InvalidRequestError(f"n must be >= 1, got {n}", param="n", code="invalid_value")
        biased = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if biased:
            raise InvalidRequestError(
                f"Invalid value for 'logit_bias': token ids {biased[:5]} are outside the "
                f"vocabulary [0, {vocab}).", param="logit_bias", code="invalid_value")
        max_output = self._check_length(len(prompt), params.max_tokens, prompt_param)
        self._check_choices(n, len(prompt), params.max_tokens, params)
        if params.max_tokens == 0 and len(prompt) < 2:
            raise InvalidRequestError(
                "max_tokens 0 reads the prompt's logprobs: a one-token prompt has none.",
                param="max_tokens", code="invalid_value")
        predicted = None
        if prediction:  # one index for the request's choices; no more of it than it can use
            predicted = NgramIndex(NGRAM_MAX, prediction[:max_output + PREDICTION_SLACK])
        rid = request_id or uuid.uuid4().hex
        if rid in self._requests:
            raise InvalidRequestError(f"Request id {rid!r} is already in use.",
                                      code="duplicate_request_id")
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request_id=rid,
                index=i,
                prompt_ids=prompt,
                params=params,
                max_output_tokens=max_output,
                detokenizer=IncrementalDetokenizer(self.tokenizer, prompt,
                                                   params.skip_special_tokens),
                matcher=self._matcher(grammar) if grammar is not None else None,
                drafter=self._drafter(predicted),
            )
            for i in range(n)
        ]
        for seq in seqs[1:]:  # compute the prompt once: the others share its cached pages
            seq.leader = seqs[0]
        for seq in seqs:
            self.scheduler.add(seq)
            self._seqs[seq.seq_id] = seq
        self._requests[rid] = _Request(rid, seqs, len(prompt), arrival=self._clock())
        return rid

    def add_embedding(self, input_ids: Seq[int], *, request_id: str | None = None,
                      param: str = "input") -> str:
        """Queue one embedding input (its token ids, special tokens included, within the
        model's ``max_input_tokens``): a request of one sequence whose prompt step returns its
        vector (``SequenceOutput.embedding``). Raises before any device work."""
        info = self.info
        if info.task != "embed":
            raise InvalidRequestError(f"{info.model_id} is not an embedding model: it makes "
                                      "text (use chat or completions)", param="model",
                                      code="model_not_embedding")
        ids = list(input_ids)
        if not ids:
            raise InvalidRequestError("An input is empty.", param=param, code="invalid_value")
        bad = [t for t in ids if not 0 <= t < info.vocab_size]
        if bad:
            raise InvalidRequestError(f"Token ids {bad[:5]} are outside the vocabulary "
                                      f"[0, {info.vocab_size}).", param=param,
                                      code="invalid_value")
        most = min(info.embedding["max_input_tokens"], self.scheduler.prefill_chunk_size)
        if len(ids) > most:
            raise InvalidRequestError(f"An input has {len(ids)} tokens; this model takes at "
                                      f"most {most}.", param=param,
                                      code="context_length_exceeded")
        rid = request_id or uuid.uuid4().hex
        if rid in self._requests:
            raise InvalidRequestError(f"Request id {rid!r} is already in use.",
                                      code="duplicate_request_id")
        seq = Sequence(seq_id=next(self._seq_ids), request_id=rid, index=0, prompt_ids=ids,
                       params=SamplingParams(temperature=0.0), max_output_tokens=0,
                       detokenizer=IncrementalDetokenizer(self.tokenizer, ids), embed=True)
        self.scheduler.add(seq)
        self._seqs[seq.seq_id] = seq
        self._requests[rid] = _Request(rid, [seq], len(ids), arrival=self._clock())
        return rid

    def _drafter(self, prediction: NgramIndex | None) -> SequenceDrafter | None:
        spec = self.speculative
        if spec is None and not prediction:
            return None
        most = spec.num_tokens if spec is not None else SpeculativeConfig().num_tokens
        return SequenceDrafter(max_tokens=min(most, self.scheduler.max_batch_size - 1),
                               ngram=spec is not None and spec.method == "ngram",
                               model=self.draft is not None, prediction=prediction)

    def _check_length(self, num_prompt: int, max_tokens: int | None, param: str) -> int:
        """The most output tokens a sequence may make; raises when the request cannot fit."""
        window = self.info.context_window
        pool = self.kv.sequence_tokens(self.scheduler.prefill_chunk_size)
        wanted = max_tokens if max_tokens is not None else 1  # at least one token
        if num_prompt + wanted > window:
            raise ContextLengthExceededError(window, num_prompt, wanted, param=param)
        if pool is not None and num_prompt + wanted > pool:
            raise ContextLengthExceededError(
                pool, num_prompt, wanted, param=param,
                limit_name="KV cache capacity (num_pages x page_size)",
            )
        return max_tokens if max_tokens is not None else self.max_total_tokens - num_prompt

    def _check_choices(self, n: int, num_prompt: int, max_tokens: int | None,
                       params: SamplingParams) -> None:
        """One request's choices must be able to run side by side: at most one step's worth
        of sequences, and all their prompts (plus the tokens asked for) in the KV pool at
        once. Otherwise one request would hold the engine for everyone, thrashing by
        preemption."""
        most = self.scheduler.max_batch_size
        if n > most:
            raise InvalidRequestError(
                f"Invalid value for 'n': {n}; this engine runs at most {most} sequences at "
                "once, so n must be at most that. Send several requests instead.",
                param="n", code="invalid_value")
        each = num_prompt + (max_tokens if max_tokens is not None else 1)
        shared = 0
        if self.kv.window is not None:  # a windowed sequence holds a bounded number of pages
            each = min(each, self.kv.window_pages(self.scheduler.prefill_chunk_size)
                       * self.kv.page_size)
        elif self.kv.prefix_cache and params.prompt_logprobs < 0:
            # the choices share the prompt's full pages (not when reading its logprobs)
            shared = (num_prompt - 1) // self.kv.page_size * self.kv.page_size
        need = shared + n * (each - shared)
        if n > 1 and need > self.kv.capacity_tokens:
            raise InvalidRequestError(
                f"n={n} choices of a {num_prompt}-token prompt need {need} tokens of KV cache "
                f"at once; it holds {self.kv.capacity_tokens}. Lower n or max_tokens.",
                param="n", code="invalid_value")

    def abort(self, request_id: str) -> None:
        """Stop a request; its pages are freed at the start of the next step. Idempotent."""
        if request_id in self._requests and request_id not in self._aborts:
            self._aborts.append(request_id)

    def abort_all(self) -> None:
        for rid in list(self._requests):
            self.abort(rid)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def num_unfinished(self) -> int:
        return len(self._requests)

    def is_unfinished(self, request_id: str) -> bool:
        return request_id in self._requests

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[SequenceOutput]:
        """One engine step: schedule -> runner.step -> postprocess."""
        state = self.begin_step()
        tokens: list[int] = []
        if self.needs_async_masks(state.batch):
            raise WickError("a grammar matcher answers asynchronously; drive this engine with "
                            "AsyncEngineAPI", code="runner_contract")
        if state.batch is not None:
            with self._runner_errors():
                tokens = self.runner.step(state.batch)
        return self.finish_step(state, tokens)

    async def step_async(self) -> list[SequenceOutput]:
        """The same step for an event loop (the async facade's loop): the draft model's steps,
        grammar masks that answer asynchronously and the runner's ``step_async`` (where it
        has one) are awaited."""
        state = await self.begin_step_async()
        tokens: list[int] = []
        if self.needs_async_masks(state.batch):
            await self.fill_masks_async(state.batch)
        if state.batch is not None:
            step_async = getattr(self.runner, "step_async", None)
            with self._runner_errors():
                tokens = (await step_async(state.batch) if step_async is not None
                          else self.runner.step(state.batch))
        return self.finish_step(state, tokens)

    @contextlib.contextmanager
    def _runner_errors(self):
        """``runner_error``: set by a runner call that raises (the error goes on), cleared by
        one that returns."""
        try:
            yield
        except Exception as e:
            self.runner_error = f"{type(e).__name__}: {e}"
            raise
        self.runner_error = None

    def begin_step(self) -> StepState:
        """Apply pending aborts, draft (a draft model's steps run here), schedule, and fill
        the grammar masks of matchers that answer at once. Then (after ``fill_masks_async``
        when ``needs_async_masks``) run ``state.batch`` (if any) on the runner."""
        return drive(self._begin_steps(), self._draft_step)

    async def begin_step_async(self) -> StepState:
        """``begin_step``, awaiting the draft model's steps where its runner reads back
        through a promise (``steps_async``: the browser's WebGPU); elsewhere they run inline,
        as in ``begin_step``. (While one is awaited, requests may be added: they wait for
        the next step's schedule.)"""
        if self.draft is None or not getattr(self.draft.runner, "steps_async", False):
            return self.begin_step()
        return await drive_async(self._begin_steps(), self.draft.runner.step_async)

    def _draft_step(self, batch: Batch) -> list:
        assert self.draft is not None  # (only a draft model's routines yield batches)
        return self.draft.runner.step(batch)

    def _begin_steps(self) -> Steps[StepState]:
        started = self._clock()
        self._claim_runner()
        outputs = self._apply_aborts()
        yield from self._propose_drafts()
        batch = self.scheduler.schedule()
        if batch is not None:
            for sid in batch.seq_ids:
                req = self._requests[self._seqs[sid].request_id]
                if req.first_scheduled is None:
                    req.first_scheduled = started
            for group, matcher, drafts in self._matchers(batch):
                if not hasattr(matcher, "next_token_bitmask_async"):
                    self._fill_masks(group, matcher, drafts)
        return StepState(batch, outputs, started, self._clock() - started)

    def _propose_drafts(self) -> Steps[None]:
        """Each generating sequence's drafts for the next step (the scheduler verifies them
        when the step has room), none when one token is all it has left to make. Under a
        grammar, drafts end before the first one the grammar refuses (a matcher that cannot
        roll back does not draft)."""
        for seq in self.scheduler.running:
            seq.spec_token_ids = []
        if not self.scheduler.next_step_decodes():
            if self.draft is not None:  # (its prompt steps beside the model's)
                yield from self.draft.prefill_steps({
                    seq.seq_id: seq.token_ids[:seq.num_prompt_tokens]
                    for seq in (*self.scheduler.running, *self.scheduler.waiting)
                    if seq.drafter is not None and seq.drafter.model
                    and seq.num_computed_tokens < seq.num_prompt_tokens})
            return  # a prompt step: nothing is verified in it
        row_cost = self.step_cost.row_cost
        model_cost = row_cost + self._draft_step_cost()
        wanted: dict[int, tuple[list[int], int]] = {}  # for the draft model
        for seq in self.scheduler.running:
            drafter = seq.drafter
            matcher = seq.matcher
            if (drafter is None or seq.num_computed_tokens < seq.num_prompt_tokens
                    or (matcher is not None and not hasattr(matcher, "rollback"))):
                continue
            room = seq.max_output_tokens - seq.num_output_tokens - 1
            k = drafter.draft_length(room, model_cost if drafter.model else row_cost) \
                if room > 0 else 0
            if k < 1:  # (a draft model keeps its mirror: it catches up on the tokens
                continue  # made meanwhile when drafting resumes, not on the whole text)
            drafts = drafter.propose(seq.token_ids, seq.num_prompt_tokens, k,
                                     seq.params.stop_token_ids)
            if drafts or not drafter.model:
                seq.spec_token_ids = self._allowed(seq, drafts)
            else:
                wanted[seq.seq_id] = (seq.token_ids, k)
        if wanted:
            proposed = yield from self.draft.propose_steps(wanted)
            for sid, drafts in proposed.items():
                seq = self._seqs[sid]
                stops = seq.params.stop_token_ids
                cut = next((i for i, t in enumerate(drafts) if t in stops), len(drafts))
                seq.spec_token_ids = self._allowed(seq, drafts[:cut])

    def _allowed(self, seq: Sequence, drafts: list[int]) -> list[int]:
        """The drafts a sequence's grammar takes (all, without one)."""
        if seq.matcher is None or not drafts:
            return drafts
        return _grammar_prefix(seq.matcher, drafts)

    def _draft_step_cost(self) -> float:
        """What a draft model's draft costs, as a fraction of the engine's one-row step (0
        without one)."""
        one = self.step_cost.one_row_seconds
        if self.draft is None or not self.draft.seconds_per_draft or not one:
            return 0.0 if self.draft is None else 0.3  # (until measured)
        return self.draft.seconds_per_draft / one

    def _claim_runner(self) -> None:
        """The device KV is the runner's: if another core stepped it since this one did (two
        cores over one runner, one at a time, as tests do), the pages this core's prefix cache
        names were overwritten, so it forgets them."""
        if getattr(self.runner, "kv_owner", self) is not self:
            self.kv.reset_prefix_cache()
        self.runner.kv_owner = self

    def reset_prefix_cache(self) -> None:
        """Forget every cached prompt page (e.g. after a weight change; vLLM has the same)."""
        self.kv.reset_prefix_cache()

    def _matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        """A sequence's matcher; over a vocabulary of byte tokens, one whose masks keep the
        output strict UTF-8 (engine/utf8_guard.py)."""
        matcher = grammar.matcher()
        if self.vocab is None or self.vocab.vocab_type == VOCAB_RAW:
            return matcher
        if self._utf8 is None:
            self._utf8 = Utf8Table.of(self.vocab)
        return Utf8Guard(matcher, self._utf8)

    def _set_mask(self, row, mask: bytes) -> None:
        row.mask = mask
        self._mask_hash.update(mask)
        self.stats.grammar_masks += 1
        self.stats.grammar_mask_digest = self._mask_hash.hexdigest()

    def _matchers(self, batch: Batch):
        """(sampling rows, grammar matcher, drafts) of every sequence that follows a grammar:
        one row, or a verify step's rows (row j: the position after ``drafts[:j]``); rows that
        read prompt logprobs are not the grammar's."""
        for sid, start, end in _row_groups(batch, range(len(batch.sample_rows))):
            matcher = self._seqs[sid].matcher
            start += batch.prompt_rows.get(sid, 0)
            if matcher is not None and start < end:
                yield batch.sampling[start:end], matcher, batch.spec_token_ids.get(sid, ())

    def _fill_masks(self, group, matcher, drafts) -> None:
        for j, row in enumerate(group):
            self._set_mask(row, matcher.next_token_bitmask())
            if j < len(drafts):
                matcher.accept(drafts[j])
        if drafts:
            matcher.rollback(len(drafts))

    def needs_async_masks(self, batch: Batch | None) -> bool:
        return batch is not None and any(
            row.mask is None for group, _, _ in self._matchers(batch) for row in group)

    async def fill_masks_async(self, batch: Batch) -> None:
        """The masks of matchers that answer with a promise (xgrammar's wasm build)."""
        for group, matcher, drafts in self._matchers(batch):
            if group[0].mask is not None:
                continue
            for j, row in enumerate(group):
                self._set_mask(row, await matcher.next_token_bitmask_async())
                if j < len(drafts):
                    matcher.accept(drafts[j])
            if drafts:
                matcher.rollback(len(drafts))

    def finish_step(self, state: StepState, tokens: Seq[int]) -> list[SequenceOutput]:
        """Postprocess the runner's sampled tokens (one per ``batch.sample_rows`` entry)."""
        t0 = self._clock()
        outputs = state.outputs
        batch = state.batch
        if batch is not None:
            if len(tokens) != len(batch.sample_rows):
                raise WickError(
                    f"the runner returned {len(tokens)} tokens for {len(batch.sample_rows)} "
                    "sample rows", code="runner_contract",
                )
            qo = batch.kv.qo_indptr
            for i, sid in enumerate(batch.seq_ids):
                if sid not in batch.spec_token_ids:  # (a verify step counts what it keeps)
                    self._seqs[sid].num_computed_tokens += qo[i + 1] - qo[i]
            for sid, start, end in _row_groups(batch, tokens):
                seq = self._seqs[sid]
                prompt = batch.prompt_rows.get(sid, 0)
                lps = list(tokens[start:start + prompt])
                seq.num_prompt_logprobs_read += prompt
                drafts = batch.spec_token_ids.get(sid, ())
                if seq.embed:
                    out = self._accept_embedding(seq, tokens[start], t0)
                elif start + prompt == end:  # prompt logprobs only (a prompt chunk)
                    out = self._prompt_progress(seq, t0)
                elif drafts:
                    out = self._accept_verified(seq, drafts, tokens[start + prompt:end], t0)
                else:
                    out = self._accept_sampled(seq, tokens[start + prompt], t0)
                if lps:
                    out.prompt_logprobs[:0] = lps
                if out.finish_reason is not None or lps or out.token_ids:
                    outputs.append(out)
            self.stats.tokens_computed += batch.num_tokens
            self._record_step(state, t0, len(set(batch.seq_ids)))
            if batch.decode_only:
                self.step_cost.record(len(batch.seq_ids), t0 - state.started - state.host_s)
        return outputs

    def _prompt_progress(self, seq: Sequence, now: float) -> SequenceOutput:
        """After a prompt chunk whose rows read logprobs only: a sequence that makes no output
        (max_tokens 0) ends once its prompt's logprobs are all read."""
        if seq.max_output_tokens == 0 and seq.num_computed_tokens >= seq.prompt_end:
            self._output_at(self._requests[seq.request_id], now)
            self._finish(seq, "length")
            return SequenceOutput(seq.request_id, seq.index, "", [], "length",
                                  seq.num_prompt_tokens, 0, seq.num_cached_tokens)
        return SequenceOutput(seq.request_id, seq.index, "", [], None, seq.num_prompt_tokens,
                              seq.num_output_tokens, seq.num_cached_tokens)

    def _accept_embedding(self, seq: Sequence, vector: Seq[float],
                          now: float) -> SequenceOutput:
        self._output_at(self._requests[seq.request_id], now)
        self._finish(seq, "stop")
        return SequenceOutput(seq.request_id, 0, "", [], "stop", seq.num_prompt_tokens, 0,
                              embedding=vector)

    def _accept_sampled(self, seq: Sequence, entry: int | SampledToken,
                        now: float) -> SequenceOutput:
        if isinstance(entry, SampledToken):
            out = self._accept_token(seq, int(entry.token), now)
            out.logprobs.append(entry)
            return out
        return self._accept_token(seq, int(entry), now)

    def _accept_verified(self, seq: Sequence, drafts: Seq[int],
                         sampled: Seq[int | SampledToken], now: float) -> SequenceOutput:
        """Keep a verify step's sampled tokens while they equal the drafts, and the first that
        does not (or the one after the last draft): each is what a plain step would have
        sampled there. The K/V of drafts after the first disagreement is cut off again."""
        start = seq.num_computed_tokens  # the verified entries' first position
        outs: list[SequenceOutput] = []
        accepted = 0
        for j, entry in enumerate(sampled):
            # entry j's K/V holds a kept token; set before a stop frees the pages (the prefix
            # cache is offered only computed pages, never a rejected draft's)
            seq.num_computed_tokens = start + j + 1
            outs.append(self._accept_sampled(seq, entry, now))
            token = outs[-1].token_ids[0]
            if seq.is_finished:
                break
            if j == len(drafts) or token != drafts[j]:
                break
            accepted += 1
        drafter = seq.drafter
        drafter.record(len(drafts), accepted)
        s = self.stats
        s.spec_verify_steps += 1
        s.spec_drafted_tokens += len(drafts)
        s.spec_accepted_tokens += accepted
        if not seq.is_finished:  # the K/V of rejected drafts goes
            self.kv.truncate(seq.seq_id, seq.num_computed_tokens)
        last = outs[-1]
        return SequenceOutput(
            seq.request_id, seq.index, "".join(o.text for o in outs),
            [t for o in outs for t in o.token_ids], last.finish_reason, last.num_prompt_tokens,
            last.num_output_tokens, last.num_cached_tokens,
            [lp for o in outs for lp in o.logprobs], drafter.num_accepted,
            drafter.num_drafted - drafter.num_accepted)

    def _record_step(self, state: StepState, t_post: float, batch_size: int) -> None:
        end = self._clock()
        host_s = state.host_s + (end - t_post)
        s = self.stats
        s.num_steps += 1
        s.last_step_host_ms = host_s * 1e3
        s.last_step_runner_ms = (t_post - state.started - state.host_s) * 1e3
        s.total_host_ms += host_s * 1e3
        s.max_batch_seen = max(s.max_batch_seen, batch_size)

    def _accept_token(self, seq: Sequence, token: int, now: float) -> SequenceOutput:
        seq.append_token(token)
        self._output_at(self._requests[seq.request_id], now)
        self.metrics.generation_tokens += 1
        reason: str | None = None
        stop_filter, detok = seq.stop_filter, seq.detokenizer
        grammar_end = False
        if seq.matcher is not None:
            # the mask only lets allowed tokens through; a refusal means the grammar ended
            # (e.g. a stop token sampled under ignore_eos): end here rather than emit it
            grammar_end = not seq.matcher.accept(token) or seq.matcher.is_terminated()
        if token in seq.params.stop_token_ids or grammar_end:
            # The stop token ends the sequence and is not text; what was held back is released.
            text = stop_filter.push(detok.flush())
            text += stop_filter.flush()
            reason = "stop"
        else:
            text = stop_filter.push(detok.push(token))
            if stop_filter.stopped:
                reason = "stop"
            elif seq.num_output_tokens >= seq.max_output_tokens:
                text += stop_filter.push(detok.flush())
                text += stop_filter.flush()
                reason = "stop" if stop_filter.stopped else "length"
        if reason is not None:
            self._finish(seq, reason)
        out = SequenceOutput(
            seq.request_id, seq.index, text, [token], reason, seq.num_prompt_tokens,
            seq.num_output_tokens, seq.num_cached_tokens,
        )
        if seq.drafter is not None:
            out.num_accepted_drafts = seq.drafter.num_accepted
            out.num_rejected_drafts = seq.drafter.num_drafted - seq.drafter.num_accepted
        return out

    def _output_at(self, req: _Request, now: float) -> None:
        """A request's output at ``now``: its first (the time to it, its prompt and prefix
        cache counted) or a later step's (the time since its last)."""
        m = self.metrics
        if req.first_token is None:
            req.first_token = now
            m.ttft.observe(now - req.arrival)
            m.prompt_tokens += req.num_prompt_tokens
            m.prefix_hits += req.sequences[0].num_cached_tokens
        elif req.last_token is not None and now > req.last_token:
            m.itl.observe(now - req.last_token)  # (once a step, however many tokens it kept)
        req.last_token = now

    def requests_by_state(self) -> tuple[int, int]:
        """(requests with a sequence the scheduler runs, requests only waiting)."""
        running = {seq.request_id for seq in self.scheduler.running}
        return len(running), len(self._requests) - len(running)

    def _apply_aborts(self) -> list[SequenceOutput]:
        outputs = []
        aborts, self._aborts = self._aborts, []
        for rid in aborts:
            req = self._requests.get(rid)
            if req is None:
                continue
            for seq in req.sequences:
                if not seq.is_finished:
                    self._finish(seq, "abort")
                    outputs.append(SequenceOutput(
                        rid, seq.index, "", [], "abort", seq.num_prompt_tokens,
                        seq.num_output_tokens, seq.num_cached_tokens,
                    ))
        return outputs

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish(reason)
        if self.draft is not None:
            self.draft.release(seq.seq_id)
        close = getattr(seq.matcher, "close", None)
        if close is not None:  # a wasm matcher holds memory outside Python's reach
            close()
        self.scheduler.remove(seq)
        del self._seqs[seq.seq_id]
        req = self._requests[seq.request_id]
        if req.finished:
            del self._requests[seq.request_id]
            self.metrics.e2e.observe(self._clock() - req.arrival)
            self.metrics.request_success[reason] += 1
            if req.first_token is not None and req.first_scheduled is not None:
                self.stats.last_request = RequestStats(
                    prompt_tokens=req.num_prompt_tokens,
                    completion_tokens=sum(s.num_output_tokens for s in req.sequences),
                    prefill_s=req.first_token - req.first_scheduled,
                    decode_s=(req.last_token or req.first_token) - req.first_token,
                    cached_tokens=req.sequences[0].num_cached_tokens,
                )


def _grammar_prefix(matcher: GrammarMatcher, drafts: list[int]) -> list[int]:
    """The drafts up to the first one ``matcher`` refuses (or that ends its grammar); the
    matcher is left where it was."""
    kept = 0
    for token in drafts:
        if not matcher.accept(token):
            break
        kept += 1
        if matcher.is_terminated():
            break
    if kept:
        matcher.rollback(kept)
    return drafts[:kept]


def _row_groups(batch: Batch, rows):
    """(seq_id, first, end) of each sequence's consecutive sample rows (indexes into
    ``batch.sample_rows``, and so into ``rows``, one entry per sample row)."""
    i, n = 0, len(rows)
    while i < n:
        sid = batch.seq_ids[batch.sample_rows[i]]
        j = i + 1
        while j < n and batch.seq_ids[batch.sample_rows[j]] == sid:
            j += 1
        yield sid, i, j
        i = j
