"""A model's own sampling defaults (engine/sampling_defaults.py): read from a
generation_config.json, applied where a request leaves a field unset, never over a field it
gives; an interactive chat's fallback for a model without any."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.engine.engine_fakes import ByteTokenizer, FakeRunner, make_info
from wick.engine.api import EngineAPI
from wick.engine.errors import ArtifactError
from wick.engine.sampling_defaults import INTERACTIVE, chat_values, describe, fill, read_values

QWEN_LIKE = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
             "repetition_penalty": 1.05, "bos_token_id": 1, "max_new_tokens": 512}


def test_values_are_the_sampling_keys_a_request_could_give():
    assert read_values(QWEN_LIKE) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                      "repetition_penalty": 1.05}
    assert read_values({"temperature": 7, "top_p": 0, "top_k": True, "min_p": "x"}) == {}
    assert read_values({"do_sample": False, "temperature": 0.6}) == {"temperature": 0.6}
    assert read_values(None) == {} and read_values([1]) == {}


def test_fill_takes_what_the_request_leaves_unset():
    defaults = {"values": {"temperature": 0.2, "top_p": 0.9}, "source": "model card"}
    assert fill({"messages": []}, defaults) == {"messages": [], "temperature": 0.2,
                                                "top_p": 0.9}
    assert fill({"temperature": 1.0, "top_p": None}, defaults) == {"temperature": 1.0,
                                                                   "top_p": 0.9}
    assert fill({"temperature": 0}, None) == {"temperature": 0}
    assert describe(defaults) == "temperature 0.2, top_p 0.9 (model card)"
    assert describe(None) == "none"


def test_an_interactive_chat_falls_back_only_where_the_model_says_nothing():
    assert chat_values(None) == INTERACTIVE
    assert chat_values({"values": {}, "source": "x"}) == INTERACTIVE
    assert chat_values({"values": {"temperature": 0.2}, "source": "x"}) == {}


def _api(defaults):
    info = make_info(sampling_defaults=defaults)
    return EngineAPI.from_runner(FakeRunner(64, info.page_size), ByteTokenizer(), info,
                                 num_pages=64)


@pytest.mark.parametrize("endpoint,body", [("chat", {"messages": [{"role": "user",
                                                                   "content": "hi"}]}),
                                           ("completion", {"prompt": "hi"})])
def test_requests_get_the_models_defaults_and_keep_their_own(endpoint, body):
    api = _api({"values": {"temperature": 0.3, "top_k": 20, "repetition_penalty": 1.1},
                "source": "generation_config.json"})
    params = api.endpoints[endpoint].prepare(dict(body)).params
    assert (params.temperature, params.top_k, params.repetition_penalty) == (0.3, 20, 1.1)
    assert params.top_p == 1.0  # (the model says nothing of it: OpenAI's default)
    params = api.endpoints[endpoint].prepare({**body, "temperature": 1.0, "top_k": None}).params
    assert (params.temperature, params.top_k) == (1.0, 20)
    plain = _api(None).endpoints[endpoint].prepare(dict(body)).params
    assert (plain.temperature, plain.top_k, plain.repetition_penalty) == (1.0, 0, 1.0)


def test_the_manifest_section_is_checked_and_cleaned():
    with pytest.raises(ArtifactError):
        make_info(sampling_defaults={"values": [0.2]})
    info = make_info(sampling_defaults={"values": {"temperature": 9, "top_p": 0.5},
                                        "source": "generation_config.json"})
    assert info.sampling_defaults == {"values": {"top_p": 0.5},
                                      "source": "generation_config.json"}


def test_wick_chat_sends_the_fallback_under_its_own_settings():
    from wick.server.chat_cli import ChatSession

    def session(defaults, **sampling):
        engine = SimpleNamespace(core=SimpleNamespace(info=make_info(sampling_defaults=defaults)))
        return ChatSession(engine, sampling=sampling)

    s = session(None, temperature=0.0)
    assert s.turn_sampling == {**INTERACTIVE, "temperature": 0.0}
    assert "(interactive: the model gives none)" in s.defaults_text()
    own = {"values": {"temperature": 0.2, "top_p": 0.9}, "source": "model card"}
    s = session(own, max_tokens=5)
    assert s.turn_sampling == {"max_tokens": 5}  # (the engine applies the model's own)
    assert s.defaults_text() == "sampling defaults: temperature 0.2, top_p 0.9 (model card)"
