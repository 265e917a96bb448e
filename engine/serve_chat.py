"""``chat.completions``: messages through the model's chat template (tools as the template
knows them, else as wick's system prompt), a reasoning model's thinking split off into
``reasoning_content``, tool calls parsed out of the text.

Streamed: per choice a first chunk with ``delta.role="assistant"``, content chunks, a chunk with
``finish_reason``; then, with ``stream_options={"include_usage": True}``, one usage chunk with no
choices. Not streamed: those chunks folded into one ``ChatCompletion``.
"""

from __future__ import annotations

import json
from typing import Any

from .core import SequenceOutput
from .endpoint import Submitted, text_chars
from .errors import ContextLengthExceededError
from .protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionUsage,
)
from .harmony import is_harmony
from .reasoning import reasoning_tags
from .sampling_defaults import fill
from .serve_generate import GenerationEndpoint, Prepared
from .tools import fallback_system_prompt, history_as_text, template_knows_tools


class ChatEndpoint(GenerationEndpoint):
    prompt_param = "messages"

    def prompt_chars(self, kwargs: dict[str, Any]) -> tuple[int, str]:
        window = self.core.info.context_window
        messages, param = kwargs.get("messages"), "messages"
        if not isinstance(messages, list):
            return 0, param  # from_dict names the type error
        if len(messages) > window:
            raise ContextLengthExceededError.before_tokenizing(
                f"'messages' holds {len(messages)} messages; this model's context window of "
                f"{window} tokens cannot take more than {window}.", param="messages",
                context_window=window)
        # every string that reaches the template: contents, names, earlier calls'
        # arguments; tool definitions and template variables with their keys
        chars = text_chars(messages)
        definitions = text_chars([kwargs.get("tools"), kwargs.get("chat_template_kwargs")],
                                 keys=True)
        if definitions > chars:  # blame the larger part
            param = "tools" if kwargs.get("tools") else "chat_template_kwargs"
        return chars + definitions, param

    def prepare(self, kwargs: dict[str, Any]) -> Prepared:
        self.check_size(kwargs)
        self.refuse_embedding_model()
        req = ChatCompletionRequest.from_dict(fill(kwargs, self.core.info.sampling_defaults))
        self.check_model(req.model)
        calls = req.tools if req.tools and req.tool_choice != "none" else []
        self.core.grammar_limits.check_request(req.response_format, calls)  # before the template
        ids, tools, reasoning = self.prompt(req)
        return self.prepared(req, ids, tools=tools, reasoning=reasoning,
                             harmony=is_harmony(self.core.info.chat_template))

    def prompt(self, req: ChatCompletionRequest
               ) -> tuple[list[int], bool, tuple[str, str, bool] | None]:
        """The prompt ids, whether the reply may call tools, and how to split a reasoning
        model's thinking off. A template that knows tools gets them (and the history's calls)
        as the model was trained; any other gets wick's system prompt and the history's calls
        and results as text (engine/tools.py)."""
        harmony = is_harmony(self.core.info.chat_template)
        messages = [_template_message(m, harmony) for m in req.messages]
        tools = bool(req.tools) and req.tool_choice != "none"
        extra = dict(req.chat_template_kwargs or {})
        if req.reasoning_effort is not None:  # (chat_template_kwargs' own is more specific)
            extra.setdefault("reasoning_effort", req.reasoning_effort)
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

    def chunk(self, sub: Submitted, choices: list[ChunkChoice],
              usage: CompletionUsage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(f"chatcmpl-{sub.request_ids[0]}", sub.created, self.model,
                                   choices, usage)

    def opening(self, sub: Submitted) -> list[Any]:
        return [self.chunk(sub, [ChunkChoice(i, ChoiceDelta(role="assistant", content=""))])
                for i in range(sub.state.prep.n)]

    def on_output(self, sub: Submitted, out: SequenceOutput) -> list[Any]:
        gen = sub.state
        choice = gen.add(out)
        # a token's logprobs go out with the step that sampled it, even when its text is
        # held back (a possible stop string, an unfinished UTF-8 character)
        lp = out.logprobs if gen.prep.params.logprobs else []
        text, finish, reasoning = out.text, out.finish_reason, ""
        made = len(choice.calls.calls)  # calls sent before this output
        if choice.harmony is not None:  # channels and calls are messages of their own
            reasoning, text, new = choice.harmony.push(text)
            if finish is not None:
                r2, c2, new2 = choice.harmony.finish(stopped=finish == "stop")
                reasoning, text, new = reasoning + r2, text + c2, new + new2
            choice.calls.calls += new
        else:
            if choice.thinking is not None:
                reasoning, text = choice.thinking.push(text)
                if finish is not None:
                    r2, c2 = choice.thinking.finish()
                    reasoning, text = reasoning + r2, text + c2
            if gen.prep.tools:  # calls leave the text; each goes out whole once its block closes
                text, _ = choice.calls.push(text)
                if finish is not None:
                    text += choice.calls.finish()[0]
        if choice.calls.calls and finish == "stop":
            finish = "tool_calls"
        calls = [{"index": made + j, **c.to_dict()}
                 for j, c in enumerate(choice.calls.calls[made:])]
        chunks = []
        if text or lp or calls or reasoning:
            content = (text or None) if calls or reasoning else text
            chunks.append(self.chunk(sub, [ChunkChoice(
                out.index, ChoiceDelta(content=content, tool_calls=calls or None,
                                       reasoning_content=reasoning or None), None,
                self.texts.chat(lp) if lp else None)]))
        if finish is not None:
            chunks.append(self.chunk(sub, [ChunkChoice(out.index, ChoiceDelta(), finish)]))
        return chunks

    def fold(self, sub: Submitted, chunks: list[ChatCompletionChunk]) -> ChatCompletion:
        n, usage = sub.state.prep.n, None
        content: list[list[str]] = [[] for _ in range(n)]
        reasoning: list[list[str]] = [[] for _ in range(n)]
        calls: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        finish: list[Any] = [None] * n
        logprobs = [ChoiceLogprobs([]) if sub.state.prep.params.logprobs else None
                    for _ in range(n)]
        for chunk in chunks:
            usage = chunk.usage or usage
            for c in chunk.choices:
                d, i = c.delta, c.index
                content[i].append(d.content or "")
                reasoning[i].append(d.reasoning_content or "")
                calls[i].extend({k: v for k, v in call.items() if k != "index"}
                                for call in d.tool_calls or ())
                finish[i] = c.finish_reason or finish[i]
                if c.logprobs is not None:
                    logprobs[i].content.extend(c.logprobs.content)
        choices = []
        for i in range(n):
            text = "".join(content[i])
            message = ChatMessage("assistant", text)
            if calls[i]:  # (content None when the reply is only calls, as OpenAI's)
                message = ChatMessage("assistant", text if text.strip() else None,
                                      tool_calls=calls[i])
            message.reasoning_content = "".join(reasoning[i]) or None
            choices.append(ChatCompletionChoice(i, message, finish[i], logprobs[i]))
        return ChatCompletion(id=f"chatcmpl-{sub.request_ids[0]}", created=sub.created,
                              model=self.model, choices=choices, usage=usage)


def _template_message(m: ChatMessage, harmony: bool = False) -> dict[str, Any]:
    # Templates know "system", not OpenAI's newer "developer" (same meaning).
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                           "content": m.content}
    if harmony:  # gpt-oss's template reads earlier thinking as "thinking", tests text with "in"
        if m.reasoning_content is not None:
            out["thinking"] = m.reasoning_content
        # (and refuses a call's message with both: a preamble beside thinking is dropped, as
        # the template drops that turn's other messages)
        if m.content is None or (m.tool_calls and m.reasoning_content is not None):
            del out["content"]
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
