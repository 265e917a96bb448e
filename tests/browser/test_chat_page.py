"""The chat page (/) in its default "browser (WebGPU)" mode: loads the model with a progress bar,
answers a message with the same text as the native engine, no console errors; a screenshot of
the finished chat is written to build/browser/chat.png. Also: no WebGPU adapter -> typed error."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .conftest import CHROMIUM, CHROMIUM_ARGS, ROOT, Page, open_chat_page

pytestmark = pytest.mark.slow


def test_chat_page_browser_engine_screenshot(browser, web_server, tiny_artifact, tmp_path):
    from wick.server.local import Engine

    messages = [{"role": "user", "content": "hi wick"}]
    want = Engine(str(tiny_artifact)).chat.completions.create(
        messages=messages, max_tokens=8, temperature=0).choices[0].message.content
    ctx = browser.new_context(viewport={"width": 900, "height": 600})
    try:
        page, errors = open_chat_page(ctx, web_server.url)
        # (the page's CSP forbids eval: wait with locators, not wait_for_function)
        page.locator("#model option").first.wait_for(state="attached")
        assert page.eval_on_selector("#engine", "e => e.value") == "browser"
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "8")
        page.fill("#input", messages[0]["content"])
        page.click("#send")
        expect(page.locator("#status")).to_have_text(re.compile("tokens in"), timeout=240_000)
        got = page.eval_on_selector(".msg.assistant", "e => e.textContent")
        assert got == want
        # the next turn reads the first one from the prefix cache: the stats line says so
        page.fill("#input", "and again")
        page.click("#send")
        expect(page.locator("#status")).to_have_text(re.compile(r"\d+ prompt tokens cached"),
                                                     timeout=240_000)
        out = ROOT / "build" / "browser"
        out.mkdir(parents=True, exist_ok=True)
        shot = out / "chat.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 5000
        assert errors == []
    finally:
        ctx.close()


def test_no_webgpu_adapter_is_a_typed_error(playwright, web_server):
    """Chromium without --enable-unsafe-webgpu has navigator.gpu but no adapter here."""
    args = [a for a in CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"]
    b = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
    try:
        page = Page(b.new_context(), web_server.url)
        out = page.run("""async () => {
            try { await wick.createEngine("tiny-llama0", {quantization: "q0f32"}); return null; }
            catch (e) { return {cls: e.constructor.name, message: e.message, code: e.code,
                device: e instanceof wick.DeviceError}; }
        }""")
    finally:
        b.close()
    assert out is not None and out["device"], out
    assert out["cls"] == "WebGPUUnavailableError"
    assert out["code"] in ("no_adapter", "no_webgpu")
    assert "q4f32_1" in out["message"] and "q0f32" in out["message"]


def test_chat_page_switches_to_the_server_engine(browser, web_bundle, tiny_artifact):
    """Switched to "server", the page streams the same answer from /v1/chat/completions."""
    from wick.server.app import ModelPool, create_app
    from wick.server.local import AsyncEngine, Engine
    from wick.server.serve import ServerThread

    messages = [{"role": "user", "content": "hi server"}]
    want = Engine(str(tiny_artifact)).chat.completions.create(
        messages=messages, max_tokens=8, temperature=0).choices[0].message.content
    live = ServerThread(create_app(ModelPool.of(AsyncEngine(str(tiny_artifact)))))
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.set_default_timeout(120_000)
        page.goto(live.url + "/")
        page.locator("#engine").select_option("server")
        expect(page.locator("#model option")).to_have_text(["tiny-llama0"])
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "8")
        page.fill("#input", messages[0]["content"])
        page.click("#send")
        expect(page.locator("#status")).to_have_text(re.compile("tokens in"))
        assert page.eval_on_selector(".msg.assistant", "e => e.textContent") == want
        page.reload()  # the choice is remembered
        expect(page.locator("#model option")).to_have_text(["tiny-llama0"])
        assert page.eval_on_selector("#engine", "e => e.value") == "server"
        assert errors == []
    finally:
        ctx.close()
        live.stop()
