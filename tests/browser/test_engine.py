"""The browser engine on WebGPU (``backend: "webgpu"``: SwiftShader here, which "auto" passes over
for the WebAssembly kernels, tested in test_wasm.py) equals the native engine on the same
artifact (tiny random Llama, q0f32):
greedy chat and completion, streaming, errors across the worker boundary, concurrency,
abortAll, the Cache API and a corrupted cached shard."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "hello there"}]
PROMPT = "The quick brown fox"
TURN1 = [{"role": "system", "content": "Be terse."},
         {"role": "user", "content": "Name a colour."}]
N = 8


@pytest.fixture(scope="module")
def native(tiny_artifact):
    """Reference outputs of the native engine (wgpu) on the same artifact."""
    from wick.server.local import Engine

    eng = Engine(str(tiny_artifact))
    chat = eng.chat.completions.create(messages=MESSAGES, max_tokens=N, temperature=0)
    comp = eng.completions.create(prompt=PROMPT, max_tokens=N, temperature=0)
    comp2 = eng.completions.create(prompt="hello", max_tokens=N, temperature=0)
    # a two-turn chat: the second turn reads the first one's pages from the prefix cache
    turns = [eng.chat.completions.create(messages=TURN1, max_tokens=4, temperature=0).to_dict()]
    turn2 = [*TURN1, turns[0]["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    turns.append(eng.chat.completions.create(messages=turn2, max_tokens=4,
                                             temperature=0).to_dict())
    errors = {}
    from wick.engine.errors import WickError

    for name, body in {
        "temperature": {"prompt": PROMPT, "temperature": 7},
        "unknown": {"prompt": PROMPT, "frobnicate": 1},
        "too_long": {"prompt": PROMPT, "max_tokens": 10_000},
    }.items():
        with pytest.raises(WickError) as info:
            eng.completions.create(**body)
        errors[name] = {**info.value.to_dict()["error"], "cls": type(info.value).__name__}
    return {"chat": chat.to_dict(), "completion": comp.to_dict(), "completion2": comp2.to_dict(),
            "errors": errors, "model": eng.core.info.model_id, "turns": turns,
            "page_size": eng.core.info.page_size}


@pytest.fixture(scope="module")
def loaded(page, native):
    """One engine in the page as window.engine; returns its info and the load's progress."""
    return page.run("""async (model) => {
        const progress = [];
        window.engine = await wick.createEngine(model, {quantization: "q0f32", backend: "webgpu",
            onProgress: (p) => progress.push(p)});
        return {info: window.engine.info, progress};
    }""", native["model"])


def test_greedy_chat_and_completion_equal_native(page, loaded, native):
    assert loaded["info"]["quantization"] == "q0f32"
    stages = {p["stage"] for p in loaded["progress"]}
    assert {"boot", "compile", "download", "ready"} <= stages
    dl = [p for p in loaded["progress"] if p["stage"] == "download"]
    assert dl[-1]["loaded"] == dl[-1]["total"] > 0
    out = page.run("""async ([messages, prompt, n]) => {
        const chat = await engine.chat.completions.create({messages, max_tokens: n, temperature: 0});
        const comp = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        return {chat, comp};
    }""", [MESSAGES, PROMPT, N])
    want_chat = native["chat"]["choices"][0]
    got_chat = out["chat"]["choices"][0]
    assert got_chat["message"]["content"] == want_chat["message"]["content"]
    assert got_chat["finish_reason"] == want_chat["finish_reason"]
    assert out["chat"]["usage"] == native["chat"]["usage"]
    assert out["chat"]["object"] == "chat.completion"
    assert out["comp"]["choices"][0]["text"] == native["completion"]["choices"][0]["text"]
    assert out["comp"]["usage"] == native["completion"]["usage"]


def test_a_two_turn_chat_reports_cached_tokens_and_gives_the_native_tokens(page, loaded, native):
    out = page.run("""async (turn1) => {
        const first = await engine.chat.completions.create(
            {messages: turn1, max_tokens: 4, temperature: 0});
        const turn2 = [...turn1, first.choices[0].message, {role: "user", content: "and then?"}];
        const second = await engine.chat.completions.create(
            {messages: turn2, max_tokens: 4, temperature: 0});
        return [first, second];
    }""", TURN1)
    want = native["turns"]
    assert [r["choices"][0]["message"] for r in out] == [r["choices"][0]["message"] for r in want]
    assert [r["usage"] for r in out] == [r["usage"] for r in want]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in out]
    assert cached[0] == 0 and cached[1] >= native["page_size"]


def test_stream_joins_to_non_stream_text(page, loaded, native):
    out = page.run("""async ([messages, prompt, n]) => {
        const chunks = [];
        for await (const c of await engine.chat.completions.create(
            {messages, max_tokens: n, temperature: 0, stream: true})) chunks.push(c);
        const texts = [];
        for await (const c of await engine.completions.create(
            {prompt, max_tokens: n, temperature: 0, stream: true})) texts.push(c);
        return {chunks, texts};
    }""", [MESSAGES, PROMPT, N])
    chat = "".join(c["choices"][0]["delta"].get("content") or "" for c in out["chunks"] if c["choices"])
    assert chat == native["chat"]["choices"][0]["message"]["content"]
    assert out["chunks"][0]["object"] == "chat.completion.chunk"
    assert out["chunks"][-1]["choices"][0]["finish_reason"] == native["chat"]["choices"][0]["finish_reason"]
    text = "".join(c["choices"][0]["text"] for c in out["texts"] if c["choices"])
    assert text == native["completion"]["choices"][0]["text"]


def test_errors_are_typed_with_the_python_messages(page, loaded, native):
    out = page.run("""async (bodies) => {
        const res = {};
        for (const [name, body] of Object.entries(bodies)) {
            try { await engine.completions.create(body); res[name] = null; }
            catch (e) { res[name] = {cls: e.constructor.name, message: e.message, param: e.param,
                code: e.code, type: e.type, isWick: e instanceof wick.WickError,
                isInvalid: e instanceof wick.InvalidRequestError}; }
        }
        try { await wick.createEngine("no-such-model", {}); res.unknown_model = null; }
        catch (e) { res.unknown_model = {cls: e.constructor.name, message: e.message, param: e.param,
            code: e.code, isModelNotFound: e instanceof wick.ModelNotFoundError}; }
        return res;
    }""", {"temperature": {"prompt": PROMPT, "temperature": 7},
           "unknown": {"prompt": PROMPT, "frobnicate": 1},
           "too_long": {"prompt": PROMPT, "max_tokens": 10_000}})
    for name, want in native["errors"].items():
        got = out[name]
        assert got is not None, name
        assert got["isWick"] and got["isInvalid"], got
        assert got["cls"] == want["cls"]
        assert (got["message"], got["param"], got["code"], got["type"]) == (
            want["message"], want["param"], want["code"], want["type"])
    um = out["unknown_model"]
    assert um["isModelNotFound"] and um["cls"] == "ModelNotFoundError"
    assert um["message"].startswith("The model 'no-such-model' does not exist.")
    assert um["param"] == "model" and um["code"] == "model_not_found"


def test_f16_variant_without_shader_f16_names_the_working_variant(page, loaded, native):
    out = page.run("""async (model) => {
        try { await wick.createEngine(model, {quantization: "q4f16_1", backend: "webgpu"}); return null; }
        catch (e) { return {cls: e.constructor.name, message: e.message, code: e.code,
            missing: e instanceof wick.MissingFeatureError, device: e instanceof wick.DeviceError}; }
    }""", native["model"])
    assert out is not None and out["missing"] and out["device"], out
    from wick.engine.errors import MissingFeatureError

    # the worker builds this error itself (web/src/errors.ts): it must read as Python's
    want = MissingFeatureError("shader-f16", ["q4f32_1", "q0f32"],
                               requested=f"{native['model']} q4f16_1")
    assert out["code"] == want.code == "missing_device_feature"
    assert out["message"] == want.message
    assert "use q4f32_1 or q0f32 instead" in out["message"]


def test_q4f32_1_variant_equals_native(page, loaded, tiny_q4_artifact):
    """The 4-bit (q4f32_1) kernels in the browser give the native engine's tokens."""
    from wick.server.local import Engine

    eng = Engine(str(tiny_q4_artifact))
    want = eng.completions.create(prompt=PROMPT, max_tokens=N, temperature=0).choices[0].text
    out = page.run("""async ([model, prompt, n]) => {
        const q4 = await wick.createEngine(model, {quantization: "q4f32_1", backend: "webgpu"});
        const r = await q4.completions.create({prompt, max_tokens: n, temperature: 0});
        const info = q4.info;
        await q4.unload();
        return {text: r.choices[0].text, quantization: info.quantization};
    }""", [eng.core.info.model_id, PROMPT, N])
    assert out == {"text": want, "quantization": "q4f32_1"}


def test_a_draft_model_shares_the_webgpu_device(page, loaded, native):
    """Speculation with a draft model on WebGPU (issue #28): the 4-bit twin's kernels and
    buffers beside the model's on one device; the tokens are the model's own."""
    out = page.run("""async ([model, prompt, n]) => {
        const e = await wick.createEngine(model, {quantization: "q0f32", backend: "webgpu",
            speculative: {method: "draft", numTokens: 3}});
        const r = await e.completions.create({prompt, max_tokens: n, temperature: 0});
        const stats = await e.stats();
        const info = e.info;
        await e.unload();
        return {text: r.choices[0].text, draft: info.draft, spec: stats.speculation};
    }""", [native["model"], PROMPT, N])
    assert out["text"] == native["completion"]["choices"][0]["text"]
    assert out["draft"]["quantization"] == "q4f32_1"
    assert out["spec"]["drafted_tokens"] > 0


def test_concurrent_creates_share_steps_and_equal_solo(page, loaded, native):
    out = page.run("""async ([prompt, n]) => {
        const before = (await engine.stats()).steps;
        const [a, b] = await Promise.all([
            engine.completions.create({prompt, max_tokens: n, temperature: 0}),
            engine.completions.create({prompt: "hello", max_tokens: n, temperature: 0})]);
        const after = (await engine.stats()).steps;
        return {a, b, steps: after - before};
    }""", [PROMPT, N])
    assert out["a"]["choices"][0]["text"] == native["completion"]["choices"][0]["text"]
    assert out["b"]["choices"][0]["text"] == native["completion2"]["choices"][0]["text"]
    # solo they would take 2 * N steps (one prefill + N - 1 decodes each); shared, about N
    assert out["steps"] < 2 * N, out["steps"]


def test_abort_all_ends_with_abort_and_engine_stays_usable(page, loaded, native):
    out = page.run("""async ([prompt, n]) => {
        const chunks = [];
        const stream = await engine.completions.create(
            {prompt, max_tokens: 100, temperature: 0, ignore_eos: true, stream: true});
        for await (const c of stream) {
            chunks.push(c);
            if (chunks.length === 2) engine.abortAll();
        }
        const after = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        const ctl = new AbortController();
        let aborted = null;
        const p = engine.completions.create({prompt, max_tokens: 100, temperature: 0, ignore_eos: true},
            {signal: ctl.signal});
        setTimeout(() => ctl.abort(), 50);
        try { await p; } catch (e) { aborted = e.constructor.name; }
        const again = await engine.completions.create({prompt, max_tokens: n, temperature: 0});
        return {chunks, after, aborted, again};
    }""", [PROMPT, N])
    finishes = [c["choices"][0]["finish_reason"] for c in out["chunks"] if c["choices"]]
    assert finishes[-1] == "abort"
    assert len(out["chunks"]) < 100
    want = native["completion"]["choices"][0]["text"]
    assert out["after"]["choices"][0]["text"] == want
    assert out["aborted"] == "EngineAbortedError"
    assert out["again"]["choices"][0]["text"] == want


def test_reload_uses_cache_and_corrupt_shard_is_refetched(page, loaded, native):
    out = page.run("""async ([model, prompt, n, first]) => {
        await engine.unload();
        const second = await wick.createEngine(model, {quantization: "q0f32", backend: "webgpu"});
        const info2 = second.info;
        await second.unload();
        // corrupt one cached shard
        const cache = await caches.open("wick-artifacts-v1");
        const keys = (await cache.keys()).map((r) => r.url)
            .filter((u) => u.includes(`/${first.artifactId}/params/`));
        await cache.put(keys[0], new Response(new Uint8Array(1024)));
        const third = await wick.createEngine(model, {quantization: "q0f32", backend: "webgpu"});
        const comp = await third.completions.create({prompt, max_tokens: n, temperature: 0});
        const info3 = third.info;
        window.engine = third;
        const fixed = await cache.match(keys[0]);
        return {info2, info3, comp, fixedBytes: (await fixed.arrayBuffer()).byteLength, nshards: keys.length};
    }""", [native["model"], PROMPT, N, loaded["info"]])
    first = loaded["info"]
    assert first["shardRequests"] == out["nshards"] and first["shardsFromCache"] == 0
    assert out["info2"]["shardRequests"] == 0
    assert out["info2"]["shardsFromCache"] == out["nshards"]
    assert out["info3"]["shardsRefetched"] == 1 and out["info3"]["shardRequests"] == 1
    assert out["fixedBytes"] > 1024
    assert out["comp"]["choices"][0]["text"] == native["completion"]["choices"][0]["text"]


def test_no_console_errors(page, loaded):
    assert page.console_errors == []


def test_auto_turns_to_webgpu_for_an_artifact_without_webassembly_kernels(context, web_bundle,
                                                                          tiny_llama_dir):
    """An artifact compiled with ``--kernel-sets webgpu``: "auto", which takes the WebAssembly
    kernels on a software adapter (SwiftShader here), turns to WebGPU, where the artifact has its
    kernels, and gives the native engine's tokens (natively "auto" turns to WebGPU too)."""
    from tests.conftest import TINY_SMALL
    from wick.compiler.compile import compile_model
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.local import Engine
    from wick.server.serve import ServerThread

    from tests.browser.conftest import Page

    art = compile_model(str(tiny_llama_dir), "q0f32", kernel_sets=("webgpu",),
                        **{**TINY_SMALL, "max_batch_size": 2})
    eng = Engine(str(art))
    assert eng.core.runner.backend.kind == "webgpu"
    want = eng.completions.create(prompt=PROMPT, max_tokens=N, temperature=0).choices[0].text
    host = ArtifactHost()
    host.add(art)
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    try:
        page = Page(context, live.url)
        out = page.run("""async ([model, prompt, n]) => {
            const e = await wick.createEngine(model, {quantization: "q0f32"});
            const r = await e.completions.create({prompt, max_tokens: n, temperature: 0});
            const backend = e.info.backend;
            await e.unload();
            return {text: r.choices[0].text, backend};
        }""", [eng.core.info.model_id, PROMPT, N])
        assert out == {"text": want, "backend": "webgpu"}
        assert not page.console_errors
    finally:
        live.stop()
