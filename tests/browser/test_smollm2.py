"""SmolLM2-135M-Instruct (the bundled GGUF) in q0f32 in the browser, on the WebAssembly kernels,
equals the native engine on the same artifact and kernel set (the CPU's): a greedy JSON-schema
chat (web-xgrammar over SmolLM2's vocabulary) streamed in the browser joins to the native
non-stream text, with its usage chunk equal to the native usage, and validates.
(On SwiftShader's WebGPU each decode step of this model took seconds; the WGSL kernels of its
shapes are checked on lavapipe by tests/e2e, and in the browser with the tiny models.)"""

from __future__ import annotations

import pytest

from .conftest import Page

pytestmark = pytest.mark.slow

SCHEMA = {"type": "string", "enum": ["Berlin", "Madrid", "Paris", "Rome"]}  # (few tokens)
# A system message of our own: 26 prompt tokens, where SmolLM2's default system prompt made 40.
# A prefill on SwiftShader costs per 32 rows: 40 tokens took twice as long (105 s vs 54 s, on a
# busy 2-core machine), each decode step ~20 s
JSON_REQUEST = {"messages": [{"role": "system", "content": "Answer in JSON."},
                             {"role": "user", "content": "Which city is the capital of France?"}],
                "temperature": 0, "max_tokens": 24, "response_format": {
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
    """One streamed, schema-constrained greedy chat: streaming, usage, the grammar over
    SmolLM2's vocabulary and parity at once."""
    import json

    import jsonschema

    from wick.server.local import Engine

    eng = Engine(str(smol_artifact), device="cpu")
    native = eng.chat.completions.create(**JSON_REQUEST).to_dict()
    del eng
    page = Page(context, smol_server.url)
    out = page.run("""async ([request]) => {
        const t0 = performance.now();
        const engine = await wick.createEngine("smollm2-135m-instruct", {quantization: "q0f32", backend: "wasm"});
        const loadMs = performance.now() - t0;
        const parts = [];
        let usage = null, finish = null;
        for await (const c of await engine.chat.completions.create({...request, stream: true,
                stream_options: {include_usage: true}})) {
            if (c.choices.length) {
                parts.push(c.choices[0].delta.content ?? "");
                finish = c.choices[0].finish_reason ?? finish;
            }
            usage = c.usage ?? usage;
        }
        await engine.unload();
        return {usage, streamed: parts.join(""), finish, loadMs, info: engine.info};
    }""", [JSON_REQUEST], timeout=900_000)
    print(f"SmolLM2 q0f32 in Chromium: load {out['loadMs'] / 1e3:.1f} s")
    assert out["info"]["quantization"] == "q0f32"
    text = native["choices"][0]["message"]["content"]
    assert json.loads(text) == "Paris"
    assert out["streamed"] == text
    assert out["finish"] == native["choices"][0]["finish_reason"] == "stop"
    assert out["usage"] == native["usage"]
    jsonschema.validate(json.loads(out["streamed"]), SCHEMA)
    assert not page.console_errors
