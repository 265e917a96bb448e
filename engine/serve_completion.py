"""``completions`` (the legacy text API): a prompt string or token ids, ``echo`` of the prompt
(with its logprobs), legacy logprobs. Streamed: text chunks, each choice's last with its
``finish_reason``, then the usage chunk when asked; not streamed: the chunks folded into one
``Completion`` (OpenAI's one shape for both)."""

from __future__ import annotations

import uuid
from typing import Any

from .core import SequenceOutput
from .endpoint import Submitted
from .errors import ContextLengthExceededError
from .protocol import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from .protocol import CompletionUsage
from .sampling_defaults import fill
from .serve_generate import Generation, GenerationEndpoint, Prepared


class CompletionEndpoint(GenerationEndpoint):
    prompt_param = "prompt"

    def prompt_chars(self, kwargs: dict[str, Any]) -> tuple[int, str]:
        window = self.core.info.context_window
        prompt = kwargs.get("prompt")
        if isinstance(prompt, list) and len(prompt) > window:
            raise ContextLengthExceededError.before_tokenizing(
                f"The prompt holds {len(prompt)} tokens; this model's context window is "
                f"{window} tokens.", param="prompt", context_window=window)
        return (len(prompt) if isinstance(prompt, str) else 0), "prompt"

    def prepare(self, kwargs: dict[str, Any]) -> Prepared:
        self.check_size(kwargs)
        self.refuse_embedding_model()
        req = CompletionRequest.from_dict(fill(kwargs, self.core.info.sampling_defaults))
        self.check_model(req.model)
        self.core.grammar_limits.check_request(req.response_format, [])
        prompt = req.prompt
        # Token ids are used as given (no BOS added): the caller chose them.
        ids = self.core.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
        echo = None
        if req.echo:
            echo = prompt if isinstance(prompt, str) else self.core.tokenizer.decode(
                ids, skip_special_tokens=False)
        return self.prepared(req, ids, echo=echo)

    def without_model(self, prep: Prepared) -> tuple[Submitted, list[Any]] | None:
        """A request that only echoes its prompt (no new token, no prompt logprob to read) is
        answered without the model."""
        if prep.echo is None or prep.params.max_tokens != 0 or (
                prep.params.logprobs and len(prep.prompt_ids) >= 2):
            return None
        sub = Submitted([uuid.uuid4().hex], prep.stream, Generation.of(prep))
        for c in sub.state.choices:
            c.finish = "length"
        lp = self.texts.echo(prep.prompt_ids, []) if prep.params.logprobs else None
        choices = [CompletionChoice(prep.echo, i, "length", lp) for i in range(prep.n)]
        return sub, [self.chunk(sub, choices), *self.closing(sub)]

    def chunk(self, sub: Submitted, choices: list[CompletionChoice],
              usage: CompletionUsage | None = None) -> Completion:
        return Completion(f"cmpl-{sub.request_ids[0]}", sub.created, self.model, choices, usage)

    def on_output(self, sub: Submitted, out: SequenceOutput) -> list[Any]:
        gen = sub.state
        choice = gen.add(out)
        echo = gen.prep.echo
        # where this output's text starts in its choice's returned text (legacy logprobs)
        offset = choice.text_chars + len(echo or "")
        choice.text_chars += len(out.text)
        lp = out.logprobs if gen.prep.params.logprobs else []
        text = out.text
        if echo is not None and not choice.echoed and (
                out.token_ids or out.finish_reason is not None):
            # the prompt (and its logprobs) goes out once all of it was read
            choice.echoed = True
            echo_lp = (self.texts.echo(gen.prep.prompt_ids, choice.prompt_logprobs)
                       if gen.prep.params.logprobs else None)
            more = self.texts.completion(lp, offset) if lp else None
            lp_out = echo_lp.extend(more) if echo_lp and more else (echo_lp or more)
            return [self.chunk(sub, [CompletionChoice(echo + text, out.index, out.finish_reason,
                                                      lp_out)])]
        if text or lp or out.finish_reason is not None:
            return [self.chunk(sub, [CompletionChoice(
                text, out.index, out.finish_reason,
                self.texts.completion(lp, offset) if lp else None)])]
        return []

    def fold(self, sub: Submitted, chunks: list[Completion]) -> Completion:
        n, usage = sub.state.prep.n, None
        texts: list[list[str]] = [[] for _ in range(n)]
        finish: list[Any] = [None] * n
        logprobs = [CompletionLogprobs() if sub.state.prep.params.logprobs else None
                    for _ in range(n)]
        for chunk in chunks:
            usage = chunk.usage or usage
            for c in chunk.choices:
                texts[c.index].append(c.text)
                finish[c.index] = c.finish_reason or finish[c.index]
                if c.logprobs is not None:
                    logprobs[c.index].extend(c.logprobs)
        choices = [CompletionChoice("".join(texts[i]), i, finish[i], logprobs[i])
                   for i in range(n)]
        return Completion(id=f"cmpl-{sub.request_ids[0]}", created=sub.created, model=self.model,
                          choices=choices, usage=usage)
