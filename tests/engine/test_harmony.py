"""gpt-oss's harmony replies: the analysis channel as reasoning_content, the final channel as
content, messages to functions.NAME as tool calls; streamed or not; through an HF `tokenizers`
tokenizer whose harmony markers are special tokens (as gpt-oss's are)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tests.engine.engine_fakes import FakeRunner, make_info
from wick.engine.api import EngineAPI
from wick.engine.errors import InvalidRequestError
from wick.engine.harmony import HarmonyParser, is_harmony
from wick.native.tokenizer import HFTokenizer

MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
           "<|return|>", "<|call|>", "<|endoftext|>"]
# the format in small: a system message, then each message as harmony writes it (earlier
# thinking only before a call, as gpt-oss's own template does)
HARMONY_LIKE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.tool_calls %}{% if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>"
    "{{ m.thinking }}<|end|>{% endif %}{% set c = m.tool_calls[0].function %}"
    "<|start|>assistant to=functions.{{ c.name }}<|channel|>commentary json<|message|>"
    "{{ c.arguments | tojson }}<|call|>"
    "{% else %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{% endif %}"
    "{% elif m.role == 'tool' %}<|start|>functions.x to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>"
    "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if tools %}{% endif %}<|start|>assistant"
)
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}
THINK_THEN_ANSWER = ("<|channel|>analysis<|message|>User asks; answer.<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>It is sunny.")
CALL = ('<|channel|>analysis<|message|>Need the tool.<|end|>'
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city":"Oslo"}')


def harmony_tokenizer() -> HFTokenizer:
    """Byte-level BPE without merges (a token per byte) plus the markers as special tokens."""
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(MARKERS)
    return HFTokenizer(tok.to_str())


class ScriptedRunner(FakeRunner):
    """Says ``ids``, then ``end`` forever (token ids of a byte-level BPE: FakeRunner's own
    choice, which reads a byte per token, is not asked)."""

    def __init__(self, ids: list[int], end: int, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ids, self.end, self.said = ids, end, {}

    def step(self, batch):
        self.batches.append(batch)
        out = []
        for row in batch.sample_rows:
            seq = batch.seq_ids[row]
            i = self.said.get(seq, 0)
            self.said[seq] = i + 1
            out.append(self.ids[i] if i < len(self.ids) else self.end)
        return out


def _api(script: str, stop: str = "<|return|>") -> tuple[EngineAPI, HFTokenizer]:
    tok = harmony_tokenizer()
    ids = tok.encode(script) + tok.encode(stop)
    # the model's own end of text is <|endoftext|> only: <|return|>/<|call|> stop it too
    info = make_info(chat_template=HARMONY_LIKE, vocab_size=tok.vocab_size, bos_token_id=None,
                     eos_token_ids=(tok.token_to_id("<|endoftext|>"),), add_bos_token=False)
    runner = ScriptedRunner(ids, tok.token_to_id("<|endoftext|>"), 512, info.page_size)
    return EngineAPI.from_runner(runner, tok, info, num_pages=512), tok


def _stream(api, **kwargs):
    reasoning, content, calls, finish, deltas = "", "", [], None, []
    for chunk in api.chat.completions.create(messages=ASK, stream=True, **kwargs):
        for c in chunk.choices:
            deltas.append(c.delta)
            reasoning += c.delta.reasoning_content or ""
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    return reasoning, content, calls, finish, deltas


def test_the_template_is_recognised():
    assert is_harmony(HARMONY_LIKE)
    assert not is_harmony("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}")
    assert not is_harmony(None)


def test_analysis_is_reasoning_and_final_is_content():
    api, _ = _api(THINK_THEN_ANSWER)
    r = api.chat.completions.create(messages=ASK, temperature=0)
    msg = r.choices[0].message
    assert (msg.reasoning_content, msg.content) == ("User asks; answer.", "It is sunny.")
    assert r.choices[0].finish_reason == "stop" and msg.tool_calls is None
    # <|return|> ended the reply though the model's EOS list did not name it
    assert r.usage.completion_tokens == len(_api(THINK_THEN_ANSWER)[1].encode(
        THINK_THEN_ANSWER)) + 1


def test_streamed_deltas_never_show_a_marker():
    api, _ = _api(THINK_THEN_ANSWER)
    reasoning, content, calls, finish, deltas = _stream(api, temperature=0)
    assert (reasoning, content, calls, finish) == ("User asks; answer.", "It is sunny.", [],
                                                    "stop")
    assert not any("<|" in (d.content or "") + (d.reasoning_content or "") for d in deltas)
    kinds = [("r" if d.reasoning_content else "c") for d in deltas
             if d.reasoning_content or d.content]
    assert kinds == sorted(kinds, reverse=True)  # the thinking first, streamed before the answer
    assert kinds.count("r") > 1  # (as it came, not in one piece)


@pytest.mark.parametrize("script", [
    CALL,  # the recipient in the channel's header
    # the recipient in the role's header, as gpt-oss's template writes earlier calls
    '<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.'
    'get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}',
])
def test_a_message_to_a_function_is_a_tool_call(script):
    api, _ = _api(script, stop="<|call|>")
    r = api.chat.completions.create(messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.reasoning_content == "Need the tool."
    [call] = choice.message.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    api, _ = _api(script, stop="<|call|>")
    reasoning, content, calls, finish, _ = _stream(api, tools=[WEATHER])
    assert (reasoning, content, finish) == ("Need the tool.", "", "tool_calls")
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]


def test_only_auto_tool_choice_is_taken():
    api, _ = _api(CALL)
    with pytest.raises(InvalidRequestError) as e:
        api.chat.completions.create(messages=ASK, tools=[WEATHER], tool_choice="required")
    assert e.value.param == "tool_choice" and e.value.status == 400
    assert "auto" in str(e.value)


def test_earlier_thinking_reaches_the_template_as_thinking():
    api, tok = _api("<|channel|>final<|message|>ok")
    history = [*ASK, {"role": "assistant", "content": None, "reasoning_content": "Ask it.",
                      "tool_calls": [{"id": "call_1", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = api.tokenize({"messages": history, "tools": [WEATHER]})["tokens"]
    text = tok.decode(prompt, skip_special_tokens=False)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Ask it.<|end|><|start|>assistant "
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
            "<|call|>") in text
    assert text.endswith("sunny<|end|><|start|>assistant")
    # gpt-oss's template refuses a call message with both content and thinking: a preamble
    # beside thinking is left out
    history[1] = {**history[1], "content": "Let me check."}
    text = tok.decode(api.tokenize({"messages": history, "tools": [WEATHER]})["tokens"],
                      skip_special_tokens=False)
    assert "Ask it." in text and "Let me check." not in text
    assert api.chat.completions.create(messages=history, tools=[WEATHER]
                                       ).choices[0].message.content == "ok"


# ---------------------------------------------------------------------------------------------
# The parser alone


def _parse(pieces: list[str], tools: bool = True) -> tuple[str, str, list]:
    p = HarmonyParser(tools=tools)
    got = [p.push(x) for x in pieces] + [p.finish()]
    return ("".join(r for r, _, _ in got), "".join(c for _, c, _ in got),
            [(c.name, c.arguments) for _, _, calls in got for c in calls])


TRANSCRIPT = ("<|channel|>analysis<|message|>Plan: call.<|end|>"
              "<|start|>assistant<|channel|>commentary<|message|>Checking…<|end|>"
              "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\": 1}<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
              "<|message|>{\"a\": [1, 2]}")


def test_split_anywhere_the_parse_is_the_same():
    whole = _parse([TRANSCRIPT])
    assert whole == ('Plan: call.{"q": 1}', "Checking…", [("f", '{"a": [1, 2]}')])
    for at in range(1, len(TRANSCRIPT)):
        assert _parse([TRANSCRIPT[:at], TRANSCRIPT[at:]]) == whole, at
    assert _parse(list(TRANSCRIPT)) == whole


def test_a_call_without_functions_given_is_content():
    assert _parse([CALL], tools=False) == ("Need the tool.", '{"city":"Oslo"}', [])


def test_plain_text_goes_out_as_it_comes():
    p = HarmonyParser()
    assert p.push("Hello") == ("", "Hello", [])
    assert p.push(" <|end|> there") == ("", " <|end|> there", [])
    assert p.finish() == ("", "", [])


def test_a_call_that_is_not_json_or_was_cut_off_is_content():
    assert _parse(["<|channel|>commentary to=functions.f<|message|>city=Oslo"]) == (
        "", "city=Oslo", [])
    p = HarmonyParser()
    assert p.push('<|channel|>commentary to=functions.f<|message|>{"a": 1}') == ("", "", [])
    assert p.finish(stopped=False) == ("", '{"a": 1}', [])  # max_tokens: not a whole call


def test_a_call_cut_by_max_tokens_is_not_a_tool_call():
    api, tok = _api(CALL, stop="<|call|>")
    cut = len(tok.encode(CALL)) - 2  # inside the arguments
    r = api.chat.completions.create(messages=ASK, tools=[WEATHER], max_tokens=cut)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content == '{"city":"Oslo'
    assert choice.message.reasoning_content == "Need the tool."


def test_reasoning_effort_reaches_the_template():
    def prompt(**kwargs) -> str:
        api, tok = _api("<|channel|>final<|message|>ok")
        r = api.chat.completions.create(messages=ASK, max_tokens=1, **kwargs)
        assert r.choices[0].finish_reason == "length"
        return tok.decode(api.core.runner.batches[0].token_ids, skip_special_tokens=False)

    assert "Reasoning: medium<|end|>" in prompt()  # the template's own default
    assert "Reasoning: high<|end|>" in prompt(reasoning_effort="high")
    assert "Reasoning: low<|end|>" in prompt(reasoning_effort="high",
                                             chat_template_kwargs={"reasoning_effort": "low"})
    api, _ = _api("<|channel|>final<|message|>ok")
    with pytest.raises(InvalidRequestError) as e:
        api.chat.completions.create(messages=ASK, reasoning_effort="xhigh")
    assert (e.value.param, e.value.code, e.value.status) == ("reasoning_effort",
                                                              "invalid_value", 400)
