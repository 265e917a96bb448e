"""The main job as a new user meets it, in a browser without shader-f16 (SwiftShader): `wick
serve` of a q4f16_1 model (``serving_app``, what the command runs) gives the chat page a model
it can run, its f32 twin, compiled by the server while the page waits; the answer equals the
native engine's on the same variant. A screenshot goes to build/browser/first-run.png.

And a server with an API key: the browser engine sends it with every model file request
(``createEngine(model, { apiKey })``); without it the load fails with an AuthenticationError.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .conftest import ROOT, Page, chat_page_reply, open_chat_page

pytestmark = pytest.mark.slow


def test_chat_page_of_an_f16_server_works_without_shader_f16(browser, web_bundle,
                                                             tiny_f16_artifact):
    from wick.server.serve import ServerThread, serving_app

    app = serving_app([str(tiny_f16_artifact)])
    live = ServerThread(app)
    ctx = browser.new_context(viewport={"width": 900, "height": 600})
    try:
        page, errors = open_chat_page(ctx, live.url)
        # no hardware GPU here (SwiftShader) and the server has a model: its engine is the default
        page.locator("#model option").first.wait_for(state="attached")
        assert page.eval_on_selector("#engine", "e => e.value") == "server"
        page.locator("#engine").select_option("browser")
        # never an empty list: the twin, preparing or ready
        expect(page.locator("#model option").first).to_contain_text("q4f32_1")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "8")
        page.fill("#input", "hi wick")
        page.click("#send")
        expect(page.locator("#status")).to_have_text(re.compile("tokens in"), timeout=240_000)
        got = page.eval_on_selector(".msg.assistant", "e => e.textContent")
        (twin,) = [m for m in app.state.artifacts.artifacts() if m["quantization"] == "q4f32_1"]
        twin_dir = app.state.artifacts.artifact_dir(twin["id"])
        want = chat_page_reply(twin_dir, [{"role": "user", "content": "hi wick"}])
        assert got == want
        assert page.locator(".msg.error").count() == 0
        out = ROOT / "build" / "browser"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "first-run.png"))
        assert errors == []
    finally:
        ctx.close()
        live.stop()


def test_browser_engine_sends_the_api_key(browser, web_bundle, tiny_artifact):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    host = ArtifactHost()
    host.add(tiny_artifact)
    live = ServerThread(create_app(ModelPool(state="ready"), api_key="sekret", artifacts=host))
    ctx = browser.new_context()
    try:
        page = Page(ctx, live.url)
        out = page.run("""async () => {
            const seen = [];
            try { await wick.createEngine("tiny-llama0", {quantization: "q0f32"}); }
            catch (e) { seen.push({cls: e.constructor.name, code: e.code, status: e.status}); }
            const engine = await wick.createEngine("tiny-llama0", {quantization: "q0f32",
                apiKey: "sekret", cache: false});
            const r = await engine.chat.completions.create({messages: [{role: "user",
                content: "hi"}], max_tokens: 3, temperature: 0});
            await engine.unload();
            return {seen, tokens: r.usage.completion_tokens};
        }""")
    finally:
        ctx.close()
        live.stop()
    assert out["seen"] == [{"cls": "AuthenticationError", "code": "invalid_api_key", "status": 401}]
    assert out["tokens"] == 3
