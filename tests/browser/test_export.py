"""`wick export`: a static site served by a plain static file server (Python's http.server)
under a sub-path, in Chromium without WebGPU (the WebAssembly kernels): `createEngine` from the
export's wick.js, with no options, gives the native engine's greedy tokens and asks nothing
outside the export; the exported chat page answers with the native engine's text and says
how many threads it runs on (one without COOP/COEP headers, every core with them)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse

import pytest
from playwright.sync_api import expect

from .conftest import (CHROMIUM, CHROMIUM_ARGS_NO_WEBGPU, ISOLATION, ROOT, chat_page_reply,
                       export_site, static_server)

pytestmark = pytest.mark.slow

SUB = "sub/path/site"  # where the export lives on the static server
MESSAGES = [{"role": "user", "content": "hi export"}]
N = 16


@pytest.fixture(scope="module")
def browser(playwright):
    """Chromium as shipped: WebGPU is off on Linux without --enable-unsafe-webgpu."""
    b = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                  args=CHROMIUM_ARGS_NO_WEBGPU)
    yield b
    b.close()


@pytest.fixture(scope="module")
def exported(web_bundle, tiny_q4_artifact, tmp_path_factory):
    """`wick export DIR ARTIFACT` (a compiled artifact: exported as it is), and what it said."""
    root = tmp_path_factory.mktemp("static-host")
    site, said = export_site(root, SUB, tiny_q4_artifact)
    return root, site, said


@pytest.fixture(scope="module")
def plain_host(exported):
    server, url = static_server(exported[0], {}, SUB)
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def isolated_host(exported):
    server, url = static_server(exported[0], ISOLATION, SUB)
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def native(tiny_q4_artifact):
    from wick.server.local import Engine

    engine = Engine(str(tiny_q4_artifact), device="cpu")
    return {"model": engine.core.info.model_id,
            "chat": engine.chat.completions.create(messages=MESSAGES, max_tokens=N,
                                                   temperature=0).choices[0].message.content}


def test_the_export_is_a_static_site_with_relative_references(exported, tiny_q4_artifact):
    _, site, said = exported
    assert "Cross-Origin-Opener-Policy: same-origin" in said
    assert "Cross-Origin-Embedder-Policy: require-corp" in said
    assert f"{site}: static site" in said
    index = json.loads((site / "web" / "models.json").read_text())
    (entry,) = index["data"]
    assert entry["id"] == tiny_q4_artifact.name and entry["quantization"] == "q4f32_1"
    art = site / "artifacts" / entry["id"]
    manifest = json.loads((art / "wick-artifact.json").read_text())
    from wick.engine.artifact import WASM_KINDS

    # what a browser reads, byte for byte, and nothing only native engines read
    sets = manifest["kernel_sets"]
    for f in [manifest["tokenizer"]["file"], *(sets[k]["file"] for k in WASM_KINDS)]:
        assert (art / f).read_bytes() == (tiny_q4_artifact / f).read_bytes()
    assert all((art / s["file"]).is_file() for s in manifest["shards"])
    assert all((art / k["file"]).is_file() for k in sets["webgpu"]["kernels"])
    assert not (art / sets["cpu"]["file"]).exists()
    assert "/" not in manifest["source"]["model"]  # (a local path is cut, as the host does)
    html = (site / "index.html").read_text()
    assert not re.search(r'(src|href)="/', html), html  # relative references only
    assert (site / "wick.js").read_text() == 'export * from "./static/wick.js";\n'


def test_createEngine_from_the_export_gives_native_tokens(browser, plain_host, native):
    """A page importing the export's wick.js needs no options: models, runtime and artifact
    come from the export (every request stays under its path); without COOP/COEP the
    WebAssembly kernels run on one thread."""
    ctx = browser.new_context()
    requests: list[str] = []
    ctx.on("request", lambda r: requests.append(r.url))
    try:
        page = ctx.new_page()
        page.set_default_timeout(240_000)
        page.goto(plain_host)
        out = page.evaluate("""async ([model, messages, n]) => {
            const wick = await import(new URL("wick.js", location.href).href);
            const engine = await wick.createEngine(model);
            const chat = await engine.chat.completions.create({messages, max_tokens: n,
                                                               temperature: 0});
            const info = engine.info;
            await engine.unload();
            return {info, text: chat.choices[0].message.content,
                    isolated: globalThis.crossOriginIsolated};
        }""", [native["model"], MESSAGES, N])
    finally:
        ctx.close()
    assert out["text"] == native["chat"]
    assert out["info"]["backend"] == "wasm" and out["info"]["threads"] == 1
    assert not out["isolated"]
    outside = [u for u in requests if not u.startswith(plain_host) and not u.startswith("blob:")]
    assert outside == [], outside
    assert any("/artifacts/" in u and "/params/" in u for u in requests)


def test_the_exported_chat_page_answers_on_every_core(browser, isolated_host, tiny_q4_artifact):
    """Served with COOP/COEP: the page is cross-origin isolated, the kernels run on every core
    and the status line says so; the reply is the native engine's (screenshot written to
    build/browser/export-chat.png)."""
    want = chat_page_reply(tiny_q4_artifact, MESSAGES)
    ctx = browser.new_context(viewport={"width": 900, "height": 600})
    errors: list[str] = []
    try:
        page = ctx.new_page()
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        ctx.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
        page.set_default_timeout(240_000)
        page.goto(isolated_host)
        page.locator("#model option").first.wait_for(state="attached")
        assert page.locator("#engine").is_hidden()  # the browser engine only: no server
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "8")
        page.fill("#input", MESSAGES[0]["content"])
        page.click("#send")
        expect(page.locator("#status")).to_have_text(re.compile("tokens in"), timeout=240_000)
        assert page.eval_on_selector(".msg.assistant", "e => e.textContent") == want
        threads = page.evaluate("Math.min(navigator.hardwareConcurrency, 16)")  # (the pool's cap)
        status = page.locator("#status").text_content()
        assert re.search(r"tok/s on wasm, %d threads?," % threads, status), status
        out = ROOT / "build" / "browser"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "export-chat.png"))
        assert (out / "export-chat.png").stat().st_size > 5000
        assert page.evaluate("globalThis.crossOriginIsolated") is True
        assert errors == [], errors
    finally:
        ctx.close()


def test_an_app_bundling_the_npm_package_loads_from_an_export_on_another_origin(
        browser, exported, native, tmp_path):
    """`npm pack` gives a tarball holding the bundle and its types, versioned with the Python
    package; web/examples/app (20 lines), installed from it and bundled with esbuild, served
    from one origin, loads the model, the runtime and the worker from the export on another
    (which sends CORS headers) and streams the native engine's tokens."""
    import tarfile

    import wick

    web = ROOT / "web"
    assert json.loads((web / "package.json").read_text())["version"] == wick.__version__
    packed = subprocess.run(["npm", "pack", "--json", "--pack-destination", str(tmp_path)],
                            cwd=web, capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr
    tarball = tmp_path / json.loads(packed.stdout)[0]["filename"]
    with tarfile.open(tarball) as t:
        names = set(t.getnames())
    assert {"package/dist/wick.js", "package/dist/wick-worker.js", "package/dist/wick.d.ts",
            "package/dist/types/client.d.ts", "package/package.json"} <= names
    assert not any(n.startswith("package/src/") for n in names)

    app = tmp_path / "app"
    app.mkdir()
    for name in ("main.js", "index.html"):
        (app / name).write_text((web / "examples" / "app" / name).read_text())
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    npm = ["npm", "install", "--offline", "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run([*npm, str(tarball)], cwd=app, check=True, timeout=300)
    subprocess.run([str(web / "node_modules" / ".bin" / "esbuild"), "main.js", "--bundle",
                    "--format=esm", "--outfile=dist/app.js", "--log-level=warning"],
                   cwd=app, check=True, timeout=120)
    export_server, site = static_server(exported[0], {"Access-Control-Allow-Origin": "*"}, SUB)
    app_server, app_url = static_server(app, {}, sub="")
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        page.set_default_timeout(240_000)
        query = urllib.parse.urlencode({"site": site, "model": native["model"],
                                        "q": MESSAGES[0]["content"], "n": N})
        page.goto(f"{app_url}index.html?{query}")
        page.wait_for_function("() => globalThis.wickAppDone !== undefined")
        done = page.evaluate("globalThis.wickAppDone")
    finally:
        ctx.close()
        for server in (export_server, app_server):
            server.shutdown()
            server.server_close()
    assert done["text"] == native["chat"]
    assert done["info"]["backend"] == "wasm"
