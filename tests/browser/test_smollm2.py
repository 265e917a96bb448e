"""SmolLM2-135M-Instruct (the bundled GGUF, q4f32_1: SwiftShader has no shader-f16) in the
browser equals the native engine on the same artifact: greedy chat, token for token."""

from __future__ import annotations

import pytest

from .conftest import Page

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
N = 8


@pytest.fixture(scope="module")
def smol_artifact(compiled):
    return compiled("smollm2-135m-instruct", "q4f32_1")


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


def test_smollm2_greedy_chat_equals_native(context, smol_server, smol_artifact):
    from wick.server.local import Engine

    native = Engine(str(smol_artifact)).chat.completions.create(
        messages=MESSAGES, max_tokens=N, temperature=0).to_dict()
    page = Page(context, smol_server.url)
    out = page.run("""async ([messages, n]) => {
        const engine = await wick.createEngine("smollm2-135m-instruct", {quantization: "q4f32_1"});
        const r = await engine.chat.completions.create({messages, max_tokens: n, temperature: 0});
        await engine.unload();
        return r;
    }""", [MESSAGES, N], timeout=600_000)
    assert out["choices"][0]["message"]["content"] == native["choices"][0]["message"]["content"]
    assert out["usage"] == native["usage"]
    assert "Paris" in out["choices"][0]["message"]["content"]
    assert not page.console_errors
