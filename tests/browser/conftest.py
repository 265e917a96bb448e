"""Browser tests: the wick engine in Pyodide in a Web Worker on WebGPU or the WebAssembly
kernels, driven by Playwright in headless Debian Chromium. SwiftShader WebGPU (f32 variants
only, slow -- keep tests small) is a software adapter, so ``backend: "auto"`` (the default)
runs the WebAssembly kernels there; tests of the WebGPU path ask for ``backend: "webgpu"``.

Skipped when Chromium or the playwright package is absent; the web bundle is built with
``bash web/build.sh`` when it is missing and npm exists.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import RUN, TINY_SMALL, file_lock, run_temp, tool_missing

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("WICK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--enable-unsafe-webgpu",
]
# Chromium as shipped: WebGPU is off on Linux without --enable-unsafe-webgpu (the WebAssembly
# kernels run)
CHROMIUM_ARGS_NO_WEBGPU = [a for a in CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"]
WINDOW = TINY_SMALL["context_window"]  # the tiny artifacts'
# what `wick serve` sends with its pages: cross-origin isolated, so they may share memory
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin",
             "Cross-Origin-Embedder-Policy": "require-corp"}
TEST_PAGE = "/__wick_test__.html"
PAGE_HTML = "<!doctype html><html><head><meta charset=utf-8><title>wick test</title></head><body></body></html>"


def _built() -> bool:
    web = ROOT / "pyserver" / "static"
    return (web / "web" / "wick.js").is_file() and (web / "wasm" / "manifest.json").is_file()


@pytest.fixture(scope="session")
def web_bundle(tmp_path_factory) -> Path:
    """The built bundle, never stale: the wheels are rebuilt from engine/ and wasm/wick_web/
    every run (a second), the JS (and the extension's pages) when web/src is newer. Built by
    the first worker that asks; the other waits for it (it serves the same files)."""
    root = run_temp(tmp_path_factory)
    with file_lock(root / ".web-bundle.lock"):
        if not (root / f".web-bundle.{RUN}.made").exists():
            _build_web_bundle()
            (root / f".web-bundle.{RUN}.made").touch()
    return ROOT / "pyserver" / "static"


def _build_web_bundle() -> None:
    web, static = ROOT / "web", ROOT / "pyserver" / "static"
    if (web / "node_modules" / "pyodide").is_dir():
        bundle = static / "web" / "wick.js"
        newest = max(p.stat().st_mtime for pattern in ("*.ts", "*.html")
                     for p in (web / "src").rglob(pattern))
        if not bundle.is_file() or bundle.stat().st_mtime < newest or \
                not (static / "ext" / "options.html").is_file():  # (pages beside the scripts)
            subprocess.run(["node", str(web / "build.mjs")], check=True)
        subprocess.run([sys.executable, str(ROOT / "wasm" / "build.py")], check=True)
    elif not _built():
        if shutil.which("npm") is None:
            tool_missing("the web bundle is not built and npm is missing (bash web/build.sh)")
        subprocess.run(["bash", str(web / "build.sh"), sys.executable], check=True)


# Module scope, not session: playwright's sync API keeps an asyncio loop running on the main
# thread while it is started, which would break every later test that calls asyncio.run().
@pytest.fixture(scope="module")
def playwright():
    if not Path(CHROMIUM).exists():
        tool_missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        tool_missing("the playwright package is missing (pip install playwright)")
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright):
    b = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield b
    b.close()


# tiny_artifact (q0f32), tiny_f16_artifact (q4f16_1) and tiny_long_artifact: tests/conftest.py,
# shared with tests/native and tests/server


@pytest.fixture(scope="session")
def tiny_q4_artifact(tiny_llama_dir, compiled) -> Path:
    """The same model as q4f32_1: the 4-bit dequantizing kernels without shader-f16."""
    return compiled(tiny_llama_dir, "q4f32_1", **TINY_SMALL)


@pytest.fixture(scope="session")
def web_server(web_bundle, tiny_artifact, tiny_f16_artifact, tiny_q4_artifact,
               tiny_long_artifact):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    host = ArtifactHost()
    host.add(tiny_artifact)
    host.add(tiny_f16_artifact)
    host.add(tiny_q4_artifact)
    host.add(tiny_long_artifact)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    yield live
    live.stop()


class Page:
    """A page on the server's origin with wick.js imported as ``window.wick``; records console
    errors and every request the page and its workers make. ``headers``: of the page's own
    response (e.g. ``ISOLATION``); ``module``: wick.js's URL, relative to ``url`` (an
    export's own ``wick.js``) or absolute (a wick host's)."""

    def __init__(self, context, url: str, headers: dict | None = None,
                 module: str = "/static/wick.js") -> None:
        self.context = context
        self.url = url
        self.page = context.new_page()
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))
        self.page.on("pageerror", lambda e: self.console_errors.append(str(e)))
        context.on("request", lambda r: self.requests.append(r.url))
        self.page.route(url.rstrip("/") + TEST_PAGE, lambda route: route.fulfill(
            body=PAGE_HTML, content_type="text/html", headers=headers or {}))
        self.page.goto(url.rstrip("/") + TEST_PAGE)
        self.page.evaluate(
            "async (m) => { window.wick = await import(new URL(m, location.href).href); }", module)

    def run(self, script: str, arg=None, timeout: float = 240_000):
        self.page.set_default_timeout(timeout)
        return self.page.evaluate(script, arg)


def export_site(root: Path, sub: str, *models: str | Path) -> tuple[Path, str]:
    """`wick export ROOT/SUB MODEL...` run as a user runs it: the site's directory and what the
    command printed."""
    from tests.conftest import wick_process_env

    site = root / sub
    command = [sys.executable, "-c", "import sys; from wick.server.cli import main; "
               "sys.exit(main())", "export", str(site), *map(str, models)]
    done = subprocess.run(command, env=wick_process_env(), capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    return site, done.stdout


def static_server(root: Path, headers: dict[str, str], sub: str = ""):
    """A plain static file server (Python's http.server) over ``root``, sending ``headers``
    with every response, and the URL of ``sub`` on it."""
    class Handler(SimpleHTTPRequestHandler):
        def end_headers(self) -> None:
            for k, v in headers.items():
                self.send_header(k, v)
            super().end_headers()

        def log_message(self, *args) -> None:  # (quiet)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = f"/{sub}/" if sub else "/"
    return server, f"http://127.0.0.1:{server.server_address[1]}{path}"


def chat_page_reply(artifact, messages: list, max_tokens: int = 8) -> str:
    """The native engine's reply to what the chat page sends at temperature 0: its
    ``chat_sampling`` for the fields the page leaves unset (Ollama's interactive defaults for a
    model that has none of its own: engine/sampling_defaults.py)."""
    from wick.engine.sampling_defaults import chat_values
    from wick.server.local import Engine

    engine = Engine(str(artifact))
    sampling = {**chat_values(engine.core.info.sampling_defaults), "temperature": 0,
                "max_tokens": max_tokens}
    return engine.chat.completions.create(messages=messages, **sampling
                                          ).choices[0].message.content


def open_chat_page(ctx, url: str):
    """The chat page of the server at ``url`` in a new page of ``ctx``, and the list that
    collects its console errors, page errors and failed (>= 400) responses."""
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    ctx.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
    page.set_default_timeout(240_000)
    page.goto(url + "/")
    return page, errors


@pytest.fixture(scope="module")
def context(browser):
    ctx = browser.new_context()
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def page(context, web_server) -> Page:
    return Page(context, web_server.url)
