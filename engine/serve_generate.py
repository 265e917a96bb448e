"""What the two text endpoints (chat, completions) share: the request's size bound, sampling
parameters, grammar, its one request in the core with ``n`` choices, and the usage chunk that
closes its stream.

What one request may ask for is bounded before any per-message work: at most
``context_window`` messages and ``context_window x tokenizer.max_token_chars`` characters,
which no prompt that fits the window can exceed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .batch import SampledToken
from .core import SequenceOutput
from .endpoint import Endpoint, Submitted, text_chars
from .errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    UnsupportedParameterError,
    WickError,
)
from .grammar import CompiledGrammar, GrammarSpec, response_format_spec
from .harmony import HARMONY_TOOL_CHOICE, HarmonyParser, harmony_stop_ids
from .protocol import (
    CompletionTokensDetails,
    CompletionUsage,
    PromptTokensDetails,
    SamplingFields,
    prediction_text,
)
from .reasoning import ReasoningParser
from .sequence import SamplingParams
from .tools import ToolCallParser, tools_spec_source


@dataclass(slots=True)
class Prepared:
    """A validated request with its prompt tokenized, not yet in the engine."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int
    prompt_param: str  # "messages" | "prompt": where a too-long prompt is blamed
    include_usage: bool
    stream: bool
    grammar_spec: GrammarSpec | None = None  # what the output must follow ...
    grammar: CompiledGrammar | None = None  # ... compiled by the facade, before submit
    tools: bool = False  # the output may hold tool calls (chat with tools, tool_choice != none)
    # a reasoning model's tags, and whether the prompt opened the think block (None: no split)
    reasoning: tuple[str, str, bool] | None = None
    harmony: bool = False  # a harmony reply (gpt-oss): channels split by engine/harmony.py
    prediction: list[int] | None = None  # the tokens of the request's predicted output
    echo: str | None = None  # a completion's prompt text, echoed before its output


@dataclass(slots=True)
class Choice:
    """What one choice's stream so far leaves to say."""

    calls: ToolCallParser = field(default_factory=ToolCallParser)
    thinking: ReasoningParser | None = None
    harmony: HarmonyParser | None = None
    finish: str | None = None
    completion_tokens: int = 0
    accepted_drafts: int = 0  # running counts
    rejected_drafts: int = 0
    text_chars: int = 0  # of the text sent (legacy logprobs' offsets)
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    echoed: bool = False  # its echo was sent


@dataclass(slots=True)
class Generation:
    """The stream state of a chat or completion request."""

    prep: Prepared
    choices: list[Choice]
    cached_tokens: int = 0  # choice 0's: the prompt is counted once, as OpenAI does

    @classmethod
    def of(cls, prep: Prepared) -> Generation:
        return cls(prep, [Choice(
            thinking=ReasoningParser(*prep.reasoning) if prep.reasoning else None,
            harmony=HarmonyParser(tools=prep.tools) if prep.harmony else None)
            for _ in range(prep.n)])

    def add(self, out: SequenceOutput) -> Choice:
        c = self.choices[out.index]
        c.completion_tokens = out.num_output_tokens
        c.prompt_logprobs.extend(out.prompt_logprobs)
        # (an abort's output carries no counts)
        c.accepted_drafts = max(c.accepted_drafts, out.num_accepted_drafts)
        c.rejected_drafts = max(c.rejected_drafts, out.num_rejected_drafts)
        if out.index == 0:
            self.cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            c.finish = out.finish_reason
        return c

    def usage(self) -> CompletionUsage:
        return CompletionUsage(
            len(self.prep.prompt_ids), sum(c.completion_tokens for c in self.choices),
            prompt_tokens_details=PromptTokensDetails(self.cached_tokens),
            completion_tokens_details=CompletionTokensDetails(
                sum(c.accepted_drafts for c in self.choices),
                sum(c.rejected_drafts for c in self.choices)))


class GenerationEndpoint(Endpoint):
    """Chat or completions; subclasses render the prompt and the chunks."""

    prompt_param = "prompt"

    def prompt_chars(self, kwargs: dict[str, Any]) -> tuple[int, str]:
        """(characters of the request's prompt text, the param to blame); raises when its
        count alone cannot fit the window."""
        raise NotImplementedError

    def check_size(self, kwargs: dict[str, Any]) -> None:
        """Refuse, before any per-message work, a request that cannot fit the context window
        whatever its tokens."""
        window = self.core.info.context_window
        per_token = getattr(self.core.tokenizer, "max_token_chars", None)
        max_chars = window * per_token if per_token else None
        chars, param = self.prompt_chars(kwargs)
        prediction = kwargs.get("prediction")
        if max_chars is not None and isinstance(prediction, dict) and (
                text_chars(prediction.get("content")) > max_chars):
            raise ContextLengthExceededError.before_tokenizing(
                f"The prediction holds more characters than this model's context window of "
                f"{window} tokens can take (at most {max_chars} characters); shorten it.",
                param="prediction", context_window=window)
        if max_chars is not None and chars > max_chars:
            what = "messages" if param == "messages" else f"messages and {param}"
            raise ContextLengthExceededError.before_tokenizing(
                f"The {what} hold {chars} characters, more than this model's context window "
                f"of {window} tokens can take (at most {max_chars} characters); shorten them.",
                param=param, context_window=window)

    def refuse_embedding_model(self) -> None:
        info = self.core.info
        if info.task == "embed":
            raise InvalidRequestError(f"{info.model_id} is an embedding model: it makes no "
                                      "text (use embeddings)", param="model",
                                      code="model_not_generative")

    def prepared(self, req: SamplingFields, ids: list[int], *, tools: bool = False,
                 reasoning: tuple[str, str, bool] | None = None,
                 echo: str | None = None, harmony: bool = False) -> Prepared:
        text = prediction_text(req.prediction)
        prediction = self.core.tokenizer.encode(text) if text else None
        spec = self.grammar_spec(req, tools, harmony)
        params = self.params(req)
        # a harmony reply is split by its markers (special tokens), which a grammar's output
        # (a response format) does not have: that one is plain text
        harmony = harmony and spec is None
        if harmony:
            stops = () if req.ignore_eos else harmony_stop_ids(self.core.tokenizer)
            params = replace(params, skip_special_tokens=False, stop_token_ids=tuple(
                dict.fromkeys(params.stop_token_ids + stops)))
        return Prepared(ids, params, req.n, self.prompt_param, req.include_usage,
                        req.stream, grammar_spec=spec, tools=tools,
                        reasoning=None if harmony else reasoning, harmony=harmony,
                        prediction=prediction, echo=echo)

    def params(self, req: SamplingFields) -> SamplingParams:
        return SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            max_tokens=req.max_tokens,
            stop=req.stop,
            stop_token_ids=() if req.ignore_eos else self.core.info.eos_token_ids,
            seed=req.seed,
            min_p=req.min_p,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty,
            logit_bias=req.logit_bias_pairs,
            logprobs=req.num_logprobs >= 0,
            top_logprobs=max(req.num_logprobs, 0),
            # an echo with logprobs lists the prompt's; with max_tokens 0 the prompt is still
            # run (its last token's row would sample: it is left out)
            prompt_logprobs=(max(req.num_logprobs, 0) if getattr(req, "echo", False) and (
                req.num_logprobs >= 0 or req.max_tokens == 0) else -1),
        )

    def grammar_spec(self, req: SamplingFields, tools: bool,
                     harmony: bool = False) -> GrammarSpec | None:
        """The grammar a request's output must follow (response format or tool calls), once
        its inputs are within the engine's ``grammar_limits``; compiled later, by the facade
        (the async one off its event loop). A harmony model's calls are not constrained:
        they are messages to ``functions.NAME`` (engine/harmony.py), which only "auto" lets
        it write."""
        spec = response_format_spec(req.response_format)
        if tools and harmony and req.tool_choice != "auto":
            raise UnsupportedParameterError("tool_choice", HARMONY_TOOL_CHOICE)
        if tools and not harmony and (req.tool_choice != "auto" or self.core.grammar is not None):
            # ("auto" without a grammar backend: the reply is parsed, not constrained)
            spec = GrammarSpec("tool_calls", tools_spec_source(
                req.tools, req.tool_choice, req.parallel_tool_calls), param="tools")
        if spec is None:
            return None
        if self.core.grammar is None:
            what = "Tool calls" if spec.kind == "tool_calls" else "Structured output"
            raise UnsupportedParameterError(
                "tools" if spec.kind == "tool_calls" else "response_format",
                f"{what} need a grammar backend, and this engine was created without one.")
        return spec

    def submit(self, prep: Prepared) -> Submitted:
        if prep.grammar_spec is not None and prep.grammar is None:
            raise WickError("this request's grammar was not compiled", code="runner_contract")
        rid = self.core.add_request(prep.prompt_ids, prep.params, n=prep.n,
                                    prompt_param=prep.prompt_param, grammar=prep.grammar,
                                    prediction=prep.prediction)
        return Submitted([rid], prep.stream, Generation.of(prep))

    def waiting_on(self, sub: Submitted) -> str | None:
        done = all(c.finish is not None for c in sub.state.choices)
        return None if done else sub.request_ids[0]

    def closing(self, sub: Submitted) -> list[Any]:
        # a non-streamed reply always has its usage (the fold reads it from this chunk)
        if sub.stream and not sub.state.prep.include_usage:
            return []
        return [self.chunk(sub, [], sub.state.usage())]

    def chunk(self, sub: Submitted, choices: list[Any], usage: CompletionUsage | None = None):
        raise NotImplementedError
