"""``wick serve``'s REST API, over real HTTP with the unmodified ``openai`` client.

Two tiny random Llamas (compiled q0f32, context window 128) run on the native wgpu backend
behind a live uvicorn server on a free loopback port. References are independent of the
server: the engine's own token counts, single-client outputs, the ``openai`` package's
exception types, and a schemathesis fuzz pass over the generated OpenAPI schema.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server.conftest import (
    HELLO,
    WINDOW,
    LiveServer,
    assert_openai_error,
    engine_loader,
    post,
)
from wick.engine.draft_length import StepCost
from wick.server.app import ModelPool, create_app
from wick.server.artifact_host import ArtifactHost

# ---------------------------------------------------------------------------------------------
# The happy paths


def test_models_list_and_retrieve(client, names, tiny_a, tiny_b):
    from wick.engine.artifact import MANIFEST_NAME

    expected = [json.loads((p / MANIFEST_NAME).read_text())["model_id"] for p in (tiny_a, tiny_b)]
    page = client.models.list()
    assert [m.id for m in page.data] == expected == names
    assert all(m.object == "model" and m.owned_by == "wick" for m in page.data)
    # wick's fields: tiny models have no sampling defaults, so a chat UI sends Ollama's
    from wick.engine.sampling_defaults import INTERACTIVE

    assert all(m.task == "generate" and m.sampling_defaults is None
               and m.chat_sampling == INTERACTIVE for m in page.data)
    assert client.models.retrieve(names[1]).id == names[1]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def test_chat_stream_joins_to_the_nonstream_text(client, engine, names):
    kwargs = dict(model=names[0], messages=HELLO, max_tokens=16, temperature=0.9, seed=7,
                  extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kwargs)
    assert full.object == "chat.completion" and full.model == names[0]
    assert full.choices[0].finish_reason == "length"
    assert full.choices[0].message.role == "assistant"
    prompt_tokens = len(engine.core.chat_prompt_ids(HELLO))
    assert full.usage.prompt_tokens == prompt_tokens
    assert full.usage.completion_tokens == 16
    assert full.usage.total_tokens == prompt_tokens + 16

    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens,
                                         usage.total_tokens) == (prompt_tokens, 16, full.usage.total_tokens)
    # the second request read the first one's prompt pages (all but the one with its last token)
    ps = engine.core.info.page_size
    assert usage.prompt_tokens_details.cached_tokens == (prompt_tokens - 1) // ps * ps > 0

    # without include_usage no usage chunk reaches the client
    plain = list(client.chat.completions.create(**kwargs, stream=True))
    assert all(c.usage is None and c.choices for c in plain)
    assert "".join(c.choices[0].delta.content or "" for c in plain) == text


def test_sse_wire_format(server, names):
    body = {"model": names[0], "messages": HELLO, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[6:])["object"] == "chat.completion.chunk"


def test_completions(client, engine, names):
    prompt = "Once upon a time"
    full = client.completions.create(model=names[0], prompt=prompt, max_tokens=12, seed=3,
                                     extra_body={"ignore_eos": True})
    assert full.object == "text_completion"
    assert full.usage.prompt_tokens == len(engine.core.prompt_ids(prompt))
    assert full.usage.completion_tokens == 12
    streamed = client.completions.create(model=names[0], prompt=prompt, max_tokens=12, seed=3,
                                         stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full.choices[0].text
    ids = client.completions.create(model=names[0], prompt=[1, 2, 3], max_tokens=4,
                                    extra_body={"ignore_eos": True})
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 4


def test_n_choices(client, names):
    r = client.chat.completions.create(model=names[0], messages=HELLO, n=2, max_tokens=6,
                                       seed=1, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(
        model=names[0], messages=HELLO, n=2, max_tokens=6, seed=1, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    for i in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices and c.choices[0].index == i)
        assert text == r.choices[i].message.content
    assert chunks[-1].usage.completion_tokens == 12


def test_model_field_selects_the_engine(client, server, names):
    r = client.chat.completions.create(model=names[1], messages=HELLO, max_tokens=2)
    assert r.model == names[1]
    engine_b = server.pool.engines[names[1]]
    quantized = f"{engine_b.core.info.model_id}-{engine_b.core.info.quantization}"
    assert client.completions.create(model=quantized, prompt="a", max_tokens=2).model == names[1]
    # without a model field, the first model answers
    assert post(server, "/v1/completions", {"prompt": "a", "max_tokens": 1}).json()["model"] \
        == names[0]


def test_chat_page(server):
    r = httpx.get(f"{server.url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "/static/chat.js" in r.text and "://" not in r.text
    js = httpx.get(f"{server.url}/static/chat.js")
    assert js.status_code == 200 and "/v1/chat/completions" in js.text
    assert "https://" not in js.text and "http://" not in js.text


def test_served_artifact_is_hosted(server, tiny_a):
    from wick.engine.artifact import MANIFEST_NAME

    manifest = json.loads((tiny_a / MANIFEST_NAME).read_text())
    base = f"{server.url}/artifacts/{tiny_a.name}"
    r = httpx.get(f"{base}/{MANIFEST_NAME}")
    # served as written, except the local path it was compiled from: only its last part
    assert "/" in manifest["source"]["model"]
    local = manifest["source"]["model"]
    manifest["source"]["model"] = Path(local).name
    assert r.status_code == 200 and r.json() == manifest
    assert local not in r.text and str(Path(local).parent) not in r.text
    assert r.headers["cache-control"] == "no-cache" and r.headers["etag"].startswith('"')
    shard = manifest["shards"][0]
    r = httpx.get(f"{base}/{shard['file']}", headers={"Range": "bytes=100-199"})
    assert r.status_code == 206
    assert r.content == (tiny_a / shard["file"]).read_bytes()[100:200]
    assert r.headers["etag"] == f'"{shard["sha256"]}"'
    assert "immutable" in r.headers["cache-control"]


# ---------------------------------------------------------------------------------------------
# Errors: OpenAI's shape, the right status, never a 500


def test_client_errors_through_the_openai_client(client, names):
    def bad_request(**kw) -> dict:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**{"model": names[0], "messages": HELLO,
                                              "max_tokens": 4, **kw})
        assert e.value.status_code == 400
        return e.value.body

    assert bad_request(extra_body={"bogus": 1})["param"] == "bogus"
    err = bad_request(frequency_penalty=2.5)
    assert (err["param"], err["code"]) == ("frequency_penalty", "invalid_value")
    err = bad_request(tools=[{"type": "function", "function": {"name": "f g"}}])
    assert (err["param"], err["code"]) == ("tools[0].function.name", "invalid_value")
    assert bad_request(temperature=5)["param"] == "temperature"
    assert bad_request(max_tokens=0)["param"] == "max_tokens"
    err = bad_request(messages=[{"role": "user", "content": "x" * 200}])
    assert (err["param"], err["code"]) == ("messages", "context_length_exceeded")
    assert bad_request(max_tokens=WINDOW)["code"] == "context_length_exceeded"
    assert bad_request(stream=True, top_p=0)["param"] == "top_p"  # streams validate up front
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=names[0], prompt="x" * 300, max_tokens=1)
    assert (e.value.body["param"], e.value.body["code"]) == ("prompt", "context_length_exceeded")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert e.value.status_code == 404
    assert (e.value.body["code"], e.value.body["param"]) == ("model_not_found", "model")


@pytest.mark.parametrize("body, param, code", [
    (b'{"messages": [', None, "invalid_json"),
    (b"\xff\xfe", None, "invalid_json"),
    (b"", None, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', None, "invalid_json"),
    (b"[" * 100_000 + b"]" * 100_000, None, "invalid_json"),
    (b"[1, 2]", None, "invalid_type"),
    (b'"text"', None, "invalid_type"),
    (b"{}", "messages", "missing_required_parameter"),
    (b'{"messages": []}', "messages", "invalid_value"),
    (b'{"messages": [{"content": "hi"}]}', "messages[0].role", "missing_required_parameter"),
    (b'{"messages": "hi"}', "messages", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "model": 5}', "model", "invalid_type"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "self": 1}', "self",
     "unknown_parameter"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream_options": {}}',
     "stream_options", "invalid_value"),
])
def test_malformed_bodies(server, body, param, code):
    assert_openai_error(post(server, "/v1/chat/completions", body), 400, param=param, code=code)


def test_completion_errors(server):
    assert_openai_error(post(server, "/v1/completions", {}), 400, param="prompt")
    assert_openai_error(post(server, "/v1/completions", {"prompt": "a", "best_of": 3}), 400,
                        param="best_of", code="unsupported_parameter")


def test_routes_methods_and_limits(server):
    err = assert_openai_error(httpx.get(f"{server.url}/v1/nope"), 404, code="not_found")
    assert "/v1/nope" in err["message"]
    r = httpx.get(f"{server.url}/v1/chat/completions")
    assert_openai_error(r, 405, code="method_not_allowed")
    assert r.headers["allow"] == "POST"
    assert_openai_error(httpx.delete(f"{server.url}/v1/models"), 405)
    # HEAD wherever GET answers (they were 405s): GET's status and headers, no body
    model = next(iter(server.pool.engines))
    for path in ("/", "/health", "/v1/models", f"/v1/models/{model}", "/web/models.json",
                 "/openapi.json", "/static/chat.js"):
        got, head = httpx.get(f"{server.url}{path}"), httpx.head(f"{server.url}{path}")
        after = httpx.get(f"{server.url}{path}")
        assert got.status_code == head.status_code == 200, path
        assert head.content == b"" and got.content, path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if "content-length" in got.headers:
            # /web/models.json lists the shared artifact cache, which another test worker
            # may add to between the requests: HEAD must match a GET on one side of it
            lengths = {got.headers["content-length"], after.headers["content-length"]}
            assert head.headers["content-length"] in lengths, path
    assert httpx.head(f"{server.url}/v1/models/nope").status_code == 404
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (5 << 20)}]})
    assert_openai_error(post(server, "/v1/chat/completions", big), 413,
                        code="request_too_large")

    def chunked():
        for _ in range(5):
            yield b" " * (1 << 20)

    r = httpx.post(f"{server.url}/v1/chat/completions", content=chunked(), timeout=60,
                   headers={"Content-Type": "application/json"})
    assert_openai_error(r, 413, code="request_too_large")


def test_cors_is_off_by_default(server):
    r = httpx.options(f"{server.url}/v1/chat/completions",
                      headers={"Origin": "https://evil.example",
                               "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


# ---------------------------------------------------------------------------------------------
# Concurrency and disconnects


class StepRecorder:
    """Wraps a runner's ``step`` (the async facade calls it from ``step_async``) to record the
    number of sequences in every step."""

    def __init__(self, runner) -> None:
        self.runner, self.sizes = runner, []
        self._step = runner.step

        def step(batch):
            self.sizes.append(len(batch.seq_ids))
            return self._step(batch)

        runner.step = step

    def restore(self) -> None:
        del self.runner.step


def test_sixteen_concurrent_streams_share_steps(client, engine, names):
    prompts = [f"client {i} asks: " + "why? " * (i % 5) for i in range(16)]

    def stream(i: int) -> str:
        chunks = client.chat.completions.create(
            model=names[0], messages=[{"role": "user", "content": prompts[i]}], max_tokens=24,
            temperature=0, stream=True, extra_body={"ignore_eos": True})
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    solo = [stream(i) for i in range(16)]
    initial = engine.core.kv.available_pages
    assert initial == engine.core.kv.num_pages
    recorder = StepRecorder(engine.core.runner)
    try:
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(stream, range(16)))
    finally:
        recorder.restore()
    assert together == solo
    assert all(len(t) > 0 for t in together)
    assert max(recorder.sizes) >= 8, recorder.sizes  # many sequences decoded in one step
    assert sum(s > 1 for s in recorder.sizes) >= 20
    assert len(recorder.sizes) < 16 * 24  # far fewer steps than tokens
    _wait_for(lambda: engine.core.kv.available_pages == initial)


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_disconnect_mid_stream_aborts_and_frees_pages(server, engine, names):
    initial = engine.core.kv.available_pages
    recorder = StepRecorder(engine.core.runner)
    body = {"model": names[0], "messages": HELLO, "max_tokens": 90, "ignore_eos": True,
            "stream": True}
    try:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            lines = (line for line in r.iter_lines() if line)
            got = [next(lines) for _ in range(3)]  # role chunk + a couple of tokens
            assert engine.core.has_unfinished()
            assert engine.core.kv.available_pages < initial
        # leaving the block closed the connection
        _wait_for(lambda: not engine.core.has_unfinished() and
                  engine.core.kv.available_pages == initial)
        steps = len(recorder.sizes)
    finally:
        recorder.restore()
    assert sum(1 for line in got if line.startswith("data: ")) >= 3
    assert steps < 60, f"the request ran {steps} steps: it was not aborted"


def test_disconnect_during_a_nonstream_request_aborts_it(server, engine, names):
    initial = engine.core.kv.available_pages
    recorder = StepRecorder(engine.core.runner)
    # pace the steps (>= 20 ms each) so that 90 tokens cannot finish before the disconnect,
    # however fast the device is
    runner, recorded_step = engine.core.runner, engine.core.runner.step
    runner.step = lambda batch: (time.sleep(0.02), recorded_step(batch))[1]
    body = {"model": names[0], "messages": HELLO, "max_tokens": 90, "ignore_eos": True}
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=0.4)
        _wait_for(lambda: not engine.core.has_unfinished() and
                  engine.core.kv.available_pages == initial)
        steps = len(recorder.sizes)
    finally:
        runner.step = recorded_step
        recorder.restore()
    assert steps < 60, f"the request ran {steps} steps: it was not aborted"


def test_huge_top_k_is_a_client_error(server, names):
    r = post(server, "/v1/chat/completions",
             {"model": names[0], "messages": HELLO, "max_tokens": 1, "top_k": 2 ** 40})
    assert_openai_error(r, 400, param="top_k")


def test_n_over_openai_limit_is_a_client_error(server, names):
    r = post(server, "/v1/chat/completions",
             {"model": names[0], "messages": HELLO, "max_tokens": 1, "n": 100000})
    assert_openai_error(r, 400, param="n")


# ---------------------------------------------------------------------------------------------
# Loading, health and the API key


def test_health_while_loading_then_api_key(tiny_a):
    release = threading.Event()
    name, load = engine_loader(tiny_a)

    def slow_load():
        assert release.wait(60)
        return load()

    app = create_app(ModelPool([(name, slow_load)]), api_key="sekret")
    live = LiveServer(app)
    try:
        auth = {"Authorization": "Bearer sekret"}
        r = httpx.get(f"{live.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = post(live, "/v1/chat/completions", {"messages": HELLO}, headers=auth)
        assert_openai_error(r, 503, code="model_loading")
        assert r.headers["retry-after"]
        assert httpx.get(f"{live.url}/v1/models", headers=auth).json()["data"] == []
        release.set()
        live.wait_ready()
        assert httpx.get(f"{live.url}/health").json()["status"] == "ok"

        base = f"{live.url}/v1"
        for key in ("wrong", "sekretX", ""):
            with pytest.raises(openai.AuthenticationError) as e:
                OpenAI(base_url=base, api_key=key or "x", max_retries=0).models.list()
            assert e.value.status_code == 401
            assert e.value.body["code"] == "invalid_api_key"
        assert_openai_error(httpx.get(f"{base}/models"), 401, code="invalid_api_key")
        assert_openai_error(post(live, "/v1/chat/completions", {"messages": HELLO}), 401)
        good = OpenAI(base_url=base, api_key="sekret", max_retries=0)
        assert len(good.models.list().data) == 1
        model = good.models.list().data[0].id
        r = good.chat.completions.create(messages=HELLO, max_tokens=2, model=model)
        assert r.usage.completion_tokens <= 2
        assert httpx.get(f"{live.url}/").status_code == 200  # the page needs no key
    finally:
        release.set()
        live.stop()


def test_failed_load_reports_503():
    def broken():
        raise RuntimeError("no such GPU")

    app = create_app(ModelPool([("broken", broken)]))
    live = LiveServer(app)
    try:
        _wait_for(lambda: app.state.pool.state == "failed")
        r = httpx.get(f"{live.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "failed"
        assert "no such GPU" in r.json()["error"]
        assert_openai_error(post(live, "/v1/chat/completions", {"messages": HELLO}), 503,
                            code="model_load_failed")
    finally:
        live.stop()


def test_health_reports_a_failed_step_until_one_succeeds(tiny_a):
    """A step the device fails (the runner raises) fails the request with a 5xx and shows in
    /health as the engine's ``step_error``; the next step that runs clears it."""
    from wick.server.local import AsyncEngine

    engine = AsyncEngine(str(tiny_a))
    runner = engine.core.runner

    def lost(batch):
        raise RuntimeError("device lost")

    app = create_app(ModelPool.of(engine))
    live = LiveServer(app)
    try:
        live.wait_ready()
        name = next(iter(app.state.pool.engines))
        runner.step = lost
        r = post(live, "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert r.status_code >= 500 and "device lost" not in r.text  # (no internals out)
        assert httpx.get(f"{live.url}/health").json()["engines"][name]["step_error"] == \
            "RuntimeError: device lost"
        del runner.step  # (the class's step again)
        r = post(live, "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert "step_error" not in httpx.get(f"{live.url}/health").json()["engines"][name]
    finally:
        live.stop()


def test_cors_when_enabled():
    from starlette.testclient import TestClient

    app = create_app(ModelPool.of(), cors_origins=["https://app.example"])
    with TestClient(app, base_url="http://localhost") as c:
        r = c.options("/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = c.options("/v1/chat/completions", headers={
            "Origin": "https://other.example", "Access-Control-Request-Method": "POST"})
        assert r.headers.get("access-control-allow-origin") != "https://other.example"


def test_openapi_schemas_come_from_the_engine_protocol():
    from dataclasses import fields

    from starlette.testclient import TestClient

    from wick.engine.protocol import ChatCompletionRequest, CompletionRequest

    with TestClient(create_app(ModelPool.of()), base_url="http://localhost") as c:
        spec = c.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    from wick.engine.protocol import _DEFAULT_ONLY_CHAT, _DEFAULT_ONLY_COMPLETION, _IGNORED

    # the dataclass's fields, and the keys from_dict takes besides
    for cls, more in ((ChatCompletionRequest, {"max_completion_tokens", *_DEFAULT_ONLY_CHAT}),
                      (CompletionRequest, {"best_of", *_DEFAULT_ONLY_COMPLETION})):
        assert set(schemas[cls.__name__]["properties"]) == \
            {f.name for f in fields(cls)} | more | set(_IGNORED)
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionRequest")
    assert "messages" in schemas["ChatCompletionRequest"]["required"]
    assert "422" not in chat["responses"]


# ---------------------------------------------------------------------------------------------
# Fuzzing the OpenAPI schema in-process (ASGI, no sockets)


@pytest.fixture(scope="module")
def fuzz_schema(tiny_a):
    import schemathesis

    from tests.openapi_fuzz import bound_work, work_bounds
    from wick.server.local import AsyncEngine

    host = ArtifactHost(None, {tiny_a.name: tiny_a})
    # schemathesis addresses the app as "testserver"
    app = create_app(ModelPool.of(AsyncEngine(str(tiny_a))), artifacts=host,
                     allowed_hosts=["testserver"])
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)

    name = next(iter(app.state.pool.engines))
    bounds = work_bounds(schema.raw_schema)

    @schema.hook
    def map_body(context, body):
        path = context.operation.path if context.operation is not None else ""
        return bound_work(body, path, name, bounds)

    return schema


def test_fuzz_openapi_no_5xx_and_openai_errors(fuzz_schema):
    """Every operation, valid and invalid inputs: no 5xx, every 4xx an OpenAI error body, and
    the schema and validation agree (schemathesis' positive_data_acceptance and
    negative_data_rejection: what the schema allows is answered, what it forbids refused),
    but for what no schema can say: how many tokens a prompt makes.
    (Driven with hypothesis directly: schemathesis' lazy pytest fixture breaks on pytest 9.)"""
    import os

    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import (
        negative_data_rejection,
        positive_data_acceptance,
    )

    from wick.server.request_schemas import refused_beyond_any_schema

    seen: dict[str, set[int]] = {}
    examples = int(os.environ.get("WICK_FUZZ_EXAMPLES", "30"))

    def check(case) -> None:
        response = case.call()
        seen.setdefault(f"{case.method} {case.path}", set()).add(response.status_code)
        err = response.json()["error"] if response.status_code >= 400 and \
            response.headers.get("content-type", [""])[0] == "application/json" else None
        if err is None or not refused_beyond_any_schema(err):
            case.validate_response(response, checks=[positive_data_acceptance,
                                                     negative_data_rejection])
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400:
            body = response.json()
            assert set(body) == {"error"}, body
            assert {"message", "type", "param", "code"} <= set(body["error"]), body
        ctype = response.headers.get("content-type", [""])[0]
        if response.status_code == 200 and case.path in ("/v1/chat/completions",
                                                          "/v1/completions"):
            if ctype.startswith("text/event-stream"):
                assert response.text.rstrip().endswith("data: [DONE]")
            else:
                assert response.json()["usage"]["completion_tokens"] >= 0

    for result in fuzz_schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(case) -> None:
                check(case)

            try:
                run()
            except Unsatisfiable:  # nothing can be invalid in an operation without inputs
                assert mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET"
    assert {200, 400} <= seen["POST /v1/chat/completions"], seen
    assert {200, 400} <= seen["POST /v1/completions"], seen


def test_prediction_through_the_official_client(client, engine, names):
    """OpenAI's ``prediction=`` argument: the text is the text without it (greedy and seeded),
    the drafts are counted in usage.completion_tokens_details, and speculation shows in
    /health. (This random model writes bytes that are not UTF-8, whose text does not tokenize
    back to its tokens: how much of a faithful prediction is kept is tested on SmolLM2,
    tests/e2e/test_speculative_real.py.)"""
    # draft lengths by a fixed row cost, not the one this machine's load measures (a busy CI
    # machine can make a verify row look dearer than a step: then nothing is drafted)
    engine.core.step_cost = StepCost(prior=0.2, learn=False)
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 3}):
        kwargs = dict(model=names[0], messages=HELLO, max_tokens=24,
                      extra_body={"ignore_eos": True}, **sampling)
        plain = client.chat.completions.create(**kwargs)
        text = plain.choices[0].message.content
        before = engine.core.stats.spec_verify_steps
        same = client.chat.completions.create(
            **kwargs, prediction={"type": "content", "content": text})
        assert same.choices[0].message.content == text
        details = same.usage.completion_tokens_details
        drafted = details.accepted_prediction_tokens + details.rejected_prediction_tokens
        assert drafted > 0
        assert engine.core.stats.spec_verify_steps > before
        wrong = client.chat.completions.create(
            **kwargs, prediction={"type": "content", "content": "Zebras " * 10})
        assert wrong.choices[0].message.content == text
    health = httpx.get(f"{client.base_url}".replace("/v1/", "/health")).json()
    spec = health["engines"][names[0]]["speculation"]
    assert spec["verify_steps"] > 0 and 0 < spec["acceptance_rate"] <= 1
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=names[0], messages=HELLO, max_tokens=2,
                                       prediction={"type": "content", "content": 7})
    assert e.value.body["param"] == "prediction.content"


def test_echo_with_logprobs_through_the_official_client(client, engine, names):
    """The completions API's echo (lm-evaluation-harness's loglikelihood request): the prompt
    back with each token's logprob, none for the first, no new token with max_tokens=0."""
    prompt = "Hello there, general Kenobi"
    ids = engine.core.prompt_ids(prompt)
    r = client.completions.create(model=names[0], prompt=prompt, echo=True, logprobs=2,
                                  max_tokens=0, temperature=0)
    c = r.choices[0]
    assert c.text == prompt and r.usage.completion_tokens == 0
    assert len(c.logprobs.tokens) == len(ids)
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in c.logprobs.token_logprobs[1:])
    assert all(len(top) <= 2 for top in c.logprobs.top_logprobs[1:])
    more = client.completions.create(model=names[0], prompt=prompt, echo=True, logprobs=2,
                                     max_tokens=3, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert more.choices[0].logprobs.token_logprobs[:len(ids)] == pytest.approx(
        c.logprobs.token_logprobs[:len(ids)][:1] + c.logprobs.token_logprobs[1:len(ids)],
        abs=1e-5)
    assert len(more.choices[0].logprobs.tokens) == len(ids) + 3
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=names[0], prompt=prompt, max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
