"""The WebAssembly kernels in Chromium with WebGPU disabled (no --enable-unsafe-webgpu): the
default backend ("auto") falls back to them, and they give the native CPU engine's greedy
tokens on the same artifact (the tiny random Llama, f32, 4-bit and f16, one thread and, in a
cross-origin isolated page, every core), and SmolLM2-135M transformers' greedy tokens."""

from __future__ import annotations

import pytest

from .conftest import CHROMIUM, CHROMIUM_ARGS_NO_WEBGPU, ISOLATION, Page

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "hello there"}]
N = 32
SMOL_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def browser(playwright):
    """Chromium as shipped: WebGPU is off on Linux without --enable-unsafe-webgpu."""
    b = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                  args=CHROMIUM_ARGS_NO_WEBGPU)
    yield b
    b.close()


@pytest.fixture(scope="module")
def native(tiny_artifact, tiny_q4_artifact):
    """The native CPU engine's greedy outputs on the same artifacts."""
    from wick.server.local import Engine

    out = {}
    for name, art in (("q0f32", tiny_artifact), ("q4f32_1", tiny_q4_artifact)):
        eng = Engine(str(art), device="cpu")
        out[name] = {
            "chat": eng.chat.completions.create(messages=MESSAGES, max_tokens=N,
                                                temperature=0).to_dict(),
            "completion": eng.completions.create(prompt=PROMPT, max_tokens=N, temperature=0,
                                                 logprobs=2).to_dict(),
        }
        out["model"] = eng.core.info.model_id
    return out


RUN = """async ([model, quantization, backend, messages, prompt, n, speculative, relaxedSimd]) => {
    const progress = [];
    const engine = await wick.createEngine(model, {quantization, backend, speculative, relaxedSimd,
        onProgress: (p) => progress.push(p.stage)});
    const chat = await engine.chat.completions.create({messages, max_tokens: n, temperature: 0});
    const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0, logprobs: 2});
    const parts = [];
    for await (const c of await engine.chat.completions.create({messages, max_tokens: n,
            temperature: 0, stream: true})) parts.push(c.choices[0]?.delta?.content ?? "");
    const stats = await engine.stats();
    await engine.unload();
    return {info: engine.info, chat, comp, streamed: parts.join(""), progress, stats,
            gpu: Boolean(navigator.gpu && await navigator.gpu.requestAdapter())};
}"""


def _same(out: dict, want: dict) -> None:
    assert out["chat"]["choices"][0]["message"]["content"] == \
        want["chat"]["choices"][0]["message"]["content"]
    usage = dict(out["chat"]["usage"])
    # (under speculation, the drafts kept and refused: the output's own counts stay equal)
    details = usage.pop("completion_tokens_details")
    assert usage == {k: v for k, v in want["chat"]["usage"].items()
                     if k != "completion_tokens_details"}
    assert set(details) == {"accepted_prediction_tokens", "rejected_prediction_tokens"}
    assert out["streamed"] == want["chat"]["choices"][0]["message"]["content"]
    got, ref = out["comp"]["choices"][0], want["completion"]["choices"][0]
    assert got["text"] == ref["text"]
    assert got["logprobs"]["tokens"] == ref["logprobs"]["tokens"]
    for a, b in zip(got["logprobs"]["token_logprobs"], ref["logprobs"]["token_logprobs"]):
        assert abs(a - b) < 1e-4
    assert len(got["logprobs"]["tokens"]) == N


@pytest.mark.parametrize("quantization,relaxed", [("q0f32", None), ("q4f32_1", False)])
def test_auto_backend_without_webgpu_runs_wasm_kernels_with_native_tokens(
        context, web_server, native, quantization, relaxed):
    """The relaxed-SIMD kernels by default (Chromium has relaxed SIMD), the plain ones with
    ``relaxedSimd: false``: both give the native engine's tokens."""
    page = Page(context, web_server.url)
    out = page.run(RUN, [native["model"], quantization, None, MESSAGES, PROMPT, N, None, relaxed])
    assert not out["gpu"]  # no adapter in this browser
    info = out["info"]
    assert info["backend"] == "wasm" and info["threads"] == 1  # (not cross-origin isolated)
    assert out["stats"]["helperTasks"] == 0
    simd = "SIMD" if relaxed is False else "relaxed SIMD"
    assert info["device"].startswith(f"wasm: WebAssembly {simd} (1 thread")
    assert info["quantization"] == quantization
    assert "compile" in out["progress"] and out["progress"][-1] == "ready"
    _same(out, native[quantization])
    assert out["stats"]["steps"] > N and out["stats"]["device"] == info["device"]
    assert not page.console_errors


def test_an_artifact_without_relaxed_kernels_runs_the_plain_ones(context, native, tiny_q4_artifact,
                                                                  tmp_path):
    """An artifact compiled before the relaxed-SIMD modules (its manifest lists only ``wasm``
    and ``wasm_threads``) runs the plain module in a browser that has relaxed SIMD, with the
    native engine's tokens; the relaxed ones are never fetched."""
    import json
    import shutil

    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    art = tmp_path / tiny_q4_artifact.name
    shutil.copytree(tiny_q4_artifact, art)
    manifest = json.loads((art / "wick-artifact.json").read_text())
    for kind in ("wasm_relaxed", "wasm_threads_relaxed"):
        (art / manifest["kernel_sets"].pop(kind)["file"]).unlink()
    (art / "wick-artifact.json").write_text(json.dumps(manifest))
    host = ArtifactHost()
    host.add(art)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    try:
        page = Page(context, live.url)
        out = page.run(RUN, [native["model"], "q4f32_1", "wasm", MESSAGES, PROMPT, N])
    finally:
        live.stop()
    assert out["info"]["device"].startswith("wasm: WebAssembly SIMD (1 thread")
    _same(out, native["q4f32_1"])
    fetched = [u for u in page.requests if u.endswith(".wasm") and "/artifacts/" in u]
    assert fetched and all(u.endswith("/kernels/wasm/kernels.wasm") for u in fetched), fetched
    assert not page.console_errors


def test_an_isolated_page_runs_the_kernels_on_every_core(context, web_server, native):
    """Cross-origin isolated (as `wick serve` sends its pages), the engine runs the threaded
    module: helper threads over a shared memory take tasks of the kernels' parallel loops, and
    the tokens are the same, with n-gram speculation on (issue #28) too."""
    page = Page(context, web_server.url, headers=ISOLATION)
    out = page.run(RUN, [native["model"], "q4f32_1", "wasm", MESSAGES, PROMPT, N,
                         {"method": "ngram", "numTokens": 4}])
    cores = page.run("() => [navigator.hardwareConcurrency, crossOriginIsolated]")
    assert cores[1] is True
    info = out["info"]
    assert info["backend"] == "wasm" and info["threads"] == min(cores[0], 16) > 1
    assert out["stats"]["threads"] == info["threads"]
    assert out["stats"]["helperTasks"] > 100  # the helpers took part
    assert set(out["stats"]["speculation"]) >= {"verify_steps", "acceptance_rate"}
    _same(out, native["q4f32_1"])
    assert not page.console_errors


@pytest.mark.parametrize("isolated", [False, True])
def test_a_draft_model_drafts_on_an_executor_of_its_own(context, web_server, native, isolated):
    """Speculation with a draft model in the browser (issue #28): the q0f32 model, drafted for
    by its own 4-bit twin (the default draft), each on a WebAssembly executor of its own (one
    kernel module each; in an isolated page the model's with helper threads, the draft's on
    one thread), gives the native engine's q0f32 tokens, and the draft's drafts were
    verified."""
    page = Page(context, web_server.url, headers=ISOLATION if isolated else None)
    out = page.run(RUN, [native["model"], "q0f32", "wasm", MESSAGES, PROMPT, N,
                         {"method": "draft", "numTokens": 4}])
    info = out["info"]
    assert info["quantization"] == "q0f32"
    assert info["draft"]["model"] == info["model"]
    assert info["draft"]["quantization"] == "q4f32_1"
    assert info["draft"]["artifactId"] != info["artifactId"]
    spec = out["stats"]["speculation"]
    assert spec["verify_steps"] > 0 and spec["drafted_tokens"] > 0
    _same(out, native["q0f32"])
    assert not page.console_errors


def test_a_draft_model_the_host_lacks_is_named(context, web_server, native):
    page = Page(context, web_server.url)
    err = page.run("""async (model) => {
        try {
            await wick.createEngine(model, {backend: "wasm",
                speculative: {method: "draft", quantization: "q8f32_1"}});
            return null;
        } catch (e) { return {name: e.name, status: e.status, param: e.param, message: e.message}; }
    }""", native["model"])
    assert err["name"] == "ModelNotFoundError" and err["status"] == 404
    assert err["param"] == "speculative"
    assert err["message"].startswith("the draft model") and "q8f32_1" in err["message"]
    bad = page.run("""async (model) => {
        try {
            await wick.createEngine(model, {speculative: {method: "ngram", model: "x"}});
            return null;
        } catch (e) { return {name: e.name, status: e.status, param: e.param, code: e.code}; }
    }""", native["model"])
    assert bad == {"name": "InvalidRequestError", "status": 400, "param": "speculative",
                   "code": "invalid_value"}


def test_a_second_start_restores_python_from_its_snapshot(browser, web_server, native):
    """The first engine of an origin boots Pyodide and imports the engine, then keeps a
    snapshot of Python's memory in the browser cache; the next worker restores it (issue
    #31's start-up) and gives the same tokens. ``cache: false`` neither reads nor keeps one."""
    ctx = browser.new_context()  # (an empty cache)
    try:
        page = Page(ctx, web_server.url)
        out = page.run("""async ([model, prompt, n]) => {
            const runs = [];
            for (const cache of [true, true, false]) {
                const engine = await wick.createEngine(model, {quantization: "q0f32", cache});
                const r = await engine.completions.create({prompt, max_tokens: n, temperature: 0,
                                                           logprobs: 2});
                runs.push({python: engine.info.python, text: r.choices[0].text,
                           logprobs: r.choices[0].logprobs.token_logprobs});
                await engine.unload();
                // (the snapshot is kept after the load: let the cache take it)
                for (let i = 0; i < 50 && !(await caches.open("wick-runtime-v1").then(
                    (c) => c.keys())).length; i++) await new Promise((r) => setTimeout(r, 100));
            }
            const kept = await (await caches.open("wick-runtime-v1")).keys();
            return {runs, kept: kept.length};
        }""", [native["model"], PROMPT, N])
    finally:
        ctx.close()
    first, second, uncached = out["runs"]
    assert first["python"]["from"] == "scratch" and second["python"]["from"] == "snapshot"
    assert uncached["python"]["from"] == "scratch"
    assert out["kept"] == 1
    print(f"Python start: {first['python']['ms']} ms from scratch, "
          f"{second['python']['ms']} ms from the snapshot")
    assert second["python"]["ms"] < first["python"]["ms"]
    want = native["q0f32"]["completion"]["choices"][0]
    for run in out["runs"]:
        assert run["text"] == want["text"]
        for a, b in zip(run["logprobs"], want["logprobs"]["token_logprobs"]):
            assert abs(a - b) < 1e-4


def test_a_worker_of_another_build_is_refused_with_what_to_do(context, web_server, native):
    """wick.js and the worker it reaches carry their build's protocol (a digest of
    worker_protocol.ts and errors.ts): a worker built from another protocol (an app's bundled wick-web
    against another wick version's site) refuses the load with a typed error."""
    import hashlib
    import json
    from pathlib import Path

    web = Path(__file__).resolve().parents[2] / "web"
    digest = hashlib.sha256()
    for name in ("worker_protocol.ts", "errors.ts"):  # (web/build.mjs PROTOCOL_SOURCES)
        digest.update((web / "src" / name).read_bytes())
    protocol = digest.hexdigest()[:16]
    version = json.loads((web / "package.json").read_text())["version"]
    page = Page(context, web_server.url)
    err = page.run("""async ([model, swaps]) => {
        // the served worker, as another build of wick would have it
        let src = await (await fetch("/static/web/wick-worker.js")).text();
        const found = swaps.map(([from]) => src.split(from).length - 1);
        for (const [from, to] of swaps) src = src.split(from).join(to);
        const workerUrl = URL.createObjectURL(new Blob([src], {type: "text/javascript"}));
        try { await wick.createEngine(model, {backend: "wasm", workerUrl}); return {found}; }
        catch (e) { return {found, name: e.name, status: e.status, code: e.code, param: e.param,
                            message: e.message}; }
    }""", [native["model"], [[json.dumps(protocol), json.dumps("0" * 16)],
                             [json.dumps(version), json.dumps("9.9.9")]]])
    assert err["found"][0] == 1  # the build's digest, as this test computes it
    assert err["name"] == "LoadError" and err["status"] == 400
    assert err["code"] == "protocol_mismatch" and err["param"] == "baseUrl"
    assert f"wick {version}" in err["message"] and "wick 9.9.9" in err["message"]
    assert "npm install wick-web@9.9.9" in err["message"]


def test_webgpu_asked_for_without_webgpu_is_a_clear_error(context, web_server, native):
    page = Page(context, web_server.url)
    err = page.run("""async (model) => {
        try { await wick.createEngine(model, {backend: "webgpu"}); return null; }
        catch (e) { return {name: e.name, code: e.code, param: e.param, message: e.message}; }
    }""", native["model"])
    assert err["name"] == "WebGPUUnavailableError"
    assert err["code"] in ("no_webgpu", "no_adapter")
    assert "wasm" in err["message"]
    bad = page.run("""async (model) => {
        try { await wick.createEngine(model, {backend: "cuda"}); return null; }
        catch (e) { return {name: e.name, status: e.status, code: e.code, param: e.param}; }
    }""", native["model"])
    assert bad == {"name": "InvalidRequestError", "status": 400, "code": "invalid_backend",
                   "param": "backend"}


def test_an_f16_variant_runs_on_wasm(context, web_server, native, tiny_f16_artifact):
    """No GPU has to have shader-f16 here: the wasm kernels round each f16 operation through
    f32 like the native CPU backend, and give its tokens."""
    from wick.server.local import Engine

    want = Engine(str(tiny_f16_artifact), device="cpu").completions.create(
        prompt=PROMPT, max_tokens=8, temperature=0).to_dict()
    page = Page(context, web_server.url)
    out = page.run("""async ([model, prompt]) => {
        const engine = await wick.createEngine(model, {quantization: "q4f16_1"});
        const r = await engine.completions.create({prompt, max_tokens: 8, temperature: 0});
        await engine.unload();
        return {text: r.choices[0].text, backend: engine.info.backend};
    }""", [native["model"], PROMPT])
    assert out == {"text": want["choices"][0]["text"], "backend": "wasm"}


@pytest.fixture(scope="module")
def smol_server(web_bundle, compiled):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    art = compiled("smollm2-135m-instruct", "q0f32")
    host = ArtifactHost()
    host.add(art)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    yield live, art
    live.stop()


def test_smollm2_on_wasm_gives_transformers_greedy_tokens(context, smol_server, smollm2_hf):
    """SmolLM2 q0f32 on the WebAssembly kernels: a greedy completion of the prompt's token ids
    gives transformers' tokens on the same (dequantized) weights, and a chat the native CPU
    engine's text."""
    from tokenizers import Tokenizer

    from tests.e2e.helpers import hf_greedy
    from wick.server.local import Engine

    live, art = smol_server
    tok = Tokenizer.from_file(str(art / "tokenizer.json"))
    prompt = tok.encode("The three primary colors are", add_special_tokens=False).ids
    want_ids = hf_greedy(smollm2_hf, prompt, 16)
    want_chat = Engine(str(art), device="cpu").chat.completions.create(
        messages=SMOL_MESSAGES, max_tokens=16, temperature=0).to_dict()
    page = Page(context, live.url)
    out = page.run("""async ([prompt, messages]) => {
        const engine = await wick.createEngine("smollm2-135m-instruct", {quantization: "q0f32"});
        const t0 = performance.now();
        const comp = await engine.completions.create({prompt, max_tokens: 16, temperature: 0});
        const ms = performance.now() - t0;
        const chat = await engine.chat.completions.create({messages, max_tokens: 16, temperature: 0});
        // speculation in the browser: the output predicted, verified several rows a step
        const predicted = await engine.completions.create({prompt, max_tokens: 16, temperature: 0,
            prediction: {type: "content", content: comp.choices[0].text}});
        const stats = await engine.stats();
        await engine.unload();
        return {comp, chat, ms, backend: engine.info.backend, predicted, stats};
    }""", [prompt, SMOL_MESSAGES], timeout=600_000)
    print(f"SmolLM2 q0f32 on wasm in Chromium: 16 tokens in {out['ms'] / 1e3:.1f} s")
    assert out["backend"] == "wasm"
    assert out["comp"]["choices"][0]["text"] == tok.decode(want_ids)
    assert out["comp"]["usage"]["completion_tokens"] == len(want_ids) == 16
    assert out["chat"]["choices"][0]["message"]["content"] == \
        want_chat["choices"][0]["message"]["content"]
    assert out["chat"]["usage"] == want_chat["usage"]
    predicted = out["predicted"]
    assert predicted["choices"][0]["text"] == out["comp"]["choices"][0]["text"]
    details = predicted["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] >= 10
    assert out["stats"]["speculation"]["verify_steps"] > 0
    assert not page.console_errors
