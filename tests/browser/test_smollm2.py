"""SmolLM2-135M-Instruct (the bundled GGUF) in q0f32 in the browser, on the WebAssembly kernels,
loaded from a static export (`wick export`, served by a plain static file server under a
sub-path, no wick server anywhere), equals the native engine on the same artifact and kernel set
(the CPU's): a greedy JSON-schema chat (web-xgrammar over SmolLM2's vocabulary) streamed in the
browser joins to the native non-stream text, with its usage chunk equal to the native usage, and
validates.
(On SwiftShader's WebGPU each decode step of this model took seconds; the WGSL kernels run on
lavapipe in tests/e2e (the families' tiny models, the widest vocabulary in
test_real_shapes.py), and in the browser with the tiny models.)"""

from __future__ import annotations

import pytest

from .conftest import ISOLATION, Page, export_site, static_server

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
def smol_site(web_bundle, smol_artifact, tmp_path_factory):
    """SmolLM2's export under a sub-path of a static host that sends COOP/COEP (threads)."""
    root = tmp_path_factory.mktemp("static-host")
    export_site(root, "models/smol", smol_artifact)
    server, url = static_server(root, ISOLATION, "models/smol")
    yield url
    server.shutdown()
    server.server_close()


def test_smollm2_q0f32_from_an_export_greedy_equals_native(context, smol_site, smol_artifact):
    """One streamed, schema-constrained greedy chat from the export: streaming, usage, the
    grammar over SmolLM2's vocabulary and parity at once; every request stays in the export."""
    import json

    import jsonschema

    from wick.server.local import Engine

    eng = Engine(str(smol_artifact), device="cpu")
    native = eng.chat.completions.create(**JSON_REQUEST).to_dict()
    del eng
    page = Page(context, smol_site, headers=ISOLATION, module="wick.js")
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
    # (cross-origin isolated: every core, up to the pool's cap)
    assert out["info"]["backend"] == "wasm"
    assert out["info"]["threads"] == page.run("Math.min(navigator.hardwareConcurrency, 16)")
    outside = [u for u in page.requests if not u.startswith((smol_site, "blob:"))]
    assert outside == [], outside
    jsonschema.validate(json.loads(out["streamed"]), SCHEMA)
    assert page.console_errors == [], page.console_errors
