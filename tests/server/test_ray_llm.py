"""``wick.ray``: a Ray Serve LLM application (Ray's OpenAI ingress over its ``LLMServer``
deployment) with wick as its engine, the tiny model on a local Ray cluster of its own
(tests/server/ray_llm_app.py, run with Ray Serve LLM's OpenAI types from .venv/ray-llm, which
`scripts/setup.sh --test` installs). Checked through the official ``openai`` client against wick's
own engine: greedy chat and text completions (streamed and not), embeddings, usage, the prefix cache, wick's
errors with their status, tokenization, and Ray gone after SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray")

from openai import BadRequestError, OpenAI  # noqa: E402

from .conftest import free_port, still_running  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RAY_LLM = ROOT / ".venv" / "ray-llm"  # (scripts/setup.sh --test)
RAY_LLM_SITE = Path(__file__).with_name("ray_llm_site")
MESSAGES = [{"role": "user", "content": "count with me"}]


def ray_llm_env() -> dict[str, str]:
    """This process's environment with Ray Serve LLM's OpenAI types on the path."""
    from tests.conftest import tool_missing

    if not (RAY_LLM / "sglang").is_dir():
        tool_missing("Ray Serve LLM's OpenAI types are not installed (.venv/ray-llm)")
    # (ray_llm_site first: its sitecustomize keeps SGLang's package start-up out of each process)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(RAY_LLM_SITE), str(RAY_LLM), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.fixture(scope="module")
def bert(tmp_path_factory, compiled):
    """The embeddings API test's tiny BERT (the same compile)."""
    from tests.e2e.test_embeddings import _tiny_bert

    src = _tiny_bert(tmp_path_factory.mktemp("bert") / "tiny-bert", "mean", True)
    return compiled(src, "q0f32", prefill_chunk_size=64, max_batch_size=4)


@pytest.fixture(scope="module")
def ray_llm(tiny_a, bert):
    env = ray_llm_env()
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("ray_llm_app.py")),
                             str(port), f"tiny={tiny_a}", f"bert={bert}"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        while line and line.strip() != "ready":
            line = proc.stdout.readline()
        assert line, "the Ray Serve LLM application did not start"
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/v1/models").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.fixture(scope="module")
def engine(tiny_a):
    from wick.server.local import Engine

    return Engine(str(tiny_a))


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def test_models_lists_the_ray_model_ids(ray_llm):
    assert sorted(m.id for m in client(ray_llm[0]).models.list().data) == ["bert", "tiny"]


def test_greedy_chat_equals_wick_engine(ray_llm, engine):
    want = engine.chat.completions.create(messages=MESSAGES, max_tokens=12, temperature=0)
    c = client(ray_llm[0])
    got = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12,
                                    temperature=0)
    assert got.model == "tiny"
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens)

    chunks = list(c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == want.choices[0].message.content
    usage = chunks[-1].usage
    assert usage.completion_tokens == want.usage.completion_tokens
    # the same prompt again: its full pages come from the replica's prefix cache
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_reset_prefix_cache_forgets_cached_pages(ray_llm):
    c = client(ray_llm[0])
    messages = [{"role": "user", "content": "a prompt long enough for a full page or two " * 2}]

    def cached() -> int:
        return c.chat.completions.create(model="tiny", messages=messages, max_tokens=1,
                                         temperature=0).usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0
    r = httpx.post(f"{ray_llm[0]}/reset_prefix_cache", json={"model": "tiny"})
    assert r.status_code == 200, r.text
    assert cached() == 0


def test_greedy_completion_equals_wick_engine(ray_llm, engine):
    want = engine.completions.create(prompt="Once upon a time", max_tokens=10, temperature=0)
    got = client(ray_llm[0]).completions.create(model="tiny", prompt="Once upon a time",
                                                max_tokens=10, temperature=0)
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.completion_tokens == want.usage.completion_tokens


def test_wick_errors_keep_their_status_and_message(ray_llm):
    c = client(ray_llm[0])
    with pytest.raises(BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                  temperature=3)
    assert err.value.status_code == 400
    assert "Invalid value for 'temperature'" in err.value.message
    with pytest.raises(BadRequestError) as err:  # longer than the model's window
        c.completions.create(model="tiny", prompt="word " * 400, max_tokens=4)
    assert err.value.status_code == 400
    assert "context" in err.value.message


def test_embeddings_equal_wick_engine(ray_llm, bert):
    from wick.server.local import Engine

    texts = ["the lighthouse stood on the rocks", "rocks"]
    want = Engine(str(bert)).embeddings.create(input=texts)
    got = client(ray_llm[0]).embeddings.create(model="bert", input=texts)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    for g, w in zip(got.data, want.data, strict=True):
        assert g.embedding == pytest.approx(w.embedding, abs=1e-6)


def test_tokenize_and_detokenize_are_wick_tokenization(ray_llm, engine):
    r = httpx.post(f"{ray_llm[0]}/tokenize", json={"model": "tiny", "prompt": "hello there"})
    assert r.status_code == 200, r.text
    ids = engine.tokenize({"prompt": "hello there"})["tokens"]
    assert r.json()["tokens"] == ids
    r = httpx.post(f"{ray_llm[0]}/detokenize", json={"model": "tiny", "tokens": ids})
    assert r.status_code == 200, r.text
    # (SGLang's reply type names the text "text"; vLLM's and wick's "prompt")
    assert list(r.json().values()) == [engine.detokenize({"tokens": ids})["prompt"]]


PLACEMENT = """
import json
from ray.serve.llm import LLMConfig
from wick.ray import WickServer

def placement(**config):
    try:
        o = WickServer.get_deployment_options(LLMConfig(
            model_loading_config={"model_id": "m"}, server_cls=WickServer, **config))
        return [o["placement_group_bundles"], o["placement_group_strategy"]]
    except ValueError as e:
        return str(e)

print(json.dumps([
    placement(),
    placement(deployment_config={"ray_actor_options": {"num_cpus": 2, "num_gpus": 1}}),
    placement(placement_group_config={"bundles": [{"GPU": 1}, {"CPU": 4}]}),
    placement(placement_group_config={"bundle_per_worker": {"GPU": 1}}),
    placement(deployment_config={"placement_group_bundles": [{"CPU": 1}]}),
]))
"""


def test_placement_is_the_replicas_own_resources():
    """The engine runs in the replica: its bundle is the replica's CPUs and GPUs, added to the
    first of the bundles a config gives; what wick cannot honour is refused."""
    import json

    out = subprocess.run([sys.executable, "-c", PLACEMENT], env=ray_llm_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    default, gpu, given, per_worker, in_deployment = json.loads(out.stdout.splitlines()[-1])
    assert default == [[{"CPU": 1, "GPU": 0}], "STRICT_PACK"]
    assert gpu == [[{"CPU": 2, "GPU": 1}], "STRICT_PACK"]
    assert given == [[{"CPU": 1, "GPU": 1}, {"CPU": 4}], "PACK"]
    assert "bundle_per_worker" in per_worker
    assert "placement_group_config" in in_deployment


def test_sigterm_leaves_no_ray_behind(ray_llm):
    import psutil

    url, proc = ray_llm
    ray_processes = psutil.Process(proc.pid).children(recursive=True)  # GCS, raylet, workers
    assert len(ray_processes) >= 3
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert still_running(ray_processes) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/v1/models", timeout=2)


def test_without_ray_serve_llm_types_the_import_says_what_to_install():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import wick.ray"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "ImportError: wick.ray needs Ray Serve LLM" in r.stderr
    assert "pip install 'ray[serve,llm]==2.60.0'" in r.stderr
