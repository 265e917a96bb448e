"""The Chrome extension (`wick extension build`) and engines shared across pages, in Debian
Chromium with the unpacked extension loaded (one persistent browser for the module):

- it loads with no manifest warnings; its side panel (opened as a tab) chats with SmolLM2 q0f32
  and gives the native engine's greedy text;
- extension pages attach to its one engine (no weight requests), their concurrent requests
  share steps, closing one leaves the engine loaded for the other;
- closing the offscreen document fails a running request with EngineLostError, and the next
  request loads the model again from the Cache API;
- an allowed web origin gets the native tokens through createExtensionEngine, another one a
  PermissionDeniedError;
- `createEngine(model, {shared: true})`: a second tab of an origin attaches to the first tab's
  engine (SharedWorker) without loading weights.

Model files come through tests/browser/proxy.py, whose log counts the weight requests."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import CHROMIUM, CHROMIUM_ARGS, Page
from .proxy import CuttingProxy

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SMOL_TOKENS = 2
PROMPT = "The quick brown fox"
N = 6
LONG = 100  # tokens of the concurrent requests: long enough to overlap (40 did not always,
#            on a fast CPU); the tiny model holds 128


@pytest.fixture(scope="module")
def smol_artifact(compiled):
    return compiled("smollm2-135m-instruct", "q0f32")


@pytest.fixture(scope="module")
def host(web_bundle, tiny_artifact, smol_artifact):
    """A wick host with the tiny model and SmolLM2 q0f32, and a logging proxy in front of it."""
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    artifacts = ArtifactHost()
    artifacts.add(tiny_artifact)
    artifacts.add(smol_artifact)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=artifacts))
    proxy = CuttingProxy(live.url)
    yield live, proxy
    proxy.stop()
    live.stop()


@pytest.fixture(scope="module")
def native(tiny_artifact, smol_artifact):
    from wick.server.local import Engine

    tiny = Engine(str(tiny_artifact))
    out = {"model": tiny.core.info.model_id,
           "completion": tiny.completions.create(prompt=PROMPT, max_tokens=N, temperature=0).to_dict(),
           "completion2": tiny.completions.create(prompt="hello", max_tokens=N, temperature=0).to_dict(),
           "long": tiny.completions.create(prompt=PROMPT, max_tokens=LONG, temperature=0,
                                           ignore_eos=True).to_dict()}
    del tiny
    smol = Engine(str(smol_artifact))
    out["smol_chat"] = smol.chat.completions.create(messages=MESSAGES, max_tokens=SMOL_TOKENS,
                                                    temperature=0).to_dict()
    return out


@pytest.fixture(scope="module")
def extension(tmp_path_factory, host):
    from wick.server.extension_build import build_extension

    live, proxy = host
    out = tmp_path_factory.mktemp("ext") / "wick-extension"
    # the wick host's own origin may use the engine; `localhost` may ask (connectable) but is
    # not allowed
    allowed = live.url
    build_extension(out, proxy.url, [allowed, live.url.replace("127.0.0.1", "localhost")])
    config = json.loads((out / "wick-extension.json").read_text())
    config["allowedOrigins"] = [allowed]
    (out / "wick-extension.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def ctx(playwright, extension, tmp_path_factory):
    profile = tmp_path_factory.mktemp("profile")
    c = playwright.chromium.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, headless=True,
        args=[*CHROMIUM_ARGS, "--headless=new", f"--disable-extensions-except={extension}",
              f"--load-extension={extension}"])
    yield c
    c.close()


@pytest.fixture(scope="module")
def ext_id(ctx):
    worker = (ctx.service_workers[0] if ctx.service_workers else
              ctx.wait_for_event("serviceworker", timeout=60_000))
    return worker.url.split("/")[2]


class ExtPage:
    """A page of the extension with its wick.js imported as window.wick."""

    def __init__(self, ctx, ext_id: str, path: str = "options.html") -> None:
        self.page = ctx.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.set_default_timeout(600_000)
        self.page.goto(f"chrome-extension://{ext_id}/{path}")
        self.page.evaluate("async () => { window.wick = await import(chrome.runtime.getURL('wick.js')); }")

    def run(self, script: str, arg=None):
        return self.page.evaluate(script, arg)


def shard_requests(proxy) -> int:
    return sum(1 for path, _, _, _ in proxy.log if "/params/" in path)


CREATE = """async ([model]) => {
    window.engine = await wick.createEngine(model, {quantization: "q0f32"});
    return window.engine.info;
}"""  # (in an extension page: the extension's engine)
COMPLETE = """async ([prompt, n]) => (await engine.completions.create(
    {prompt, max_tokens: n, temperature: 0})).choices[0].text"""


def test_the_build_loads_without_manifest_warnings(ctx, ext_id):
    page = ctx.new_page()
    page.goto("chrome://extensions")
    info = page.evaluate("""async (id) => (await chrome.developerPrivate.getExtensionsInfo())
        .filter((e) => e.id === id).map((e) => ({name: e.name, warnings: e.installWarnings,
            manifestErrors: e.manifestErrors, runtimeErrors: e.runtimeErrors}))""", ext_id)
    page.close()
    assert len(info) == 1 and info[0]["name"] == "wick"
    assert info[0]["warnings"] == [] and info[0]["manifestErrors"] == []


def test_side_panel_chats_with_smollm2_as_native(ctx, ext_id, native, tmp_path_factory):
    panel = ctx.new_page()
    errors: list[str] = []
    panel.on("pageerror", lambda e: errors.append(str(e)))
    panel.on("console", lambda m: m.type == "error" and errors.append(m.text))
    panel.set_default_timeout(600_000)
    panel.goto(f"chrome-extension://{ext_id}/sidepanel.html")
    option = json.dumps(["smollm2-135m-instruct", "q0f32"], separators=(",", ":"))
    deadline = time.monotonic() + 60
    while not panel.query_selector(f"#model option[value='{option}']"):
        assert time.monotonic() < deadline, (panel.inner_text("#status"), errors)
        time.sleep(0.2)
    panel.select_option("#model", option)
    panel.fill("#temperature", "0")
    panel.fill("#max-tokens", str(SMOL_TOKENS))
    panel.fill("#input", MESSAGES[0]["content"])
    panel.click("#send")
    deadline = time.monotonic() + 600
    while "tokens in" not in panel.inner_text("#status") and time.monotonic() < deadline:
        assert not panel.query_selector(".msg.error"), panel.inner_text(".msg.error")
        time.sleep(0.5)
    panel.screenshot(path=str(tmp_path_factory.mktemp("shots") / "sidepanel.png"))
    reply = panel.inner_text(".msg.assistant")
    assert reply == native["smol_chat"]["choices"][0]["message"]["content"]
    assert "tok/s" in panel.inner_text("#status")
    panel.close()  # the panel goes; the extension's engine keeps SmolLM2 for the next attach
    assert errors == []


def test_extension_pages_share_one_engine(ctx, ext_id, host, native):
    _, proxy = host
    a = ExtPage(ctx, ext_id)
    info_a = a.run(CREATE, [native["model"]])
    assert info_a["attached"] is False and info_a["shardRequests"] > 0
    before = shard_requests(proxy)
    b = ExtPage(ctx, ext_id)
    info_b = b.run(CREATE, [native["model"]])
    assert info_b["attached"] is True and shard_requests(proxy) == before
    assert info_b["artifactId"] == info_a["artifactId"]
    # concurrent requests of both pages share engine steps and give the solo tokens
    steps0 = a.run("async () => (await engine.stats()).steps")
    long = """([prompt, n]) => engine.completions.create({prompt, max_tokens: n, temperature: 0,
        ignore_eos: true}).then((c) => c.choices[0].text)"""
    # (both sent at once: page a waits for page b's word on a BroadcastChannel; a was sent
    # first before, and on a busy machine it could end before b's arrived)
    a.run(f"""(arg) => {{ window.pending = new Promise((go) => {{
        const channel = new BroadcastChannel("wick-test-go");
        channel.onmessage = () => {{ channel.close(); go(); }};
    }}).then(() => ({long})(arg)); }}""", [PROMPT, LONG])
    text_b = b.run(f"""(arg) => {{ new BroadcastChannel("wick-test-go").postMessage("go");
        return ({long})(arg); }}""", [PROMPT, LONG])
    text_a = a.run("() => window.pending")
    steps = a.run("async () => (await engine.stats()).steps") - steps0
    assert text_a == text_b == native["long"]["choices"][0]["text"]
    assert steps < 2 * LONG  # alone, each would take a prompt step and LONG - 1 decode steps
    # the first page goes; the second still has the engine, with nothing downloaded again
    a.page.close()
    assert b.run(COMPLETE, ["hello", N]) == native["completion2"]["choices"][0]["text"]
    assert shard_requests(proxy) == before
    b.page.close()
    assert a.errors == b.errors == []


def test_a_lost_host_fails_the_request_typed_and_the_next_one_reloads(ctx, ext_id, host, native):
    _, proxy = host
    page = ExtPage(ctx, ext_id)
    page.run(CREATE, [native["model"]])
    before = shard_requests(proxy)
    out = page.run("""async ([prompt, sw]) => {
        const running = engine.completions.create({prompt, max_tokens: 100, temperature: 0,
            ignore_eos: true, stream: true});
        let error = null, closed = false;
        try {
            for await (const c of await running) {
                if (!closed) { closed = true; await chrome.offscreen.closeDocument(); }
            }
        } catch (e) { error = {name: e.name, code: e.code}; }
        return error;
    }""", [PROMPT, None])
    assert out == {"name": "EngineLostError", "code": "engine_lost"}
    assert page.run(COMPLETE, [PROMPT, N]) == native["completion"]["choices"][0]["text"]
    info = page.run("() => engine.info")
    assert info["attached"] is False and info["shardsFromCache"] > 0
    assert shard_requests(proxy) == before  # reloaded from the Cache API
    page.page.close()


def test_allowed_site_uses_the_extension_engine_and_others_are_denied(ctx, ext_id, host, native):
    live, _ = host
    site = Page(ctx, live.url)  # the allowed origin, /static/wick.js from the wick host
    out = site.run("""async ([id, model, prompt, n]) => {
        const engine = await wick.createExtensionEngine(id, model);
        const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        await engine.unload();
        return comp.choices[0].text;
    }""", [ext_id, native["model"], PROMPT, N])
    assert out == native["completion"]["choices"][0]["text"]
    other = Page(ctx, live.url.replace("127.0.0.1", "localhost"))  # may ask, is not allowed
    denied = other.run("""async ([id, model]) => {
        try { await wick.createExtensionEngine(id, model); return null; }
        catch (e) { return {name: e.name, code: e.code, status: e.status, message: e.message}; }
    }""", [ext_id, native["model"]])
    assert denied["name"] == "PermissionDeniedError" and denied["status"] == 403
    assert native["model"] not in denied["message"]
    for p in (site, other):
        p.page.close()


def test_options_page_lists_cached_models_and_revokes_sites(ctx, ext_id, host, native, tiny_artifact):
    import urllib.request

    live, proxy = host
    index = json.load(urllib.request.urlopen(proxy.url + "/web/models.json"))["data"]
    tiny_id = next(m["id"] for m in index if m["model"] == native["model"])
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"chrome-extension://{ext_id}/options.html")
    row = page.wait_for_selector(f"#models li[data-artifact='{tiny_id}']")
    shown = float(row.inner_text().split(": ")[1].split(" MiB")[0])
    shards = sum(p.stat().st_size for p in (tiny_artifact / "params").glob("*"))
    everything = sum(p.stat().st_size for p in tiny_artifact.rglob("*") if p.is_file())
    assert shards / 2**20 - 0.05 <= shown <= everything / 2**20 + 0.05
    assert page.query_selector("#models li[data-artifact^='smollm2']")  # the side panel's
    row.query_selector("button").click()
    page.wait_for_selector(f"#models li[data-artifact='{tiny_id}']", state="detached")
    left = page.evaluate("""async (id) => (await (await caches.open("wick-artifacts-v1")).keys())
        .filter((r) => r.url.includes(`/artifacts/${id}/`)).length""", tiny_id)
    assert left == 0
    # revoking the allowed site: it is denied from now on
    page.click(f"#origins li[data-origin='{live.url}'] button")
    page.wait_for_selector(f"#origins li[data-origin='{live.url}']", state="detached")
    site = Page(ctx, live.url)
    denied = site.run("""async ([id, model]) => {
        try { await wick.createExtensionEngine(id, model); return null; }
        catch (e) { return e.name; }
    }""", [ext_id, native["model"]])
    assert denied == "PermissionDeniedError"
    site.page.close()
    page.close()


def test_only_model_files_come_from_the_host(ctx, ext_id, host, native):
    """Everything the extension runs is packaged but one thing (README, "The Chrome
    extension"): over the extension's tests above (the ones below are web pages of the host's
    origin, which boot the engine from it) the host was asked for its model index and for files
    its artifacts' manifests list, and the only executable among them is a model's
    WebAssembly kernels (kernels/wasm/*.wasm), which the loader checks against the manifest's
    sha256 before compiling them."""
    import re
    import urllib.request

    from wick.server.export import browser_files

    live, proxy = host
    if not any("/params/" in path for path, _, _, _ in proxy.log):  # (run alone: load here)
        page = ExtPage(ctx, ext_id)
        page.run(CREATE, [native["model"]])
        page.page.close()
    listed: dict[str, set[str]] = {}
    for entry in json.load(urllib.request.urlopen(live.url + "/web/models.json"))["data"]:
        m = json.load(urllib.request.urlopen(
            f"{live.url}/artifacts/{entry['id']}/wick-artifact.json"))
        listed[entry["id"]] = set(browser_files(m))
    asked = {path.split("?")[0] for path, _, _, _ in proxy.log}
    executable = []
    for path in asked - {"/web/models.json"}:
        m = re.fullmatch(r"/artifacts/([^/]+)/(.+)", path)
        assert m and m.group(2) in listed.get(m.group(1), ()), path
        if m.group(2).endswith((".wasm", ".js", ".mjs")):
            executable.append(m.group(2))
    assert any("/params/" in p for p in asked)
    assert executable and all(re.fullmatch(r"kernels/wasm/kernels(-threads)?(-relaxed)?\.wasm", e)
                              for e in executable), executable


def test_shared_engine_is_loaded_once_for_two_tabs(ctx, host, native):
    live, proxy = host
    first = Page(ctx, proxy.url)
    before = shard_requests(proxy)
    info1 = first.run("""async (model) => {
        window.engine = await wick.createEngine(model, {quantization: "q0f32", shared: true});
        return window.engine.info;
    }""", native["model"])
    loaded = shard_requests(proxy) - before
    second = Page(ctx, proxy.url)
    out = second.run("""async ([model, prompt, n]) => {
        const engine = await wick.createEngine(model, {quantization: "q0f32", shared: true});
        const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        return {info: engine.info, text: comp.choices[0].text};
    }""", [native["model"], PROMPT, N])
    assert info1["attached"] is False and out["info"]["attached"] is True
    assert shard_requests(proxy) - before == loaded  # the second tab loaded no weights
    assert out["text"] == native["completion"]["choices"][0]["text"]
    first.page.close()
    second.page.close()


def test_a_killed_shared_worker_fails_requests_typed_and_the_next_reloads(ctx, host, native):
    """A SharedWorker that dies (a crash, or here the browser closing it) says nothing on its
    MessagePorts: the tab learns it from the Web Lock the worker held, fails the request in
    flight with an EngineLostError and loads a new engine for the next one."""
    live, proxy = host
    tab = Page(ctx, proxy.url)
    cdp = ctx.new_cdp_session(tab.page)
    outcomes = []
    # The tiny model writes its 120 tokens in well under a second: on a loaded machine the
    # request can finish before the close arrives. That attempt proves nothing; try again.
    while len(outcomes) < 3 and "EngineLostError" not in outcomes:
        tab.run("""async (model) => {
            window.engine = await wick.createEngine(model, {quantization: "q0f32", shared: true});
            window.pending = engine.completions.create(
                {prompt: "x", max_tokens: 120, temperature: 0, ignore_eos: true})
                .then(() => "finished", (e) => e.name);
        }""", native["model"])
        (worker,) = [t for t in cdp.send("Target.getTargets")["targetInfos"]
                     if t["type"] == "shared_worker" and "wick-worker" in t["url"]]
        assert cdp.send("Target.closeTarget", {"targetId": worker["targetId"]})["success"]
        outcomes.append(tab.run("async () => await window.pending"))
    assert set(outcomes) <= {"finished", "EngineLostError"} and outcomes[-1] == "EngineLostError", \
        outcomes
    out = tab.run("""async ([prompt, n]) => {
        const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        return {text: comp.choices[0].text, attached: engine.info.attached};
    }""", [PROMPT, N])
    assert out == {"text": native["completion"]["choices"][0]["text"], "attached": False}
    tab.page.close()

