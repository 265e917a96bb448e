"""The user API over one engine core, OpenAI-shaped: sync ``EngineAPI`` and async
``AsyncEngineAPI``, each with ``.chat.completions.create(...)`` and ``.completions.create(...)``.

``stream=False`` returns a ``ChatCompletion`` / ``Completion``; ``stream=True`` returns a stream
of chunks: per choice a first chunk with ``delta.role="assistant"``, content chunks, a chunk with
``finish_reason``; then, with ``stream_options={"include_usage": True}``, one usage chunk with no
choices. Requests are validated (and rejected with typed errors) inside ``create`` itself, before
any step runs, also when streaming.

The sync facade drives ``core.step()`` from whichever call is waiting for output; outputs for
other requests are kept for them, so several sync streams may be interleaved. The async facade
runs ONE step loop task per event loop: concurrent requests share steps. It never uses threads
(Pyodide has none): a runner's ``async def step_async(batch)`` is awaited when present, else its
``step(batch)`` is called directly, and the loop yields to other tasks between steps.

A stream that is closed, dropped or cancelled before its end aborts its request; the core frees
its pages at the next step.

Preparing a request (validation, chat template, tokenization) touches no engine state, so a host
with threads may run it off its event loop (``AsyncEngineAPI.prepare_off_loop``): a huge body
then never stalls running streams. What one request may ask for is bounded before any of that
work: at most ``context_window`` messages and ``context_window x tokenizer.max_token_chars``
characters, which no prompt that fits the window can exceed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .batch import SampledToken
from .core import EngineCore, SequenceOutput, StepRunner
from .embeddings import CreateEmbeddingResponse, EmbeddingJob, EmbeddingRequest, input_ids, response
from .errors import (
    ContextLengthExceededError,
    EngineAbortedError,
    InvalidRequestError,
    ModelNotFoundError,
    UnsupportedParameterError,
    WickError,
)
from .grammar import CompiledGrammar, GrammarSpec, response_format_spec
from .tools import (
    ToolCall,
    ToolCallParser,
    fallback_system_prompt,
    history_as_text,
    template_knows_tools,
    tools_spec_source,
)
from .model_info import ModelInfo
from .protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionUsage,
    CompletionTokensDetails,
    PromptTokensDetails,
    SamplingFields,
    TokenLogprob,
    TopLogprob,
    prediction_text,
    token_ids_of,
)
from .reasoning import ReasoningParser, reasoning_tags
from .sequence import SamplingParams
from .tokenizer import Tokenizer

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Shared by both facades: request -> core request, outputs -> responses and chunks.


@dataclass(slots=True)
class _Prepared:
    """A validated request with its prompt tokenized, not yet in the engine."""

    kind: str  # "chat" | "completion"
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    prompt_param: str  # "messages" | "prompt": where a too-long prompt is blamed
    include_usage: bool
    stream: bool
    grammar_spec: GrammarSpec | None = None  # what the output must follow ...
    grammar: CompiledGrammar | None = None  # ... compiled by the facade, before _add
    tools: bool = False  # the output may hold tool calls (chat with tools, tool_choice != none)
    # a reasoning model's tags, and whether the prompt opened the think block (None: no split)
    reasoning: tuple[str, str, bool] | None = None
    prediction: list[int] | None = None  # the tokens of the request's predicted output
    echo: str | None = None  # a completion's prompt text, echoed before its output


@dataclass(slots=True)
class _Submitted:
    request_id: str
    kind: str  # "chat" | "completion"
    n: int
    num_prompt_tokens: int
    include_usage: bool
    logprobs: bool = False
    tools: bool = False
    reasoning: tuple[str, str, bool] | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    echo: str | None = None  # the prompt text to echo (completions)
    prompt_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Collected:
    """Accumulates one request's outputs for a non-streaming response."""

    texts: list[list[str]]
    finish: list[str | None]
    completion_tokens: list[int]
    logprobs: list[list[SampledToken]]
    calls: list[ToolCallParser]  # per choice, when the request has tools
    thinking: list[ReasoningParser | None]  # per choice, for a reasoning model's chat
    cached_tokens: int = 0  # choice 0's: the prompt is counted once, as OpenAI does
    accepted_drafts: list[int] = field(default_factory=list)  # per choice, so far
    rejected_drafts: list[int] = field(default_factory=list)
    prompt_logprobs: list[list[SampledToken]] = field(default_factory=list)  # per choice
    echoed: list[bool] = field(default_factory=list)  # per choice: its echo was streamed

    @classmethod
    def empty(cls, n: int, reasoning: tuple[str, str, bool] | None = None) -> _Collected:
        return cls([[] for _ in range(n)], [None] * n, [0] * n, [[] for _ in range(n)],
                   [ToolCallParser() for _ in range(n)],
                   [ReasoningParser(*reasoning) if reasoning else None for _ in range(n)],
                   accepted_drafts=[0] * n, rejected_drafts=[0] * n,
                   prompt_logprobs=[[] for _ in range(n)], echoed=[False] * n)

    def add(self, out: SequenceOutput) -> None:
        self.texts[out.index].append(out.text)
        self.completion_tokens[out.index] = out.num_output_tokens
        self.logprobs[out.index].extend(out.logprobs)
        self.prompt_logprobs[out.index].extend(out.prompt_logprobs)
        # (running counts; an abort's output carries none)
        self.accepted_drafts[out.index] = max(self.accepted_drafts[out.index],
                                              out.num_accepted_drafts)
        self.rejected_drafts[out.index] = max(self.rejected_drafts[out.index],
                                              out.num_rejected_drafts)
        if out.index == 0:
            self.cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            self.finish[out.index] = out.finish_reason

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finish)


class _Frontend:
    """Request preparation and response assembly; owns nothing but the core."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._token_texts: dict[int, tuple[str, list[int]]] = {}

    @property
    def model(self) -> str:
        return self.core.info.model_id

    @property
    def stats(self):  # EngineStats
        return self.core.stats

    def _check_model(self, model: str | None) -> None:
        info = self.core.info
        names = (info.model_id, f"{info.model_id}-{info.quantization}")
        if model is not None and model not in names:
            raise ModelNotFoundError(model, [info.model_id])

    def _prepare_embeddings(self, kwargs: dict[str, Any]) -> EmbeddingJob:
        """Validate an embeddings request and tokenize its inputs (engine/embeddings.py)."""
        req = EmbeddingRequest.from_dict(kwargs)
        self._check_model(req.model)
        info = self.core.info
        if info.task != "embed":
            raise InvalidRequestError(f"{info.model_id} is not an embedding model: it makes "
                                      "text (use chat or completions)", param="model",
                                      code="model_not_embedding")
        most = min(info.embedding["max_input_tokens"], self.core.scheduler.token_budget)
        return EmbeddingJob(req, input_ids(req, self.core.tokenizer, info, most))

    def _embedded(self, out: SequenceOutput) -> Any:
        if out.embedding is None:  # (aborted)
            raise EngineAbortedError(f"embedding request {out.request_id} was aborted")
        return out.embedding

    def _params(self, req: SamplingFields) -> SamplingParams:
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

    def _grammar_spec(self, req: SamplingFields, tools: bool) -> GrammarSpec | None:
        """The grammar a request's output must follow (response format or tool calls), once
        its inputs are within the engine's ``grammar_limits``; compiled later, by the facade
        (the async one off its event loop)."""
        spec = response_format_spec(req.response_format)
        if tools and (req.tool_choice != "auto" or self.core.grammar is not None):
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

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        compile_now = getattr(self.core.grammar, "compile", None)
        if compile_now is None:  # the browser's wasm xgrammar answers with promises
            raise WickError("this engine's grammar backend compiles asynchronously (use "
                            "AsyncEngineAPI)", code="runner_contract")
        return compile_now(spec)

    def _prepare(self, kind: str, kwargs: dict[str, Any]) -> _Prepared:
        """Validate, render the chat template and tokenize. Reads the model's info and the
        tokenizer only, so it may run on another thread than the step loop."""
        self._check_size(kind, kwargs)
        info = self.core.info
        if info.task == "embed":
            raise InvalidRequestError(f"{info.model_id} is an embedding model: it makes no "
                                      "text (use embeddings)", param="model",
                                      code="model_not_generative")
        tools, reasoning, echo = False, None, None
        limits = self.core.grammar_limits
        if kind == "chat":
            req: SamplingFields = ChatCompletionRequest.from_dict(kwargs)
            self._check_model(req.model)
            calls = req.tools if req.tools and req.tool_choice != "none" else []
            limits.check_request(req.response_format, calls)  # before the template's work
            ids, tools, reasoning = self._chat_prompt(req)
            param = "messages"
        else:
            req = CompletionRequest.from_dict(kwargs)
            self._check_model(req.model)
            limits.check_request(req.response_format, [])
            prompt = req.prompt
            # Token ids are used as given (no BOS added): the caller chose them.
            ids = self.core.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
            param = "prompt"
            if req.echo:
                echo = prompt if isinstance(prompt, str) else self.core.tokenizer.decode(
                    ids, skip_special_tokens=False)
        text = prediction_text(req.prediction)
        prediction = self.core.tokenizer.encode(text) if text else None
        return _Prepared(kind, ids, self._params(req), req.n, param, req.include_usage,
                         req.stream, grammar_spec=self._grammar_spec(req, tools), tools=tools,
                         reasoning=reasoning, prediction=prediction, echo=echo)

    def _chat_prompt(self, req: ChatCompletionRequest
                     ) -> tuple[list[int], bool, tuple[str, str, bool] | None]:
        """The prompt ids, whether the reply may call tools, and how to split a reasoning
        model's thinking off. A template that knows tools gets them (and the history's calls)
        as the model was trained; any other gets wick's system prompt and the history's calls
        and results as text (engine/tools.py)."""
        messages = [_template_message(m) for m in req.messages]
        tools = bool(req.tools) and req.tool_choice != "none"
        extra = dict(req.chat_template_kwargs or {})
        if template_knows_tools(self.core.info.chat_template):
            if tools:
                extra["tools"] = [t.to_openai() for t in req.tools]
        else:
            messages = history_as_text(messages)
            if tools:
                prompt = fallback_system_prompt(req.tools)
                if messages and messages[0]["role"] == "system":
                    messages[0] = {**messages[0],
                                   "content": f"{messages[0]['content']}\n\n{prompt}"}
                else:
                    messages.insert(0, {"role": "system", "content": prompt})
        text = self.core.render_chat(messages, **extra)
        tags = reasoning_tags(self.core.info.chat_template)
        reasoning = (*tags, text.rstrip().endswith(tags[0])) if tags else None
        return self.core.prompt_ids(text), tools, reasoning

    # -- /tokenize and /detokenize (as vLLM's and llama.cpp's servers) -------------------------

    def tokenize(self, body: Any) -> dict[str, Any]:
        """``{model?, prompt | messages}`` -> ``{tokens, count, max_model_len}``: the ids the
        engine would prefill (a prompt with the model's BOS rule, messages through the chat
        template with the generation prompt, and ``tools`` and ``chat_template_kwargs`` as a
        chat request would)."""
        body = _object_body(body, ("model", "prompt", "messages", "tools",
                                   "chat_template_kwargs"))
        self._check_model(body.get("model"))
        if ("prompt" in body) == ("messages" in body):
            raise InvalidRequestError("Give exactly one of 'prompt' and 'messages'.",
                                      param="prompt", code="missing_required_parameter")
        kind = "chat" if "messages" in body else "completion"
        for key in ("tools", "chat_template_kwargs"):
            if kind == "completion" and key in body:
                raise InvalidRequestError(f"'{key}' applies to 'messages' only.", param=key,
                                          code="invalid_value")
        self._check_size(kind, body)
        if kind == "chat":
            req = ChatCompletionRequest.from_dict(
                {k: body[k] for k in ("messages", "tools", "chat_template_kwargs") if k in body})
            ids = self._chat_prompt(req)[0]
        else:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise InvalidRequestError(
                    f"Invalid type for 'prompt': expected a string, but got "
                    f"{type(prompt).__name__}.", param="prompt", code="invalid_type")
            ids = self.core.prompt_ids(prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": self.core.info.context_window}

    def detokenize(self, body: Any) -> dict[str, Any]:
        """``{model?, tokens}`` -> ``{prompt}`` (special tokens kept, as written)."""
        body = _object_body(body, ("model", "tokens"))
        self._check_model(body.get("model"))
        tokens = body.get("tokens")
        if isinstance(tokens, list):
            tokens = token_ids_of(tokens)
        vocab = self.core.info.vocab_size
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequestError("'tokens' must be a list of token ids.", param="tokens",
                                      code="invalid_type")
        if len(tokens) > self.core.info.context_window:
            raise ContextLengthExceededError.before_tokenizing(
                f"'tokens' holds {len(tokens)} ids; this model's context window is "
                f"{self.core.info.context_window} tokens.", param="tokens",
                context_window=self.core.info.context_window)
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"Token ids {bad[:5]} are outside the vocabulary "
                                      f"[0, {vocab}).", param="tokens", code="invalid_value")
        return {"prompt": self.core.tokenizer.decode(tokens, skip_special_tokens=False)}

    def _check_size(self, kind: str, kwargs: dict[str, Any]) -> None:
        """Refuse, before any per-message work, a request that cannot fit the context window
        whatever its tokens: more messages than the window has tokens, or more characters than
        the longest token has, per token of the window."""
        window = self.core.info.context_window
        per_token = getattr(self.core.tokenizer, "max_token_chars", None)
        max_chars = window * per_token if per_token else None
        if kind == "chat":
            messages, param = kwargs.get("messages"), "messages"
            if not isinstance(messages, list):
                return  # from_dict names the type error
            if len(messages) > window:
                raise ContextLengthExceededError.before_tokenizing(
                    f"'messages' holds {len(messages)} messages; this model's context window of "
                    f"{window} tokens cannot take more than {window}.", param="messages",
                    context_window=window)
            # every string that reaches the template: contents, names, earlier calls'
            # arguments; tool definitions and template variables with their keys
            chars = _text_chars(messages)
            definitions = _text_chars([kwargs.get("tools"), kwargs.get("chat_template_kwargs")],
                                      keys=True)
            if definitions > chars:  # blame the larger part
                param = "tools" if kwargs.get("tools") else "chat_template_kwargs"
            chars += definitions
        else:
            prompt, param = kwargs.get("prompt"), "prompt"
            chars = len(prompt) if isinstance(prompt, str) else 0
            if isinstance(prompt, list) and len(prompt) > window:
                raise ContextLengthExceededError.before_tokenizing(
                    f"The prompt holds {len(prompt)} tokens; this model's context window is "
                    f"{window} tokens.", param="prompt", context_window=window)
        prediction = kwargs.get("prediction")
        if max_chars is not None and isinstance(prediction, dict) and (
                _text_chars(prediction.get("content")) > max_chars):
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

    def _add(self, prep: _Prepared) -> _Submitted:
        """Queue a prepared request in the core (on the step loop's thread)."""
        if prep.grammar_spec is not None and prep.grammar is None:
            raise WickError("this request's grammar was not compiled", code="runner_contract")
        rid = self.core.add_request(prep.prompt_ids, prep.params, n=prep.n,
                                    prompt_param=prep.prompt_param, grammar=prep.grammar,
                                    prediction=prep.prediction)
        return _Submitted(rid, prep.kind, prep.n, len(prep.prompt_ids), prep.include_usage,
                          prep.params.logprobs, prep.tools, prep.reasoning, echo=prep.echo,
                          prompt_ids=prep.prompt_ids if prep.echo is not None else [])

    # -- logprobs ---------------------------------------------------------------------------

    def _token_text(self, token: int) -> tuple[str, list[int]]:
        """A token's text and bytes as OpenAI's logprobs show them: special tokens as written
        (e.g. "<|im_end|>"); a token that is part of a UTF-8 character as "bytes:\\xe2\\x80"
        (OpenAI's spelling), so that distinct tokens never share a text."""
        hit = self._token_texts.get(token)
        if hit is None:
            vocab = self.core.vocab
            raw = vocab.token_bytes(token) if vocab is not None else b""
            if not raw:
                raw = self.core.tokenizer.decode([token], skip_special_tokens=False).encode()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._token_texts[token] = (text, list(raw))
        return hit

    def _chat_logprobs(self, entries: list[SampledToken]) -> ChoiceLogprobs:
        content = []
        for e in entries:
            text, raw = self._token_text(e.token)
            top = [TopLogprob(*self._token_text(t)[:1], lp, self._token_text(t)[1])
                   for t, lp in e.top]
            content.append(TokenLogprob(text, e.logprob, raw, top))
        return ChoiceLogprobs(content)

    def _completion_logprobs(self, entries: list[SampledToken], offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for e in entries:
            text = self._token_text(e.token)[0]
            out.tokens.append(text)
            out.token_logprobs.append(e.logprob)
            top: dict[str, float] = {}
            for t, lp in e.top:
                top.setdefault(self._token_text(t)[0], lp)
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def _response(self, sub: _Submitted, col: _Collected) -> ChatCompletion | Completion:
        usage = self._usage(sub, col)
        texts = ["".join(t) for t in col.texts]
        if sub.kind == "chat":
            choices = []
            for i in range(sub.n):
                text, reasoning = texts[i], None
                thinking = col.thinking[i]
                if thinking is not None:
                    (r1, text), (r2, c2) = thinking.push(text), thinking.finish()
                    reasoning, text = (r1 + r2) or None, text + c2
                message, finish = ChatMessage("assistant", text), col.finish[i]
                if sub.tools:
                    parser = col.calls[i]
                    content = parser.push(text)[0] + parser.finish()[0]
                    message = _with_calls(content, parser.calls)
                    finish = "tool_calls" if parser.calls and finish == "stop" else finish
                message.reasoning_content = reasoning
                choices.append(ChatCompletionChoice(
                    i, message, finish,
                    self._chat_logprobs(col.logprobs[i]) if sub.logprobs else None))
            return ChatCompletion(id=f"chatcmpl-{sub.request_id}", created=sub.created,
                                  model=self.model, choices=choices, usage=usage)
        choices = []
        for i in range(sub.n):
            echo, logprobs = "", None
            if sub.echo is not None:
                echo = sub.echo
                if sub.logprobs:
                    logprobs = self._echo_logprobs(sub, col.prompt_logprobs[i])
            if sub.logprobs:  # (offsets into the text returned: the echo's, then the output's)
                more = self._completion_logprobs(col.logprobs[i], len(echo))
                logprobs = more if logprobs is None else logprobs.extend(more)
            choices.append(CompletionChoice(echo + texts[i], i, col.finish[i], logprobs))
        return Completion(id=f"cmpl-{sub.request_id}", created=sub.created, model=self.model,
                          choices=choices, usage=usage)

    def _echo_only(self, prep: _Prepared) -> list[Completion]:
        """A request that only echoes its prompt (no new token, no prompt logprob to read):
        answered without the model. The response, or as a stream its chunk(s)."""
        sub = _Submitted(uuid.uuid4().hex, prep.kind, prep.n, len(prep.prompt_ids),
                         prep.include_usage, prep.params.logprobs, echo=prep.echo,
                         prompt_ids=prep.prompt_ids)
        col = _Collected.empty(prep.n)
        col.finish = ["length"] * prep.n
        full = self._response(sub, col)
        if not prep.stream:
            return [full]
        return [self._completion_chunk(sub, full.choices), *self._last_chunks(sub, col)]

    def _echo_logprobs(self, sub: _Submitted, entries: list[SampledToken]) -> CompletionLogprobs:
        """The prompt's tokens in the legacy shape: the first has no logprob (nothing comes
        before it), each other the model's logprob of it and its position's most likely."""
        out = CompletionLogprobs()
        first = self._token_text(sub.prompt_ids[0])[0]
        out.tokens.append(first)
        out.token_logprobs.append(None)
        out.top_logprobs.append(None)
        out.text_offset.append(0)
        return out.extend(self._completion_logprobs(entries, len(first)))

    def _first_chunks(self, sub: _Submitted) -> list[Any]:
        if sub.kind != "chat":
            return []
        return [self._chat_chunk(sub, [ChunkChoice(i, ChoiceDelta(role="assistant", content=""))])
                for i in range(sub.n)]

    def _chunks_for(self, sub: _Submitted, out: SequenceOutput, col: _Collected) -> list[Any]:
        # the offset of this output's text in its choice, before adding it (legacy logprobs)
        offset = sum(len(t) for t in col.texts[out.index]) + len(sub.echo or "")
        col.add(out)
        chunks: list[Any] = []
        # a token's logprobs go out with the step that sampled it, even when its text is
        # held back (a possible stop string, an unfinished UTF-8 character)
        lp = out.logprobs if sub.logprobs else []
        if sub.kind == "chat":
            text, calls, finish, reasoning = out.text, [], out.finish_reason, ""
            thinking = col.thinking[out.index]
            if thinking is not None:
                reasoning, text = thinking.push(text)
                if finish is not None:
                    r2, c2 = thinking.finish()
                    reasoning, text = reasoning + r2, text + c2
            if sub.tools:  # calls leave the text; each goes out whole once its block closes
                parser = col.calls[out.index]
                before = len(parser.calls)
                text, _ = parser.push(out.text)
                if finish is not None:
                    text += parser.finish()[0]
                    if parser.calls and finish == "stop":
                        finish = "tool_calls"
                calls = [{"index": before + j, **c.to_dict()}
                         for j, c in enumerate(parser.calls[before:])]
            if text or lp or calls or reasoning:
                content = (text or None) if calls or reasoning else text
                chunks.append(self._chat_chunk(sub, [ChunkChoice(
                    out.index, ChoiceDelta(content=content, tool_calls=calls or None,
                                           reasoning_content=reasoning or None), None,
                    self._chat_logprobs(lp) if lp else None)]))
            if finish is not None:
                chunks.append(self._chat_chunk(
                    sub, [ChunkChoice(out.index, ChoiceDelta(), finish)]))
        else:
            text = out.text
            if sub.echo is not None and not col.echoed[out.index] and (
                    out.token_ids or out.finish_reason is not None):
                # the prompt (and its logprobs) goes out once all of it was read
                col.echoed[out.index] = True
                echo_lp = (self._echo_logprobs(sub, col.prompt_logprobs[out.index])
                           if sub.logprobs else None)
                more = self._completion_logprobs(lp, offset) if lp else None
                lp_out = echo_lp.extend(more) if echo_lp and more else (echo_lp or more)
                chunks.append(self._completion_chunk(sub, [CompletionChoice(
                    sub.echo + text, out.index, out.finish_reason, lp_out)]))
            elif text or lp or out.finish_reason is not None:
                chunks.append(self._completion_chunk(sub, [CompletionChoice(
                    text, out.index, out.finish_reason,
                    self._completion_logprobs(lp, offset) if lp else None)]))
        return chunks

    def _last_chunks(self, sub: _Submitted, col: _Collected) -> list[Any]:
        if not sub.include_usage:
            return []
        usage = self._usage(sub, col)
        if sub.kind == "chat":
            return [self._chat_chunk(sub, [], usage)]
        return [self._completion_chunk(sub, [], usage)]

    @staticmethod
    def _usage(sub: _Submitted, col: _Collected) -> CompletionUsage:
        return CompletionUsage(sub.num_prompt_tokens, sum(col.completion_tokens),
                               prompt_tokens_details=PromptTokensDetails(col.cached_tokens),
                               completion_tokens_details=CompletionTokensDetails(
                                   sum(col.accepted_drafts), sum(col.rejected_drafts)))

    def _chat_chunk(self, sub: _Submitted, choices: list[ChunkChoice],
                    usage: CompletionUsage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(f"chatcmpl-{sub.request_id}", sub.created, self.model,
                                   choices, usage)

    def _completion_chunk(self, sub: _Submitted, choices: list[CompletionChoice],
                          usage: CompletionUsage | None = None) -> Completion:
        return Completion(f"cmpl-{sub.request_id}", sub.created, self.model, choices, usage)


def _echo_only(prep: _Prepared) -> bool:
    """A completion that asks for its prompt back and nothing the model computes."""
    return prep.echo is not None and prep.params.max_tokens == 0 and (
        not prep.params.logprobs or len(prep.prompt_ids) < 2)


def _with_calls(content: str, calls: list[ToolCall]) -> ChatMessage:
    """The assistant message of a reply that may hold tool calls (content None when the reply
    is only calls, as OpenAI's)."""
    if not calls:
        return ChatMessage("assistant", content)
    return ChatMessage("assistant", content if content.strip() else None,
                       tool_calls=[c.to_dict() for c in calls])


def _object_body(body: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    for key in body:
        if key not in keys:
            raise InvalidRequestError(f"Unrecognized request argument supplied: '{key}'.",
                                      param=key, code="unknown_parameter")
    return {k: v for k, v in body.items() if v is not None}


def _text_chars(value: Any, keys: bool = False) -> int:
    """Characters of every string in a JSON value (and of its object keys), without
    recursion."""
    chars, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, dict):
            if keys:
                chars += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return chars


def _template_message(m: ChatMessage) -> dict[str, Any]:
    # Templates know "system", not OpenAI's newer "developer" (same meaning).
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                           "content": m.content}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:  # templates (as transformers passes them) want the arguments as objects
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(
            c["function"]["arguments"])}} for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class _Namespace:
    """``api.chat.completions`` / ``api.completions``: a ``create`` bound to one kind."""

    def __init__(self, create: Callable[..., Any]) -> None:
        self.create = create


class _ChatNamespace:
    def __init__(self, create: Callable[..., Any]) -> None:
        self.completions = _Namespace(create)


# ---------------------------------------------------------------------------------------------
# Sync


class ChunkStream(Generic[T]):
    """An iterator of chunks that aborts its request when closed or dropped before the end."""

    def __init__(self, chunks: Iterator[T], on_close: Callable[[], None]) -> None:
        self._chunks = chunks
        self._on_close: Callable[[], None] | None = on_close

    def __iter__(self) -> ChunkStream[T]:
        return self

    def __next__(self) -> T:
        return next(self._chunks)

    def close(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            try:
                self._chunks.close()  # type: ignore[attr-defined]
            finally:
                on_close()

    def __enter__(self) -> ChunkStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class EngineAPI(_Frontend):
    """Sync facade: ``api.chat.completions.create(messages=[...], stream=...)``."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        self._inbox: dict[str, deque[SequenceOutput]] = {}
        self.chat = _ChatNamespace(self._create_chat)
        self.completions = _Namespace(self._create_completion)
        self.embeddings = _Namespace(self._create_embeddings)

    @classmethod
    def from_runner(cls, runner: StepRunner, tokenizer: Tokenizer, info: ModelInfo, *,
                    num_pages: int, **core_options: Any) -> EngineAPI:
        return cls(EngineCore(runner, tokenizer, info, num_pages=num_pages, **core_options))

    def _create_chat(self, /, **kwargs: Any) -> ChatCompletion | ChunkStream[ChatCompletionChunk]:
        return self._create("chat", kwargs)

    def _create_completion(self, /, **kwargs: Any) -> Completion | ChunkStream[Completion]:
        return self._create("completion", kwargs)

    def _create_embeddings(self, /, **kwargs: Any) -> CreateEmbeddingResponse:
        job = self._prepare_embeddings(kwargs)
        try:
            for ids in job.ids:  # each input a request of its own: the steps batch them
                rid = self.core.add_embedding(ids)
                job.request_ids.append(rid)
                self._inbox[rid] = deque()
            vectors = {rid: self._embedded(self._next_output(rid)) for rid in job.request_ids}
            return response(job, vectors, self.model)
        finally:
            for rid in job.request_ids:
                self._release(rid)

    def _create(self, kind: str, kwargs: dict[str, Any]) -> Any:
        prep = self._prepare(kind, kwargs)
        if _echo_only(prep):
            chunks = self._echo_only(prep)
            return ChunkStream(iter(chunks), lambda: None) if prep.stream else chunks[0]
        if prep.grammar_spec is not None:
            prep.grammar = self._compile(prep.grammar_spec)
        sub = self._add(prep)
        self._inbox[sub.request_id] = deque()
        if prep.stream:
            return ChunkStream(self._stream(sub), lambda: self._release(sub.request_id))
        try:
            col = _Collected.empty(sub.n, sub.reasoning)
            while not col.done:
                col.add(self._next_output(sub.request_id))
            return self._response(sub, col)
        finally:
            self._release(sub.request_id)

    def _stream(self, sub: _Submitted) -> Iterator[Any]:
        col = _Collected.empty(sub.n, sub.reasoning)
        yield from self._first_chunks(sub)
        while not col.done:
            yield from self._chunks_for(sub, self._next_output(sub.request_id), col)
        yield from self._last_chunks(sub, col)

    def _next_output(self, rid: str) -> SequenceOutput:
        inbox = self._inbox[rid]
        while not inbox:
            if not self.core.has_unfinished():
                raise EngineAbortedError(f"request {rid} is no longer in the engine")
            self._pump()
        return inbox.popleft()

    def _pump(self) -> None:
        try:
            outputs = self.core.step()
        except BaseException:
            # The step failed half-way; nothing in flight can be trusted. Every request ends with
            # "abort" at the next step, and the caller sees the error.
            self.core.abort_all()
            raise
        for out in outputs:
            box = self._inbox.get(out.request_id)
            if box is not None:
                box.append(out)

    def _release(self, rid: str) -> None:
        self._inbox.pop(rid, None)
        self.core.abort(rid)  # a no-op once finished


# ---------------------------------------------------------------------------------------------
# Async


class AsyncChunkStream(Generic[T]):
    """An async iterator of chunks that aborts its request when closed, cancelled or dropped."""

    def __init__(self, chunks: AsyncIterator[T], on_close: Callable[[], None]) -> None:
        self._chunks = chunks
        self._on_close: Callable[[], None] | None = on_close

    def __aiter__(self) -> AsyncChunkStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            self._close_now()

    def _close_now(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()

    async def __aenter__(self) -> AsyncChunkStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        try:
            self._close_now()
        except Exception:  # the event loop may be gone already; the request is over anyway
            pass


class AsyncEngineAPI(_Frontend):
    """Async facade: ``await api.chat.completions.create(...)``; with ``stream=True``,
    ``async for chunk in await api.chat.completions.create(..., stream=True)``."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        self._queues: dict[str, asyncio.Queue[SequenceOutput | BaseException]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self.chat = _ChatNamespace(self._create_chat)
        self.completions = _Namespace(self._create_completion)
        self.embeddings = _Namespace(self._create_embeddings)

    @classmethod
    def from_runner(cls, runner: StepRunner, tokenizer: Tokenizer, info: ModelInfo, *,
                    num_pages: int, **core_options: Any) -> AsyncEngineAPI:
        return cls(EngineCore(runner, tokenizer, info, num_pages=num_pages, **core_options))

    async def _create_chat(self, /, **kwargs: Any) -> Any:
        return await self._create("chat", kwargs)

    async def _create_completion(self, /, **kwargs: Any) -> Any:
        return await self._create("completion", kwargs)

    async def prepare_off_loop(self, prepare: Callable[[], _Prepared]) -> _Prepared:
        """Run ``prepare`` (validation, template, tokenization). Inline here: Pyodide has no
        threads. A host with threads overrides this to keep its event loop free."""
        return prepare()

    async def _compile_async(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile off the event loop: the backend's ``compile_async`` (the native one runs
        it in a child process, then on threads of its own; the browser's awaits wasm), else
        its ``compile`` where requests are prepared. Cancelling the caller (its client left)
        abandons the compile."""
        compile_async = getattr(self.core.grammar, "compile_async", None)
        if compile_async is not None:
            return await compile_async(spec)
        return await self.prepare_off_loop(lambda: self._compile(spec))

    async def _create_embeddings(self, /, **kwargs: Any) -> CreateEmbeddingResponse:
        job = await self.prepare_off_loop(lambda: self._prepare_embeddings(kwargs))
        try:
            for ids in job.ids:  # each input a request of its own: the steps batch them
                rid = self.core.add_embedding(ids)
                job.request_ids.append(rid)
                self._queues[rid] = asyncio.Queue()
            self._ensure_loop()
            vectors = {rid: self._embedded(await self._next_output(rid))
                       for rid in job.request_ids}
            return response(job, vectors, self.model)
        finally:
            for rid in job.request_ids:
                self._release(rid)

    async def _create(self, kind: str, kwargs: dict[str, Any]) -> Any:
        prep = await self.prepare_off_loop(lambda: self._prepare(kind, kwargs))
        if _echo_only(prep):
            chunks = self._echo_only(prep)

            async def replay() -> AsyncIterator[Any]:
                for chunk in chunks:
                    yield chunk
            return AsyncChunkStream(replay(), lambda: None) if prep.stream else chunks[0]
        if prep.grammar_spec is not None:
            prep.grammar = await self._compile_async(prep.grammar_spec)
        sub = self._add(prep)
        self._queues[sub.request_id] = asyncio.Queue()
        self._ensure_loop()
        if prep.stream:
            return AsyncChunkStream(self._stream(sub), lambda: self._release(sub.request_id))
        try:
            col = _Collected.empty(sub.n, sub.reasoning)
            while not col.done:
                col.add(await self._next_output(sub.request_id))
            return self._response(sub, col)
        finally:
            self._release(sub.request_id)

    async def _stream(self, sub: _Submitted) -> AsyncIterator[Any]:
        try:
            col = _Collected.empty(sub.n, sub.reasoning)
            for chunk in self._first_chunks(sub):
                yield chunk
            while not col.done:
                for chunk in self._chunks_for(sub, await self._next_output(sub.request_id), col):
                    yield chunk
            for chunk in self._last_chunks(sub, col):
                yield chunk
        finally:
            self._release(sub.request_id)

    async def _next_output(self, rid: str) -> SequenceOutput:
        item = await self._queues[rid].get()
        if isinstance(item, BaseException):
            raise item
        return item

    def _release(self, rid: str) -> None:
        self._queues.pop(rid, None)
        self.core.abort(rid)
        if self._wakeup is not None:
            self._wakeup.set()  # the loop applies the abort (frees pages) on its next step

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            # A fresh Event too: an Event belongs to the event loop that first waited on it.
            self._wakeup = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._step_loop())
        assert self._wakeup is not None
        self._wakeup.set()

    async def _step_loop(self) -> None:
        """The one step loop: runs while any request is unfinished, sleeps otherwise."""
        assert self._wakeup is not None
        core = self.core
        step_async = getattr(core.runner, "step_async", None)
        while True:
            if not core.has_unfinished():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                state = core.begin_step()
                tokens: list[int] = []
                if core.needs_async_masks(state.batch):
                    await core.fill_masks_async(state.batch)
                if state.batch is not None:
                    if step_async is not None:
                        tokens = await step_async(state.batch)
                    else:
                        tokens = core.runner.step(state.batch)
                outputs = core.finish_step(state, tokens)
            except Exception as e:  # the runner failed: fail every waiting request with it
                core.abort_all()
                for q in self._queues.values():
                    q.put_nowait(e)
                await asyncio.sleep(0)
                continue
            for out in outputs:
                q = self._queues.get(out.request_id)
                if q is not None:
                    q.put_nowait(out)
            await asyncio.sleep(0)  # let consumers read and new requests join the next step

    def abort_all(self, error: WickError | None = None) -> None:
        """Abort every unfinished request. Without ``error`` each ends with finish_reason
        "abort" (the engine's interrupt); with one, each waiting caller gets ``error`` raised
        (a stream ends with it)."""
        self.core.abort_all()
        if error is not None:
            for q in self._queues.values():
                q.put_nowait(error)
        if self._wakeup is not None:
            self._wakeup.set()  # the loop applies the aborts (frees pages) on its next step

    async def aclose(self) -> None:
        """Stop the step loop; unfinished requests are aborted (and grammar compiles)."""
        self.abort_all(EngineAbortedError("the engine was closed"))
        close_grammar = getattr(self.core.grammar, "close", None)
        if close_grammar is not None:  # the native backend's compile children
            close_grammar()
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
