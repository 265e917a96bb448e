"""``engine.embeddings.create`` in Chromium: all-MiniLM-L6-v2 (f32) on the WebAssembly kernels
and on WebGPU (SwiftShader), each vector within cosine 0.9999 of transformers' mean-pooled,
normalized one; base64 equals float; a chat request is refused with the engine's 400."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from .conftest import Page

pytestmark = pytest.mark.slow

TEXTS = ["The lighthouse stood on the rocks.", "A ship passed in the night.",
         "Embeddings let a page search its own documents."]
RUN = """async ([model, backend, texts]) => {
    const engine = await wick.createEngine(model, {backend, quantization: "q0f32"});
    const floats = await engine.embeddings.create({input: texts});
    const b64 = await engine.embeddings.create({input: texts[0], encoding_format: "base64"});
    let chatError = null;
    try {
        await engine.chat.completions.create({messages: [{role: "user", content: "hi"}]});
    } catch (e) { chatError = {code: e.code, status: e.status, param: e.param}; }
    await engine.unload();
    return {floats, b64, chatError, info: engine.info};
}"""


@pytest.fixture(scope="module")
def minilm(minilm_path, compiled):
    return minilm_path, compiled("all-minilm-l6-v2", "q0f32")


@pytest.fixture(scope="module")
def reference(minilm) -> np.ndarray:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path, _ = minilm
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()


@pytest.fixture(scope="module")
def server(web_bundle, minilm):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost
    from wick.server.serve import ServerThread

    host = ArtifactHost()
    host.add(minilm[1])
    live = ServerThread(create_app(ModelPool(state="ready"), artifacts=host))
    yield live
    live.stop()


@pytest.mark.parametrize("backend", ["wasm", "webgpu"])
def test_minilm_in_chromium_matches_transformers(context, server, reference, backend):
    page = Page(context, server.url)
    out = page.run(RUN, ["all-minilm-l6-v2", backend, TEXTS], timeout=600_000)
    assert out["info"]["backend"] == backend
    data = out["floats"]["data"]
    got = np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])])
    assert got.shape == reference.shape
    assert ((got * reference).sum(1) > 0.9999).all(), (got * reference).sum(1)
    first = np.frombuffer(base64.b64decode(out["b64"]["data"][0]["embedding"]), "<f4")
    assert np.array_equal(first, got[0].astype(np.float32))
    assert out["floats"]["usage"]["prompt_tokens"] > len(TEXTS) * 2
    assert out["chatError"] == {"code": "model_not_generative", "status": 400, "param": "model"}
    assert not page.console_errors
