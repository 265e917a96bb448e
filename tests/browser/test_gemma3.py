"""A non-Llama real model in the browser: Gemma-3-270m (Gemma 3: q/k norms, GELU, 262k vocab,
sliding-window layers through wick's own attention kernel) in q4f32_m, its default (4 and 8-bit
weights as the checkpoint mixes them; Gemma refuses f16 anyway), gives the native engine's greedy tokens, on the WebAssembly
kernels (a 262k-vocabulary step took seconds on SwiftShader's WebGPU; the WGSL kernels of
Gemma 3's shapes are checked on lavapipe by tests/e2e/test_families.py)."""

from __future__ import annotations

import pytest

from .conftest import Page

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
N = 2


@pytest.fixture(scope="module")
def gemma_artifact(compiled):
    # (the native tests' artifact: they run its CPU set; here the browser its wasm set, the
    # native reference (device "auto") its CPU set)
    return compiled("gemma-3-270m", "q4f32_m", context_window=1024,
                    kernel_sets=("webgpu", "cpu", "wasm"))


@pytest.fixture(scope="module")
def gemma_server(web_bundle, gemma_artifact):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    host = ArtifactHost()
    host.add(gemma_artifact)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    yield live
    live.stop()


def test_gemma3_greedy_completion_equals_native(context, gemma_server, gemma_artifact):
    from wick.server.local import Engine

    eng = Engine(str(gemma_artifact))
    native = eng.completions.create(prompt=PROMPT, max_tokens=N, temperature=0,
                                    logprobs=0).to_dict()
    del eng
    page = Page(context, gemma_server.url)
    out = page.run("""async ([prompt, n]) => {
        const t0 = performance.now();
        const engine = await wick.createEngine("gemma-3-270m", {quantization: "q4f32_m", backend: "wasm"});
        const loadMs = performance.now() - t0;
        const comp = await engine.completions.create(
            {prompt, max_tokens: n, temperature: 0, logprobs: 0});
        const ms = performance.now() - t0 - loadMs;
        let chatError = null;
        try {
            await engine.chat.completions.create({messages: [{role: "user", content: "hi"}]});
        } catch (e) { chatError = {name: e.name, code: e.code, status: e.status}; }
        await engine.unload();
        return {comp, loadMs, ms, info: engine.info, chatError};
    }""", [PROMPT, N], timeout=900_000)
    print(f"Gemma-3-270m q4f32_m in Chromium: load {out['loadMs'] / 1e3:.1f} s, "
          f"{N} tokens in {out['ms'] / 1e3:.1f} s")
    assert out["info"]["quantization"] == "q4f32_m"
    got, want = out["comp"]["choices"][0], native["choices"][0]
    assert got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
    assert got["text"] == want["text"] and len(want["logprobs"]["tokens"]) == N
    assert out["comp"]["usage"] == native["usage"]
    assert out["chatError"]["code"] == "no_chat_template" and out["chatError"]["status"] == 400
