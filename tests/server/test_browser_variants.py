"""`wick serve` of an f16 model also serves browsers without shader-f16: the app `wick serve`
runs (``serving_app``) compiles the model's f32 twin in the background, lists it under
``preparing`` in /web/models.json with its progress meanwhile, then hosts it."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from starlette.testclient import TestClient

from wick.compiler.compile import compile_model
from wick.engine.artifact import MANIFEST_NAME
from wick.server.serve import serving_app


@pytest.fixture(scope="module")
def f16_artifact(tmp_path_factory):
    """A tiny model of its own, as q4f16_1 with options no other test uses: its twin is not
    in the cache yet."""
    from tests.tiny_models import make_tiny_llama

    from wick.compiler.paths import artifacts_dir

    src = make_tiny_llama(tmp_path_factory.mktemp("variants") / "tiny-variants", seed=3,
                          layers=1)
    # a twin left in the test cache by an earlier session would be "built" in milliseconds,
    # too fast to be seen announced
    for old in artifacts_dir().glob("tiny-variants-q4f32_1-*"):
        shutil.rmtree(old)
    # (the kernel sets this server runs and a browser's: a compile with a choice of sets gets
    # a twin with only the browsers' sets, two builds fewer)
    return compile_model(str(src), "q4f16_1", context_window=96, max_batch_size=2,
                         kernel_sets=("webgpu", "cpu"))


def index(client) -> dict:
    r = client.get("/web/models.json")
    assert r.status_code == 200
    return r.json()


def test_f16_model_gets_its_f32_twin_for_browsers(f16_artifact):
    app = serving_app([str(f16_artifact)])
    with TestClient(app, base_url="http://localhost") as c:
        deadline = time.monotonic() + 120
        stages = set()
        while True:
            body = index(c)
            for p in body["preparing"]:
                assert p["model"] == "tiny-variants" and p["quantization"] == "q4f32_1"
                assert p["features"] == [] and "error" not in p, p
                stages.add(p["stage"])
            if any(m["quantization"] == "q4f32_1" for m in body["data"]):
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.05)
        assert body["preparing"] == []
        assert stages, "the twin was never announced while it was built"
        served, twin = body["data"]
        assert (served["id"], served["features"]) == (f16_artifact.name, ["shader-f16"])
        assert twin["model"] == served["model"] and twin["features"] == []
        manifest = c.get(f"/artifacts/{twin['id']}/{MANIFEST_NAME}").json()
        assert manifest["quantization"] == "q4f32_1"
        assert manifest["model"]["context_window"] == 96  # the served model's options
        assert manifest["model"]["max_batch_size"] == 2
        # (compiled with a choice of sets, the served one; its twin gets the browsers')
        assert manifest["compile_options"]["kernel_sets"] == ["webgpu", "wasm", "wasm_relaxed"]
        assert "cpu" not in manifest["kernel_sets"] and "cuda" not in manifest["kernel_sets"]
        for t in app.state.browser_variants.threads:
            t.join(5)


def test_a_twin_that_cannot_be_built_is_named_as_such(f16_artifact, tmp_path):
    moved = tmp_path / f16_artifact.name
    shutil.copytree(f16_artifact, moved)
    manifest = json.loads((moved / MANIFEST_NAME).read_text())
    manifest["source"]["model"] = str(tmp_path / "gone")
    (moved / MANIFEST_NAME).write_text(json.dumps(manifest))
    app = serving_app([str(moved)])
    with TestClient(app, base_url="http://localhost") as c:
        deadline = time.monotonic() + 60
        while not any("error" in p for p in index(c)["preparing"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (p,) = index(c)["preparing"]
        assert p["quantization"] == "q4f32_1" and "not on this machine" in p["error"]


def test_no_twin_for_f32_models_or_when_disabled(f16_artifact, tiny_a):
    for models, variants in (([str(tiny_a)], True), ([str(f16_artifact)], False)):
        app = serving_app(models, browser_variants=variants)
        with TestClient(app, base_url="http://localhost") as c:
            deadline = time.monotonic() + 60
            while not index(c)["data"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.2)
            body = index(c)
            assert len(body["data"]) == 1 and body["preparing"] == []


def test_a_synthetic_models_twin_is_compiled_from_its_config(tmp_path, monkeypatch):
    """`wick serve` of a synthetic f16 artifact builds its f32 twin with compile_synthetic and
    the same options (the config is its source; compile_model cannot read it)."""
    import wick.compiler.synthetic as synthetic
    from wick.server.browser_variants import BrowserVariants

    calls = []
    monkeypatch.setattr(synthetic, "compile_synthetic",
                        lambda *a, **k: calls.append((a, k)) or tmp_path)
    config = tmp_path / "config.json"
    config.write_text("{}")
    art = tmp_path / "art"
    art.mkdir()
    (art / MANIFEST_NAME).write_text(json.dumps({
        "model_id": "synthetic-x", "quantization": "q4f16_1",
        "source": {"model": str(config), "synthetic": True},
        "compile_options": {"context_window": None, "prefill_chunk_size": 64,
                            "max_batch_size": 4, "max_param_bytes": 1 << 20,
                            "synthetic": True}}))

    class Host:
        def __init__(self):
            self.added, self.events = [], []

        def set_preparing(self, *a, **k):
            self.events.append(k)

        def add(self, out):
            self.added.append(out)

        def done_preparing(self, *a):
            pass

    host = Host()
    BrowserVariants(host).add_for(art).join(30)
    assert [e for e in host.events if "error" in e] == []
    ((args, kwargs),) = calls
    assert args == (str(config), "q4f32_1")
    assert {k: v for k, v in kwargs.items() if k != "progress"} == {
        "context_window": None, "prefill_chunk_size": 64, "max_batch_size": 4,
        "max_param_bytes": 1 << 20}
    assert host.added == [tmp_path]
