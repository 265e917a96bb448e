"""Reasoning models: <think>...</think> split into reasoning_content and content, in responses
and stream deltas; enable_thinking through chat_template_kwargs."""

from __future__ import annotations

import pytest

from tests.engine.engine_fakes import IM_END, ByteTokenizer, FakeRunner, make_info
from wick.engine.api import EngineAPI
from wick.engine.errors import InvalidRequestError
from wick.engine.reasoning import ReasoningParser, reasoning_tags

# Qwen3's template in small: an empty think block when thinking is off
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}"
)
# a template that opens the block itself (as Qwen3-Thinking-2507's)
OPENS_BLOCK = QWEN3_LIKE.replace("{% if enable_thinking", "<think>\n{% if enable_thinking")
ASK = [{"role": "user", "content": "2+2?"}]


class ScriptedRunner(FakeRunner):
    """Says ``script`` (bytes, one token each), then <|im_end|>."""

    def __init__(self, script: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.script = script.encode()
        self.said: dict[int, int] = {}

    def step(self, batch):
        super().step(batch)  # checks the index arrays
        out = []
        for row in batch.sample_rows:
            seq = batch.seq_ids[row]
            i = self.said.get(seq, 0)
            self.said[seq] = i + 1
            out.append(self.script[i] if i < len(self.script) else IM_END)
        return out


def _api(script: str, template: str = QWEN3_LIKE) -> EngineAPI:
    info = make_info(chat_template=template)
    return EngineAPI.from_runner(ScriptedRunner(script, 512, info.page_size), ByteTokenizer(),
                                 info, num_pages=512)


def _stream(api, **kwargs) -> tuple[str, str, list]:
    reasoning, content, deltas = "", "", []
    for chunk in api.chat.completions.create(messages=ASK, stream=True, **kwargs):
        for c in chunk.choices:
            deltas.append(c.delta)
            reasoning += c.delta.reasoning_content or ""
            content += c.delta.content or ""
    return reasoning, content, deltas


def test_tags_come_from_the_template():
    assert reasoning_tags(QWEN3_LIKE) == ("<think>", "</think>")
    assert reasoning_tags("{{ messages }}") is None and reasoning_tags(None) is None


def test_thinking_is_split_from_the_answer():
    api = _api("<think>\nadd them\n</think>\n\nIt is 4.")
    r = api.chat.completions.create(messages=ASK, temperature=0)
    message = r.choices[0].message
    assert message.reasoning_content == "\nadd them\n"
    assert message.content == "It is 4."
    assert message.to_dict()["reasoning_content"] == "\nadd them\n"
    assert r.choices[0].finish_reason == "stop"


def test_streamed_deltas_carry_reasoning_then_content():
    api = _api("<think>\nadd them\n</think>\n\nIt is 4.")
    reasoning, content, deltas = _stream(api, temperature=0)
    assert (reasoning, content) == ("\nadd them\n", "It is 4.")
    # one token per step: the tags never show, each delta is one kind
    assert not any("<" in (d.content or "") + (d.reasoning_content or "") for d in deltas)
    assert not any(d.content and d.reasoning_content for d in deltas)
    kinds = [("r" if d.reasoning_content else "c") for d in deltas
             if d.reasoning_content or d.content]
    assert kinds == sorted(kinds, reverse=True)  # all reasoning before any content


def test_a_tool_call_after_thinking_is_parsed_from_the_answer_only():
    """The think block may mention a call's tag; only the answer's call is a call, streamed
    or not (the non-streamed reply is the stream folded)."""
    from tests.engine.test_tools import WEATHER

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    thought = "a <tool_call> or not?"
    api = _api(f"<think>\n{thought}</think>\n\n{call}")
    whole = api.chat.completions.create(messages=ASK, tools=[WEATHER])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content.strip() == thought
    assert [(c["function"]["name"], c["function"]["arguments"])
            for c in choice.message.tool_calls] == [("get_weather", '{"city": "Oslo"}')]
    api = _api(f"<think>\n{thought}</think>\n\n{call}")
    reasoning, content, deltas = _stream(api, tools=[WEATHER])
    assert reasoning.strip() == thought and not content.strip()
    assert [c["function"]["name"] for d in deltas for c in d.tool_calls or []] == ["get_weather"]


def test_enable_thinking_false_reaches_the_template_and_gives_content_only():
    api = _api("It is 4.")
    prompt = api.tokenize({"messages": ASK,
                           "chat_template_kwargs": {"enable_thinking": False}})["tokens"]
    text = ByteTokenizer().decode(prompt, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    r = api.chat.completions.create(messages=ASK, temperature=0,
                                    chat_template_kwargs={"enable_thinking": False})
    assert r.choices[0].message.content == "It is 4."
    assert r.choices[0].message.reasoning_content is None
    _, content, deltas = _stream(_api("It is 4."), chat_template_kwargs={"enable_thinking": False})
    assert content == "It is 4." and not any(d.reasoning_content for d in deltas)


def test_a_prompt_that_opens_the_block_makes_the_first_tokens_reasoning():
    api = _api("add them</think>\n\nIt is 4.", template=OPENS_BLOCK)
    message = api.chat.completions.create(messages=ASK, temperature=0).choices[0].message
    assert (message.reasoning_content, message.content) == ("add them", "It is 4.")


def test_output_cut_while_thinking_is_all_reasoning():
    api = _api("<think>\nhmm, let me see")
    r = api.chat.completions.create(messages=ASK, temperature=0, max_tokens=12)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.reasoning_content == "\nhmm,"
    assert r.choices[0].message.content == ""


def test_a_model_without_think_tags_in_its_template_is_not_split():
    from tests.engine.engine_fakes import SMOLLM2_TEMPLATE

    api = _api("<think>x</think>y", template=SMOLLM2_TEMPLATE)
    message = api.chat.completions.create(messages=ASK, temperature=0).choices[0].message
    assert message.content == "<think>x</think>y" and message.reasoning_content is None


def test_earlier_reasoning_is_accepted_in_the_history():
    api = _api("ok")
    history = [*ASK, {"role": "assistant", "content": "4", "reasoning_content": "add"},
               {"role": "user", "content": "and 3+3?"}]
    assert api.chat.completions.create(messages=history).choices[0].message.content == "ok"
    with pytest.raises(InvalidRequestError) as e:
        api.chat.completions.create(messages=[{"role": "user", "content": "x",
                                               "reasoning_content": "no"}])
    assert e.value.param == "messages[0].reasoning_content"


@pytest.mark.parametrize("kwargs, param", [
    ({"messages": []}, "chat_template_kwargs.messages"),
    ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
])
def test_reserved_template_variables_are_refused(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        _api("x").chat.completions.create(messages=ASK, chat_template_kwargs=kwargs)
    assert e.value.param == param and e.value.status == 400


def test_chat_template_kwargs_must_be_an_object():
    with pytest.raises(InvalidRequestError) as e:
        _api("x").chat.completions.create(messages=ASK, chat_template_kwargs=["x"])
    assert e.value.param == "chat_template_kwargs" and e.value.code == "invalid_type"


@pytest.mark.parametrize("pieces", [
    ["<think>", "a", "</think>", "b"],
    ["<th", "ink>a</th", "ink>", "\n", "\nb"],
    ["<think>a</think>b"],
])
def test_parser_handles_tags_split_anywhere(pieces):
    p = ReasoningParser()
    got = [p.push(x) for x in pieces] + [p.finish()]
    assert ("".join(r for r, _ in got), "".join(c for _, c in got)) == ("a", "b")
