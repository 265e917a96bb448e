"""Speculative decoding (issue #28): guess a sequence's next tokens cheaply, let one step of the
model check them all, keep what it agrees with.

A *verify step* gives a sequence ``k + 1`` rows: its last sampled token and ``k`` drafted ones,
each row a one-token entry of the step's ragged batch (``Scheduler``), so a verify row runs
exactly the kernels, and sums in exactly the order, of a plain decode row. Row ``j`` samples
output position ``p + j`` with that position's own uniform (``sequence.uniform_at``), the
penalties of the text as it would be after drafts ``0..j-1``, and its own logprobs. The core
then keeps the sampled tokens while they equal the drafts, plus the first one that does not
(or, when all agree, the one after the last draft). Each kept token is the token plain decoding
would have sampled at that position, with the same uniform: the output is the same with
speculation and without, greedy or seeded, and the distribution is the target model's
(sampling-then-comparing is rejection sampling for a draft that is a point mass).

Drafts come from the text itself (``method="ngram"``: prompt lookup, ``ngram_draft.NgramIndex``)
or from a request's ``prediction`` (OpenAI's predicted outputs: ``ngram_draft.PredictionDraft``);
how many to draft, from each sequence's acceptance so far and what a row costs
(``draft_length``)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from .draft_length import AcceptanceEstimate, best_draft_length
from .errors import InvalidRequestError
from .ngram_draft import NgramIndex, PredictionDraft

METHODS = ("ngram", "draft")
DRAFT_QUANTIZATION = "q4f32_1"  # a draft model's default variant: the 4-bit twin
DEFAULT_NUM_TOKENS = 8  # drafts per verify step at most (the engine adapts below it)
NGRAM_MAX = 3  # the longest n-gram looked up
PREDICTION_PRIOR = 0.9  # the acceptance expected of a request's prediction before any verify
MODEL_PRIOR = 0.8  # ... and of a draft model
MAX_BACKOFF = 32  # most steps a sequence waits to draft again after failed verify steps
# Steps in a row without drafts (drafting did not pay) after which one draft is tried anyway.
# What made drafting look dear (a verify step's extra row, a draft model's step) is measured
# only while drafts run: one slow measurement on a busy machine would otherwise stop drafting
# for good. The probe costs at most a row's share of one step in this many.
PROBE_EVERY = 32


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Engine-level speculation: ``method`` drafts for every sequence, at most ``num_tokens``
    a step (a request's ``prediction`` drafts with or without it). ``draft``: the model
    ``model`` (None: the engine's own) in ``quantization`` (None: its 4-bit twin) drafts
    (engine/draft_model.py)."""

    method: str = "ngram"
    num_tokens: int = DEFAULT_NUM_TOKENS
    model: str | None = None
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise _invalid(f"speculative method must be one of {', '.join(METHODS)}, got "
                           f"{self.method!r}")
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or not (
                1 <= self.num_tokens <= 64):
            raise _invalid(f"speculative num_tokens must be an integer in [1, 64], got "
                           f"{self.num_tokens!r}")
        for name in ("model", "quantization"):
            value = getattr(self, name)
            if value is not None and (self.method != "draft" or not isinstance(value, str)
                                      or not value):
                raise _invalid(f"speculative {name} names the draft model (method 'draft'), "
                               f"got {value!r}")

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig | None:
        """None, a method name, a config, or a dict ``{"method", "num_tokens"}`` (the JS
        spelling ``numTokens`` too)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        if not isinstance(value, dict):
            raise _invalid(f"speculative must be a method name or an object, got {value!r}")
        known = {"method", "num_tokens", "numTokens", "model", "quantization"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise _invalid(f"speculative: unknown field {unknown[0]!r} (known: method, "
                           "num_tokens, model, quantization)")
        return cls(value.get("method", "ngram"),
                   value.get("num_tokens", value.get("numTokens", DEFAULT_NUM_TOKENS)),
                   value.get("model"), value.get("quantization"))

    def draft_target(self, model: str) -> tuple[str, str]:
        """The draft model of method ``draft`` for ``model``: (its name, its variant); by
        default the model itself in its 4-bit twin."""
        return self.model or model, self.quantization or DRAFT_QUANTIZATION

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "num_tokens": self.num_tokens}
        if self.method == "draft":
            out.update(model=self.model, quantization=self.quantization)
        return out


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="speculative", code="invalid_value")


class SequenceDrafter:
    """One sequence's drafting: from its ``prediction`` (tokens of a given text) first, else,
    with engine-level n-gram speculation, from its own text; how many it drafts follows its
    acceptance. Counts what its verify steps drafted and kept (usage's
    ``accepted_prediction_tokens`` / ``rejected_prediction_tokens``)."""

    def __init__(self, *, max_tokens: int, ngram: bool, model: bool = False,
                 prediction: NgramIndex | None = None) -> None:
        self.max_tokens = max_tokens
        self.model = model  # the engine's draft model drafts where the others have nothing
        self._ngram = NgramIndex(NGRAM_MAX) if ngram else None
        # (the prediction's index is the request's, shared by its choices: read only)
        self._prediction = PredictionDraft(prediction) if prediction else None
        self._synced = 0  # leading tokens of the sequence the drafters have seen
        # a prediction is the caller's word that the output resembles it, and a draft model
        # is chosen to agree: both are trusted more than the text's n-grams
        self.acceptance = AcceptanceEstimate(
            prior=PREDICTION_PRIOR if prediction else MODEL_PRIOR if model else 0.6)
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_verify_steps = 0
        self._failures = 0  # verify steps in a row that kept no draft
        self._wait = 0  # steps to go before drafting again
        self._idle = 0  # steps in a row that drafted nothing because it did not pay

    def draft_length(self, room: int, row_cost: float) -> int:
        """How many to draft now, at most ``room``: 0 where drafting does not pay (the
        estimate then relaxes toward its prior: retried later), and for a while after a verify
        step that kept nothing (the wait doubles with each such step in a row, up to
        ``MAX_BACKOFF`` steps: text whose drafts keep failing stops paying for them). After
        ``PROBE_EVERY`` steps in a row that did not pay, one draft, so that its costs are
        measured again."""
        if self._wait > 0:
            self._wait -= 1
            return 0
        k = min(room, best_draft_length(self.acceptance.alpha, self.max_tokens, row_cost))
        if k >= 1:
            self._idle = 0
            return k
        self.acceptance.update(0, 0)
        self._idle += 1
        if self._idle >= PROBE_EVERY and room > 0:
            self._idle = 0
            return 1
        return 0

    def propose(self, tokens: Seq[int], num_prompt: int, k: int,
                stop_ids: Seq[int]) -> list[int]:
        """At most ``k`` drafts to follow ``tokens`` (the sequence's prompt and output) from
        the prediction or the text (a draft model's come from ``DraftModel.propose``)."""
        if self._synced < len(tokens):
            new = tokens[self._synced:]
            if self._ngram is not None:
                self._ngram.extend(new)
            if self._prediction is not None:
                self._prediction.advance(tokens[max(self._synced, num_prompt):])
            self._synced = len(tokens)
        drafts: list[int] = []
        if self._prediction is not None:
            drafts = self._prediction.draft(tokens[num_prompt:], k, stop_ids)
        if not drafts and self._ngram is not None:
            drafts = self._ngram.draft(k, stop_ids)
        return drafts

    def record(self, drafted: int, accepted: int) -> None:
        """A verify step's outcome."""
        self.acceptance.update(drafted, accepted)
        if accepted:
            self._failures = 0
        else:
            self._failures += 1
            self._wait = min(MAX_BACKOFF, 2 ** (self._failures - 1) - 1)
        self.num_drafted += drafted
        self.num_accepted += accepted
        self.num_verify_steps += 1
