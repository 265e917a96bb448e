"""SmolLM2-135M-Instruct (the bundled GGUF) in q0f32 -- SwiftShader has no shader-f16 -- in the
browser equals the native engine on the same artifact: a greedy chat streamed in the browser
joins to the native non-stream text, with its usage chunk equal to the native usage, and a
JSON-schema answer (web-xgrammar over SmolLM2's vocabulary) is the native one and validates.
(Completions in the browser: Gemma's test, test_gemma3.py; each decode step here costs seconds
on SwiftShader.)"""

from __future__ import annotations

import pytest

from .conftest import Page

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
N = 8
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}},
    "required": ["city", "country"]}
JSON_REQUEST = {"messages": [{"role": "user", "content": "Which city is the capital of France? JSON."}],
                "temperature": 0, "max_tokens": 40, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA}}}


@pytest.fixture(scope="module")
def smol_artifact(compiled):
    return compiled("smollm2-135m-instruct", "q0f32")


@pytest.fixture(scope="module")
def smol_server(web_bundle, smol_artifact):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    host = ArtifactHost()
    host.add(smol_artifact)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    yield live
    live.stop()


def test_smollm2_q0f32_greedy_equals_native(context, smol_server, smol_artifact):
    from wick.server.local import Engine

    eng = Engine(str(smol_artifact))
    chat = eng.chat.completions.create(messages=MESSAGES, max_tokens=N, temperature=0).to_dict()
    constrained = eng.chat.completions.create(**JSON_REQUEST).to_dict()
    del eng
    page = Page(context, smol_server.url)
    out = page.run("""async ([messages, n, jsonRequest]) => {
        const t0 = performance.now();
        const engine = await wick.createEngine("smollm2-135m-instruct", {quantization: "q0f32"});
        const loadMs = performance.now() - t0;
        const parts = [];
        let usage = null;
        for await (const c of await engine.chat.completions.create({messages, max_tokens: n,
                temperature: 0, stream: true, stream_options: {include_usage: true}})) {
            parts.push(c.choices.length ? (c.choices[0].delta.content ?? "") : "");
            usage = c.usage ?? usage;
        }
        const constrained = await engine.chat.completions.create(jsonRequest);
        await engine.unload();
        return {usage, streamed: parts.join(""), loadMs, info: engine.info, constrained};
    }""", [MESSAGES, N, JSON_REQUEST], timeout=900_000)
    print(f"SmolLM2 q0f32 in Chromium: load {out['loadMs'] / 1e3:.1f} s")
    assert out["info"]["quantization"] == "q0f32"
    text = chat["choices"][0]["message"]["content"]
    assert "Paris" in text
    assert out["streamed"] == text
    assert out["usage"] == chat["usage"]
    answer = out["constrained"]["choices"][0]
    assert answer["message"] == constrained["choices"][0]["message"]
    assert answer["finish_reason"] == "stop"
    import json

    import jsonschema

    jsonschema.validate(json.loads(answer["message"]["content"]), SCHEMA)
    assert not page.console_errors
