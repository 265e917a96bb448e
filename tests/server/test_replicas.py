"""Ray Serve, on one Ray cluster for the module (started as a user starts one: ``ray start
--head``, then ``serve start`` for Serve's HTTP proxy):

- ``wick serve --replicas``: the tiny model on two Ray Serve replicas behind one server joining
  the cluster: greedy parity with one engine, concurrent streams on both replicas, prefix-aware
  routing (a shared prompt goes where its pages are cached, a burst of one included), a
  disconnect aborting the request in its replica, a killed replica replaced by Ray Serve while
  the other answers, /health and /metrics per replica (equal under load), the API key;
- ``wick.ray``: a Ray Serve LLM application (Ray's OpenAI ingress over its ``LLMServer``
  deployments, tests/server/ray_llm_app.py, with Ray Serve LLM's OpenAI types from
  .venv/ray-llm, which ``scripts/setup.sh --test`` installs) with wick as its engine, beside
  them on the same cluster and reached through Serve's proxy with the official ``openai``
  client: greedy chat and text completions (streamed and not), embeddings, usage, the prefix
  cache and its reset, wick's errors with their status, tokenization, and its application gone
  after SIGTERM with the cluster kept;
- and ``wick serve --replicas`` on a cluster of its own, leaving no Ray behind on SIGTERM.

The parts that need no cluster: test_replica_parts.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("ray")

from openai import BadRequestError, OpenAI  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from wick.server.replicas import Replicas  # noqa: E402
from wick.server.serve import serving_app  # noqa: E402

from .conftest import SYSTEM, LiveServer, free_port, ray_llm_env, still_running  # noqa: E402

KEY = "sk-replicas"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def ray_head():
    """A Ray cluster started as a user starts one (`ray start --head`, then `serve start` for
    Serve's HTTP proxy, which the Ray Serve LLM application answers on), with Ray's token
    authentication on, for the module's server to join (`--ray-address`) and the Ray Serve LLM
    application to run on; the SIGTERM test covers the cluster `wick serve` starts itself.
    Stopped by its own process (`--block`), not by `ray stop`, which kills every Ray process on
    the machine."""
    from ray._private.authentication.authentication_token_setup import (
        _get_default_token_path, generate_and_save_token)
    from ray._common.utils import reset_ray_address
    from ray._private.utils import read_ray_address

    if not _get_default_token_path().exists():  # (as a local ray.init() makes it)
        generate_and_save_token()
    mode = os.environ.get("RAY_AUTH_MODE")  # (the join sets it for this process)
    port = free_port()
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
         # (wick's replicas take no CPU; the Ray LLM app's ingress and servers 1 each)
         "--num-cpus=4", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        # (no drain at SIGTERM: with Serve's controller left on it, the node waited out
        # Ray's 30 s drain for rolling upgrades before it stopped)
        env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (read_ray_address() or "").endswith(f":{port}"):  # (written once it runs)
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.2)
        address, http_port = f"127.0.0.1:{port}", free_port()
        subprocess.run(
            [sys.executable, "-m", "ray.serve.scripts", "start", f"--address={address}",
             "--http-host=127.0.0.1", f"--http-port={http_port}", "--proxy-location=HeadOnly"],
            env={**os.environ, "RAY_AUTH_MODE": "token"}, check=True, timeout=120,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield SimpleNamespace(address=address, http=f"http://127.0.0.1:{http_port}")
    finally:
        head.terminate()
        head.wait(timeout=60)
        if (read_ray_address() or "").endswith(f":{port}"):  # (ray.init() must not find it)
            reset_ray_address()
        if mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = mode


@pytest.fixture(scope="module")
def replicated(tiny_a, ray_head):
    import ray
    from ray import serve

    from wick.server.ray_serve import NAMESPACE

    try:
        app = serving_app([str(tiny_a)], api_key=KEY, browser_variants=False,
                          replicas=Replicas(fixed=2, address=ray_head.address))
        live = LiveServer(app)
        live.wait_ready(timeout=300)
        deadline = time.monotonic() + 60  # (both replicas' first reports)
        while len(live.pool.replicas()) < 2:
            assert time.monotonic() < deadline, live.pool.replicas()
            time.sleep(0.2)
        yield live
        live.stop()
        # the cluster it joined stays, without its application or the claim on the name
        assert ray.is_initialized() and ray.nodes()[0]["Alive"]
        assert "wick" not in serve.status().applications
        gone_or_fail(lambda: ray.get_actor(Replicas(app="wick").registry, namespace=NAMESPACE))
    finally:
        ray.shutdown()  # (before the cluster stops under this process's connection)


def gone_or_fail(lookup, timeout: float = 30) -> None:
    """Wait until ``lookup()`` raises ValueError (Ray: no such named actor)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lookup()
        except ValueError:
            return
        assert time.monotonic() < deadline, "the named actor outlived its server"
        time.sleep(0.2)


def client(live) -> OpenAI:
    return OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)


def settled_health(live) -> dict:
    time.sleep(1.5)  # (replicas report every 0.5 s)
    return httpx.get(f"{live.url}/health").json()


def test_wick_serve_leaves_no_ray_behind_on_sigterm(tiny_a):
    """`wick serve ARTIFACT --replicas 2` as a user runs it: its replicas' loading is shown as
    its own (their progress lines), it answers through them; SIGTERM to its whole process
    group, as systemd sends it to a service's processes, stops the server, the replicas and the
    Ray cluster it started in order (every process it started is gone), exit status 0."""

    import psutil

    from tests.conftest import wick_process_env

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from wick.server.cli import main; sys.exit(main())",
         "serve", str(tiny_a), "--port", str(port), "--replicas", "2", "--no-browser-variants",
         "--ray-app", "sigterm-test"],
        env=wick_process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        encoding="utf-8", errors="replace", start_new_session=True)
    started: list = []
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            try:
                health = httpx.get(f"{url}/health", timeout=5)
                if health.status_code == 200 and len(health.json().get("replicas", {})) == 2:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"prompt": "hello", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        started = psutil.Process(proc.pid).children(recursive=True)  # GCS, raylet, replicas
        names = " ".join(" ".join(p.cmdline()) for p in started)
        assert "gcs_server" in names and "raylet" in names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # (the server and every Ray process it started)
        code = proc.wait(timeout=120)
    log = proc.stdout.read()
    assert code == 0, log
    assert "Traceback" not in log and "GCS" not in log, log
    # quiet but for wick's own lines: none of Ray's start-up notices, Serve's INFO lines or the
    # raylet's complaints of calls cut off at the stop
    assert not [line for line in log.splitlines() if any(
        noise in line for noise in ("SIGTERM handler", "Token authentication", "Started Serve",
                                    "Deleting app", "(raylet)"))], log
    assert still_running(started) == [], log
    # (the tiny artifact compiles nothing: its weights' upload is the replicas' long work)
    assert "upload weights: " in log, log


def test_greedy_parity_with_one_engine(replicated, tiny_a):
    from wick.server.local import Engine

    want = Engine(str(tiny_a)).chat.completions.create(
        messages=[{"role": "user", "content": "count with me"}], max_tokens=12,
        temperature=0).choices[0].message.content
    c = client(replicated)
    model = c.models.list().data[0].id
    for _ in range(2):
        got = c.chat.completions.create(model=model, messages=[
            {"role": "user", "content": "count with me"}], max_tokens=12, temperature=0)
        assert got.choices[0].message.content == want


def test_concurrent_streams_complete_on_both_replicas(replicated):
    c = client(replicated)
    model = c.models.list().data[0].id

    def stream(i: int) -> tuple[int, str]:
        chunks = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"request {i}: a new topic"}],
            max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
        text, usage = "", None
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
        return usage.completion_tokens, text

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(stream, range(32)))
    assert all(n == 8 for n, _ in results)
    health = settled_health(replicated)
    served = {r: next(iter(models.values())) for r, models in health["replicas"].items()}
    assert len(served) == 2
    families = metric_families(replicated)
    prompts = {s.labels["replica"]: s.value for s in families["wick:prompt_tokens"].samples
               if s.name.endswith("_total")}
    assert len(prompts) == 2 and all(v > 0 for v in prompts.values()), prompts
    for replica, state in served.items():  # idle again: every page free or cached
        assert state["kv_pages_free"] + state["kv_pages_cached"] == state["kv_pages"], replica
    # /metrics says what /health says of each replica (cached pages: not counted as used)
    usage, running, waiting = ({s.labels["replica"]: s.value for s in families[name].samples}
                               for name in ("wick:kv_cache_usage_perc",
                                            "wick:num_requests_running",
                                            "wick:num_requests_waiting"))
    assert set(usage) == set(running) == set(waiting) == set(served)
    for replica, state in served.items():
        held = state["kv_pages"] - state["kv_pages_free"] - state["kv_pages_cached"]
        assert usage[replica] == held / state["kv_pages"] == 0
        assert running[replica] + waiting[replica] == state["requests"] == 0
    assert all(state["kv_pages_cached"] > 0 for state in served.values())


def test_metrics_say_what_health_says_under_load(replicated):
    """While 24 long streams run on both replicas, /metrics' per-replica gauges equal /health's
    counts of the same replicas' snapshots: requests running and waiting, and KV held (pages
    neither free nor cached) over all pages. (Replicas report every 0.5 s: a /metrics read
    between two equal /health reads saw the snapshots they saw.)"""
    model = client(replicated).models.list().data[0].id
    body = {"model": model, "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": 100, "ignore_eos": True, "stream": True, "temperature": 0}

    def stream(_: int) -> None:
        with httpx.stream("POST", f"{replicated.url}/v1/chat/completions", headers=AUTH,
                          json=body, timeout=120) as r:
            assert r.status_code == 200
            for _line in r.iter_lines():
                pass

    def replicas_state() -> dict:
        return {r: next(iter(m.values())) for r, m in
                httpx.get(f"{replicated.url}/health").json()["replicas"].items()}

    checked = []
    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(stream, i) for i in range(24)]
        deadline = time.monotonic() + 60
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            before, families, after = replicas_state(), metric_families(replicated), \
                replicas_state()
            if before != after or not any(st["requests"] for st in before.values()):
                time.sleep(0.05)
                continue  # (a report landed between the reads, or nothing is running)
            gauges = {name: {s.labels["replica"]: s.value for s in families[name].samples}
                      for name in ("wick:num_requests_running", "wick:num_requests_waiting",
                                   "wick:kv_cache_usage_perc")}
            for replica, st in before.items():
                held = st["kv_pages"] - st["kv_pages_free"] - st["kv_pages_cached"]
                assert gauges["wick:kv_cache_usage_perc"][replica] == pytest.approx(
                    held / st["kv_pages"])
                assert gauges["wick:num_requests_running"][replica] + \
                    gauges["wick:num_requests_waiting"][replica] == st["requests"]
            checked.append(sum(st["requests"] for st in before.values()))
            time.sleep(0.1)
        for f in futures:
            f.result(timeout=120)
    assert checked and max(checked) > 1, checked


def test_shared_prefix_stays_on_one_replica(replicated):
    c = client(replicated)
    model = c.models.list().data[0].id
    cached = []
    for i in range(4):
        r = c.chat.completions.create(model=model, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"order {i}?"}],
            max_tokens=2, temperature=0)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    # the first computes the system prompt's pages; every later one finds them on its replica
    assert cached[0] == 0 or cached[0] is None
    assert all(n and n >= 48 for n in cached[1:]), cached


def test_a_burst_of_one_new_prefix_goes_to_one_replica(replicated):
    """Requests with a system prompt no replica has seen, sent at once, all go to the replica
    the first was sent to (routing claims a prompt when it chooses, before the first is
    computed), and a later one finds the prompt cached there."""
    c = client(replicated)
    model = c.models.list().data[0].id
    system = "You answer questions about trains for a railway timetable desk, in one short line."

    def ask(i: int):
        return c.chat.completions.create(model=model, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": f"train {i}?"}],
            max_tokens=2, temperature=0)

    time.sleep(1.0)  # (the earlier tests' counts reported: two report cycles)
    before = prompt_tokens_by_replica(replicated)
    with ThreadPoolExecutor(6) as pool:
        burst = list(pool.map(ask, range(6)))
    sent = sum(r.usage.prompt_tokens for r in burst)
    deadline = time.monotonic() + 15
    while True:  # (until every replica's counter has caught up with the burst)
        grew = {r: n - before.get(r, 0) for r, n in prompt_tokens_by_replica(replicated).items()}
        if sum(grew.values()) >= sent or time.monotonic() > deadline:
            break
    assert sorted(grew.values()) == [0, sent], grew
    later = ask(6).usage.prompt_tokens_details.cached_tokens
    assert later and later >= 48, later


def prompt_tokens_by_replica(live) -> dict[str, float]:
    time.sleep(0.6)  # (replicas report every 0.5 s, the server reads them as often)
    return {s.labels["replica"]: s.value
            for s in metric_families(live)["wick:prompt_tokens"].samples
            if s.name.endswith("_total")}


def test_chat_page_and_artifact_host_through_the_replicas(replicated, tiny_a):
    """The chat page, the browser engine's model index and the served artifact's files are
    there as on a single server (the replicas' artifact is on this machine)."""
    import hashlib
    import json

    page = httpx.get(f"{replicated.url}/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    index = httpx.get(f"{replicated.url}/web/models.json", headers=AUTH).json()
    assert index["served"] == list(replicated.pool.engines) and not index["loading"]
    entry = next(e for e in index["data"] if e["id"] == tiny_a.name)
    manifest = json.loads((tiny_a / "wick-artifact.json").read_text())
    assert entry["model"] == manifest["model_id"] and entry["quantization"] == "q0f32"
    shard = manifest["shards"][0]
    got = httpx.get(f"{replicated.url}/artifacts/{tiny_a.name}/{shard['file']}", headers=AUTH)
    assert got.status_code == 200
    assert hashlib.sha256(got.content).hexdigest() == shard["sha256"]


def test_disconnect_aborts_in_the_replica(replicated):
    c = client(replicated)
    model = c.models.list().data[0].id
    before = abort_count(replicated)
    with httpx.stream("POST", f"{replicated.url}/v1/chat/completions", headers=AUTH, json={
            "model": model, "messages": [{"role": "user", "content": "go on and on"}],
            "max_tokens": 80, "ignore_eos": True, "stream": True, "temperature": 0}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    deadline = time.monotonic() + 30
    while abort_count(replicated) <= before:
        assert time.monotonic() < deadline, "the replica did not abort the request"
        time.sleep(0.3)
    health = settled_health(replicated)
    for models in health["replicas"].values():
        state = next(iter(models.values()))
        assert state["requests"] == 0
        assert state["kv_pages_free"] + state["kv_pages_cached"] == state["kv_pages"]


def test_errors_and_api_key_through_the_router(replicated):
    r = httpx.post(f"{replicated.url}/v1/chat/completions", json={"messages": HELLO_BAD})
    assert r.status_code == 401
    r = httpx.post(f"{replicated.url}/v1/chat/completions", headers=AUTH,
                   json={"messages": [{"role": "user", "content": "hi"}], "temperature": 7})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "temperature" and err["type"] == "invalid_request_error"
    r = httpx.post(f"{replicated.url}/tokenize", headers=AUTH, json={"prompt": "hello"})
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 0


HELLO_BAD = [{"role": "user", "content": "no key"}]


def test_a_second_server_on_the_cluster_needs_its_own_app_name(replicated, tiny_a):
    """Another `wick serve --replicas` on the same cluster under the same application name is
    refused before it deploys anything (serve.run would have replaced the first server's
    replicas), as is asking for more GPUs than the cluster has; the first server's application
    stays and answers, and a second name's claim is given back when its server closes."""
    import asyncio

    import ray
    from ray import serve

    from wick.server.ray_serve import NAMESPACE, ReplicaPool, ReplicaRegistry

    assert ray.is_initialized()  # (the first server's cluster: the second joins it)
    too_many = ray.cluster_resources().get("GPU", 0) + 1
    for scaling, needle in [(Replicas(fixed=1), "--ray-app NAME"),
                            (Replicas(fixed=1, app="gpu", gpus=too_many), "do not fit")]:
        pool = ReplicaPool(models=[str(tiny_a)], engine_options={}, scaling=scaling)
        with pytest.raises(ValueError, match=needle):
            pool._deploy()
        assert pool._registry is None  # (refused before any claim: the first's is not its own)
        asyncio.run(pool.aclose())
        assert "wick" in serve.status().applications
        ray.get_actor(Replicas(app="wick").registry, namespace=NAMESPACE)  # (the first's claim)
    # a name claimed, then refused before its deploy (as when an application of a server that
    # died holds it): closing the pool frees the claim and deletes no application
    other = Replicas(fixed=1, app="other")
    pool = ReplicaPool(models=[str(tiny_a)], engine_options={}, scaling=other)
    pool._registry = ReplicaRegistry.options(name=other.registry, namespace=NAMESPACE).remote()
    asyncio.run(pool.aclose())
    gone_or_fail(lambda: ray.get_actor(other.registry, namespace=NAMESPACE))
    c = client(replicated)
    got = c.completions.create(model=c.models.list().data[0].id, prompt="still here",
                               max_tokens=2, temperature=0)
    assert got.usage.completion_tokens == 2
    assert "wick" in serve.status().applications


def test_a_killed_replica_is_replaced_and_requests_go_on(replicated):
    """A replica's process dies (its Ray actor killed, as a crash or an OOM kill does): the
    requests sent meanwhile are answered by the other replica, Ray Serve starts a replacement,
    and /health and /metrics follow: the dead replica leaves them, the new one joins them and
    serves."""
    import ray

    before = set(settled_health(replicated)["replicas"])
    actors = {a["name"]: a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
              if a["name"].startswith("SERVE_REPLICA::wick#engines#")}
    assert {name.rsplit("#", 1)[1] for name in actors} == before, (actors, before)
    victim = sorted(actors)[0]
    dead = victim.rsplit("#", 1)[1]
    ray.kill(ray.get_actor(victim, namespace=actors[victim]), no_restart=True)
    c = client(replicated)
    model = c.models.list().data[0].id
    for i in range(6):
        got = c.completions.create(model=model, prompt=f"after the crash {i}", max_tokens=2,
                                   temperature=0)
        assert got.usage.completion_tokens == 2
    deadline = time.monotonic() + 180
    while True:
        now = set(settled_health(replicated)["replicas"])
        if len(now) == 2 and dead not in now:
            break
        assert time.monotonic() < deadline, now
    new = (now - before).pop()
    assert now == before - {dead} | {new}
    assert set(prompt_tokens_by_replica(replicated)) <= now
    deadline = time.monotonic() + 30
    while prompt_tokens_by_replica(replicated).get(new, 0) == 0:  # the new one takes its share
        assert time.monotonic() < deadline, "the new replica served nothing"
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: c.completions.create(
                model=model, prompt=f"a new replica's topic {i}", max_tokens=2,
                temperature=0), range(16)))


def metric_families(live) -> dict:
    text = httpx.get(f"{live.url}/metrics", headers=AUTH).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def abort_count(live) -> float:
    time.sleep(0.6)
    fam = metric_families(live)["wick:request_success"]
    return sum(s.value for s in fam.samples
               if s.name.endswith("_total") and s.labels["finished_reason"] == "abort")


# ------------------------------------------------ wick.ray: a Ray Serve LLM app on the cluster
LLM_APP = "ray-llm"
MESSAGES = [{"role": "user", "content": "count with me"}]


@pytest.fixture(scope="module")
def bert(tmp_path_factory, compiled):
    """The embeddings API test's tiny BERT (the same compile)."""
    from tests.e2e.test_embeddings import _tiny_bert

    src = _tiny_bert(tmp_path_factory.mktemp("bert") / "tiny-bert", "mean", True)
    return compiled(src, "q0f32", prefill_chunk_size=64, max_batch_size=4)


@pytest.fixture(scope="module")
def ray_llm(tiny_a, bert, ray_head):
    """The application's process, once its routes answer on the cluster's Serve proxy."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("ray_llm_app.py")), ray_head.address,
         LLM_APP, f"tiny={tiny_a}", f"bert={bert}"],
        env={**ray_llm_env(), "RAY_AUTH_MODE": "token"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        ready = ThreadPoolExecutor(1).submit(
            lambda: any(line.strip() == "ready" for line in proc.stdout))
        assert ready.result(timeout=300), "the Ray Serve LLM application did not start"
        deadline = time.monotonic() + 120
        while httpx.get(f"{ray_head.http}/v1/models").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield SimpleNamespace(url=ray_head.http, proc=proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.fixture(scope="module")
def tiny_engine(tiny_a):
    from wick.server.local import Engine

    return Engine(str(tiny_a))


def llm_client(ray_llm) -> OpenAI:
    return OpenAI(base_url=f"{ray_llm.url}/v1", api_key="none", max_retries=0)


def test_ray_llm_lists_its_model_ids(ray_llm):
    assert sorted(m.id for m in llm_client(ray_llm).models.list().data) == ["bert", "tiny"]


def test_ray_llm_greedy_chat_equals_wick_engine(ray_llm, tiny_engine):
    want = tiny_engine.chat.completions.create(messages=MESSAGES, max_tokens=12, temperature=0)
    c = llm_client(ray_llm)
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


def test_ray_llm_reset_prefix_cache_forgets_cached_pages(ray_llm):
    c = llm_client(ray_llm)
    messages = [{"role": "user", "content": "a prompt long enough for a full page or two " * 2}]

    def cached() -> int:
        return c.chat.completions.create(model="tiny", messages=messages, max_tokens=1,
                                         temperature=0).usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0
    r = httpx.post(f"{ray_llm.url}/reset_prefix_cache", json={"model": "tiny"})
    assert r.status_code == 200, r.text
    assert cached() == 0


def test_ray_llm_greedy_completion_equals_wick_engine(ray_llm, tiny_engine):
    want = tiny_engine.completions.create(prompt="Once upon a time", max_tokens=10, temperature=0)
    got = llm_client(ray_llm).completions.create(model="tiny", prompt="Once upon a time",
                                                 max_tokens=10, temperature=0)
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.completion_tokens == want.usage.completion_tokens


def test_ray_llm_keeps_wick_errors_status_and_message(ray_llm):
    c = llm_client(ray_llm)
    with pytest.raises(BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                  temperature=3)
    assert err.value.status_code == 400
    assert "Invalid value for 'temperature'" in err.value.message
    with pytest.raises(BadRequestError) as err:  # longer than the model's window
        c.completions.create(model="tiny", prompt="word " * 400, max_tokens=4)
    assert err.value.status_code == 400
    assert "context" in err.value.message


def test_ray_llm_embeddings_equal_wick_engine(ray_llm, bert):
    from wick.server.local import Engine

    texts = ["the lighthouse stood on the rocks", "rocks"]
    want = Engine(str(bert)).embeddings.create(input=texts)
    got = llm_client(ray_llm).embeddings.create(model="bert", input=texts)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    for g, w in zip(got.data, want.data, strict=True):
        assert g.embedding == pytest.approx(w.embedding, abs=1e-6)


def test_ray_llm_tokenize_and_detokenize_are_wick_tokenization(ray_llm, tiny_engine):
    r = httpx.post(f"{ray_llm.url}/tokenize", json={"model": "tiny", "prompt": "hello there"})
    assert r.status_code == 200, r.text
    ids = tiny_engine.tokenize({"prompt": "hello there"})["tokens"]
    assert r.json()["tokens"] == ids
    r = httpx.post(f"{ray_llm.url}/detokenize", json={"model": "tiny", "tokens": ids})
    assert r.status_code == 200, r.text
    # (SGLang's reply type names the text "text"; vLLM's and wick's "prompt")
    assert list(r.json().values()) == [tiny_engine.detokenize({"tokens": ids})["prompt"]]


def test_ray_llm_app_leaves_the_cluster_on_sigterm(ray_llm, replicated):
    """SIGTERM deletes the application and disconnects: its routes are gone from Serve's proxy,
    its replicas' processes end, and the cluster and the wick server beside it go on. (It ends
    the module's application: the last of its tests.)"""
    import psutil
    import ray
    from ray import serve

    assert ray.is_initialized()  # (the wick server's connection to the cluster)
    assert LLM_APP in serve.status().applications
    servers = [p for p in psutil.process_iter(["cmdline"])
               if "ServeReplica:ray-llm:" in " ".join(p.info["cmdline"] or [])]
    assert len(servers) >= 3  # (the ingress and one server per model)
    ray_llm.proc.send_signal(signal.SIGTERM)
    assert ray_llm.proc.wait(timeout=60) == 0
    assert LLM_APP not in serve.status().applications
    assert still_running(servers) == []
    assert httpx.get(f"{ray_llm.url}/v1/models", timeout=5).status_code == 404
    r = httpx.post(f"{replicated.url}/v1/completions", headers=AUTH, timeout=60,
                   json={"prompt": "hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
