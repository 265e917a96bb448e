"""The chat page (/) in its default "browser" mode: loads the model with a progress bar,
answers a message with the same text as the native engine, no console errors; a screenshot of
the finished chat is written to build/browser/chat.png. Also in a browser with no WebGPU at
all (the WebAssembly kernels), and switched to the server engine."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .conftest import (
    CHROMIUM,
    CHROMIUM_ARGS_NO_WEBGPU,
    ROOT,
    Page,
    chat_page_reply,
    open_chat_page,
)

pytestmark = pytest.mark.slow


def send(page, text: str) -> None:
    """Send ``text`` from the chat page, greedy, 8 tokens."""
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "8")
    page.fill("#input", text)
    page.click("#send")


def ask(page, text: str) -> None:
    """``send`` and wait for the answer's stats."""
    send(page, text)
    expect(page.locator("#status")).to_have_text(re.compile("tokens in"), timeout=240_000)


def test_chat_page_browser_engine_screenshot(browser, web_server, tiny_artifact, tmp_path):
    messages = [{"role": "user", "content": "hi wick"}]
    want = chat_page_reply(tiny_artifact, messages)
    ctx = browser.new_context(viewport={"width": 900, "height": 600})
    try:
        page, errors = open_chat_page(ctx, web_server.url)
        # (the page's CSP forbids eval: wait with locators, not wait_for_function)
        page.locator("#model option").first.wait_for(state="attached")
        assert page.eval_on_selector("#engine", "e => e.value") == "browser"
        ask(page, messages[0]["content"])
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


def test_chat_page_works_without_webgpu(playwright, web_server, tiny_artifact):
    """Chromium without --enable-unsafe-webgpu has no adapter here: the page's browser engine
    runs the WebAssembly kernels and answers with the native engine's text."""
    messages = [{"role": "user", "content": "hi wasm"}]
    want = chat_page_reply(tiny_artifact, messages)
    b = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                  args=CHROMIUM_ARGS_NO_WEBGPU)
    try:
        page, errors = open_chat_page(b.new_context(viewport={"width": 900, "height": 600}),
                                      web_server.url)
        page.locator("#model option").first.wait_for(state="attached")
        # (this server has no model of its own loaded: the browser engine is the default)
        assert page.eval_on_selector("#engine", "e => e.value") == "browser"
        ask(page, messages[0]["content"])
        assert page.eval_on_selector(".msg.assistant", "e => e.textContent") == want
        out = ROOT / "build" / "browser"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "chat-wasm.png"))
        assert errors == []
    finally:
        b.close()


def test_chat_page_switches_to_the_server_engine(browser, web_bundle, tiny_artifact):
    """Switched to "server", the page streams the same answer from /v1/chat/completions, also
    for a message sent before the page knows the server's models."""
    from wick.server.app import ModelPool, create_app
    from wick.server.local import AsyncEngine
    from wick.server.serve import ServerThread

    messages = [{"role": "user", "content": "hi server"}]
    want = chat_page_reply(tiny_artifact, messages)
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
        ask(page, messages[0]["content"])
        assert page.eval_on_selector(".msg.assistant", "e => e.textContent") == want
        # a message sent before the page has the server's model list waits for it (it used
        # to fail at once: "No model is loaded on the server yet"): hold that list back
        held, released = [], []
        page.route("**/v1/models",
                   lambda route: route.continue_() if released else held.append(route))
        page.reload()  # (a new conversation: the same question gets the same answer)
        send(page, messages[0]["content"])
        for _ in range(1200):  # (a minute at most: a page that never asks fails, not hangs)
            if held:
                break
            page.wait_for_timeout(50)
        assert held, "the page never asked for /v1/models"
        assert page.locator(".msg.error").count() == 0
        released.append(True)
        for route in held:
            route.continue_()
        expect(page.locator("#status")).to_have_text(re.compile("tokens in"), timeout=240_000)
        assert page.eval_on_selector(".msg.assistant", "e => e.textContent") == want
        # the engine choice is remembered
        expect(page.locator("#model option")).to_have_text(["tiny-llama0"])
        assert page.eval_on_selector("#engine", "e => e.value") == "server"
        assert errors == []
    finally:
        ctx.close()
        live.stop()
