"""Artifact loading in the browser (web/src/loader.ts) against a network that misbehaves: a
shard download cut off midway resumes with a Range request; a load that fails leaves its
finished shards cached and the next load downloads only the rest; a full cache quota is
reported as a CacheQuotaError while the model still loads. Each test has a fresh browser
context (its own empty Cache API) and the page comes through tests/browser/proxy.py."""

from __future__ import annotations

import json

import pytest

from .conftest import Page
from .proxy import CuttingProxy, PageServer

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"
N = 6
LOAD = """async ([model, prompt, n]) => {
    const progress = [];
    const engine = await wick.createEngine(model, {quantization: "q0f32",
        onProgress: (p) => progress.push(p)});
    const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
    const out = {info: engine.info, progress, text: comp.choices[0].text,
                 cacheError: engine.cacheError && {name: engine.cacheError.name,
                     code: engine.cacheError.code, message: engine.cacheError.message}};
    await engine.unload();
    return out;
}"""
CACHED_SHARDS = """async () => {
    const cache = await caches.open("wick-artifacts-v1");
    return (await cache.keys()).map((r) => r.url).filter((u) => u.includes("/params/")).length;
}"""


@pytest.fixture(scope="module")
def reference(tiny_artifact):
    from wick.server.local import Engine

    eng = Engine(str(tiny_artifact))
    text = eng.completions.create(prompt=PROMPT, max_tokens=N, temperature=0).choices[0].text
    manifest = json.loads((tiny_artifact / "wick-artifact.json").read_text())
    return {"text": text, "model": manifest["model_id"], "shards": manifest["shards"]}


@pytest.fixture
def proxy(web_server):
    p = CuttingProxy(web_server.url)
    yield p
    p.stop()


@pytest.fixture
def fresh(browser, proxy):
    """A page in a new browser context (empty caches) on the proxy's origin."""
    ctx = browser.new_context()
    yield Page(ctx, proxy.url)
    ctx.close()


def test_cut_off_shard_download_resumes_with_range(fresh, proxy, reference):
    assert len(reference["shards"]) >= 3, "the test artifact should have several shards"
    target = reference["shards"][1]
    proxy.cut[target["file"]] = 1
    out = fresh.run(LOAD, [reference["model"], PROMPT, N])
    assert out["text"] == reference["text"]
    assert out["info"]["resumedRequests"] == 1
    assert out["info"]["shardRequests"] == len(reference["shards"])
    (first, _), (rng, status) = proxy.requests_for(target["file"])
    assert first is None
    # continued from (at most) the cut, not from 0: the proxy sent half the body before the drop
    start = int(rng.removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= target["nbytes"] // 2 and status == 206
    dl = [p for p in out["progress"] if p["stage"] == "download"]
    assert dl[-1]["loaded"] == dl[-1]["total"] == sum(s["nbytes"] for s in reference["shards"])
    assert all(p["loaded"] <= p["total"] for p in dl)
    assert fresh.console_errors == []


def test_failed_load_keeps_finished_shards_and_next_load_fetches_the_rest(fresh, proxy, reference):
    shards = reference["shards"]
    last = shards[-1]["file"]
    proxy.fail.add(last)
    err = fresh.run("""async ([model]) => {
        try { await wick.createEngine(model, {quantization: "q0f32"}); return null; }
        catch (e) { return {name: e.name, code: e.code, message: e.message,
                            typed: e instanceof wick.LoadError}; }
    }""", [reference["model"]])
    assert err is not None and err["typed"] and err["name"] == "LoadError"
    assert err["code"] == "network_error" and last in err["message"] and "503" in err["message"]
    assert len(proxy.requests_for(last)) == 5  # the first try and four retries
    cached = fresh.run(CACHED_SHARDS)
    assert cached == len(shards) - 1  # every shard but the failing one was verified and kept

    proxy.fail.clear()
    out = fresh.run(LOAD, [reference["model"], PROMPT, N])
    assert out["text"] == reference["text"]
    assert out["info"]["shardsFromCache"] == cached
    assert out["info"]["shardRequests"] == len(shards) - cached
    assert fresh.run(CACHED_SHARDS) == len(shards)


def test_cache_quota_exceeded_is_reported_and_the_model_still_loads(fresh, proxy, reference):
    cdp = fresh.context.new_cdp_session(fresh.page)
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": proxy.url, "quotaSize": 64 * 1024})
    out = fresh.run(LOAD, [reference["model"], PROMPT, N])
    assert out["text"] == reference["text"]
    assert out["cacheError"]["name"] == "CacheQuotaError"
    assert out["cacheError"]["code"] == "cache_quota_exceeded"
    assert "quota" in out["cacheError"]["message"]
    notes = [p["text"] for p in out["progress"] if p["stage"] == "cache"]
    assert any("quota" in t for t in notes)
    assert out["info"]["shardRequests"] == len(reference["shards"])


def test_page_on_another_origin_uses_a_cors_wick_host(browser, web_bundle, tiny_artifact, reference):
    """A page on another origin imports wick.js from a wick host started with --cors-origin for
    it; the worker (started through a same-origin shim) loads Pyodide, the engine and the
    artifact from that host and answers like the native engine."""
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    app = PageServer("<!doctype html><title>app</title>")
    app_origin = app.url
    host = ArtifactHost()
    host.add(tiny_artifact)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host, cors_origins=[app_origin]))
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(app_origin + "/")
        page.set_default_timeout(240_000)
        out = page.evaluate("""async ([wickHost, model, prompt, n]) => {
            const wick = await import(wickHost + "/static/wick.js");
            const engine = await wick.createEngine(model, {quantization: "q0f32", baseUrl: wickHost});
            const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
            const info = engine.info;
            await engine.unload();
            return {text: comp.choices[0].text, info, origin: location.origin};
        }""", [live.url, reference["model"], PROMPT, N])
        assert out["origin"] == app_origin
        assert out["text"] == reference["text"]
        assert out["info"]["shardRequests"] == len(reference["shards"])
        assert errors == []
    finally:
        ctx.close()
        live.stop()
        app.stop()


def test_stalled_shard_download_is_cut_and_resumed(fresh, proxy, reference):
    """A response that goes silent midway is abandoned after stallTimeoutMs and resumed with a
    Range request, long before the server would drop it."""
    target = reference["shards"][2]
    proxy.cut[target["file"]] = 1
    proxy.stall_s = 60.0
    out = fresh.run("""async ([model, prompt, n]) => {
        const progress = [];
        const engine = await wick.createEngine(model, {quantization: "q0f32", stallTimeoutMs: 1000,
            onProgress: (p) => progress.push(p)});
        const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        await engine.unload();
        return {text: comp.choices[0].text, info: engine.info, progress};
    }""", [reference["model"], PROMPT, N])
    cut_at, resumed_at = proxy.request_times(target["file"])
    # Resumed about 1 s after the first half arrived, not after the 60 s silence: measured
    # between the proxy's two requests, so a slow machine's engine start does not count.
    assert resumed_at - cut_at < 20.0
    assert out["text"] == reference["text"]
    assert out["info"]["resumedRequests"] == 1
    (_, _), (rng, status) = proxy.requests_for(target["file"])
    assert rng.startswith("bytes=") and rng != "bytes=0-" and status == 206
    assert any("no data for 1 s" in p["text"] for p in out["progress"])


def test_weights_are_fetched_as_soon_as_the_manifest_is_read(fresh, proxy, reference):
    """The shards are fetched (loader.prefetch) as soon as the manifest is read, while Python's
    first boot (seconds, from scratch in a fresh context) may still be going, not when the
    engine asks for them: every shard of the tiny model was fetched ahead, each once. (Whether
    the fetch overlaps the boot depends on the machine: on a busy one the executor's start and
    the manifest took longer than Python's boot, and a shard was asked for 0.05 s after
    "Python ready".)"""
    out = fresh.run(LOAD, [reference["model"], PROMPT, N])
    assert out["text"] == reference["text"]
    asked = {s["file"]: [when for path, _, _, when in proxy.log if path.endswith(s["file"])]
             for s in reference["shards"]}
    assert all(len(times) == 1 for times in asked.values()), proxy.log
    assert out["info"]["shardsFetchedAhead"] == len(reference["shards"])
    assert out["info"]["shardRequests"] == len(reference["shards"])
