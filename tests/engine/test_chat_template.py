from __future__ import annotations

import pytest

from engine_fakes import BOS, SMOLLM2_TEMPLATE, ByteTokenizer, FakeRunner, make_info
from wick.engine import EngineCore, InvalidRequestError, render_chat_template


def test_smollm2_template_adds_default_system_and_generation_prompt():
    text = render_chat_template(SMOLLM2_TEMPLATE, [{"role": "user", "content": "Hi there"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_template_keeps_a_given_system_message():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
    ]
    text = render_chat_template(SMOLLM2_TEMPLATE, messages, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n"
    )


def test_trim_and_lstrip_blocks_like_transformers():
    template = "{% for m in messages %}\n    {{ m['content'] }}|\n{% endfor %}"
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_chat_template(template, msgs) == "    a|\n    b|\n"


def test_raise_exception_becomes_an_invalid_request():
    template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok"
    )
    assert render_chat_template(template, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(InvalidRequestError) as e:
        render_chat_template(template, [{"role": "assistant", "content": "x"}])
    assert e.value.message == "Conversation must start with a user message"
    assert e.value.param == "messages" and e.value.status == 400


def test_no_template_is_a_clear_error():
    with pytest.raises(InvalidRequestError) as e:
        render_chat_template(None, [{"role": "user", "content": "x"}])
    assert e.value.code == "no_chat_template"
    assert "completions API" in e.value.message


def test_sandbox_blocks_attribute_escapes():
    template = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(InvalidRequestError) as e:
        render_chat_template(template, [{"role": "user", "content": "x"}])
    assert e.value.code == "chat_template_error"


def _core(**info):
    info_obj = make_info(**info)
    return EngineCore(FakeRunner(16, 4), ByteTokenizer(), info_obj, num_pages=16)


def test_bos_prepended_once_when_the_template_lacks_it():
    core = _core()
    ids = core.chat_prompt_ids([{"role": "user", "content": "hi"}])
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert ids[1:] == ByteTokenizer().encode(
        render_chat_template(SMOLLM2_TEMPLATE, [{"role": "user", "content": "hi"}]))


def test_no_double_bos_when_the_template_writes_it():
    core = _core(chat_template="{{ bos_token }}" + SMOLLM2_TEMPLATE)
    ids = core.chat_prompt_ids([{"role": "user", "content": "hi"}])
    assert ids[0] == BOS and ids.count(BOS) == 1


def test_no_bos_when_the_model_does_not_want_one():
    core = _core(add_bos_token=False)
    ids = core.prompt_ids("abc")
    assert ids == [97, 98, 99]
    assert _core().prompt_ids("abc") == [BOS, 97, 98, 99]
    assert _core().prompt_ids("<s>abc") == [BOS, 97, 98, 99]
