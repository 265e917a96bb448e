"""``wick serve --replicas``: the tiny model on two Ray Serve replicas behind one server (joining
one Ray cluster for the module, started with ``ray start --head``): greedy parity with one
engine, concurrent streams on both replicas, prefix-aware routing (a shared prompt goes where its
pages are cached, a burst of one included), a disconnect aborting the request in its replica, a
killed replica replaced by Ray Serve while the other answers, /health and /metrics per replica,
the API key, and no Ray left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("ray")

from openai import OpenAI  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from wick.server.replicas import Replicas  # noqa: E402
from wick.server.serve import serving_app  # noqa: E402

from .conftest import LiveServer, free_port, still_running  # noqa: E402

KEY = "sk-replicas"
AUTH = {"Authorization": f"Bearer {KEY}"}
# (the tiny model's window is 128 tokens: a system prompt of ~80, three pages of it cacheable)
SYSTEM = "You are a careful assistant for a shipping company: answer in one line, name the port."


@pytest.fixture(scope="module")
def ray_head():
    """A Ray cluster started as a user starts one (`ray start --head`), with Ray's token
    authentication on, for the module's server to join (`--ray-address`); the SIGTERM test
    covers the cluster `wick serve` starts itself. Stopped by its own process (`--block`), not
    by `ray stop`, which kills every Ray process on the machine."""
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
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", "--block"],
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
        yield f"127.0.0.1:{port}"
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
                          replicas=Replicas(fixed=2, address=ray_head))
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
    """`wick serve ARTIFACT --replicas 2` as a user runs it: it answers through its replicas;
    SIGTERM stops the server, the replicas and the Ray cluster it started (every process it
    started is gone), exit status 0."""
    import signal

    import psutil

    from tests.conftest import wick_process_env

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from wick.server.cli import main; sys.exit(main())",
         "serve", str(tiny_a), "--port", str(port), "--replicas", "2", "--no-browser-variants",
         "--ray-app", "sigterm-test"],
        env=wick_process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        encoding="utf-8", errors="replace")
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
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    log = proc.stdout.read()
    assert code == 0, log
    assert "Traceback" not in log
    assert still_running(started) == [], log


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


def test_a_replicas_error_arrives_as_its_own_class():
    """Errors cross from a replica as data; the server raises them as the class the replica
    raised (its handlers read the class), with the replica's fields, and any 503 asks the
    client to retry (Retry-After), a replica's shutdown included."""
    from wick.engine.errors import (ContextLengthExceededError, EngineAbortedError,
                                    WickError)
    from wick.server.model_pool import ServiceUnavailableError
    from wick.server.ray_serve import _error_data, _raise_if_error

    for err in (EngineAbortedError("the engine stopped"),
                ServiceUnavailableError("no model is loaded"),
                ContextLengthExceededError(128, 120, 16, param="prompt")):
        with pytest.raises(WickError) as got:
            _raise_if_error(_error_data(err))
        assert type(got.value) is type(err)
        assert got.value.to_dict() == err.to_dict() and got.value.status == err.status
    _raise_if_error({"choices": []})  # (data that is not an error passes)


def test_every_503_asks_to_retry(tiny_a):
    """Retry-After goes with the status, not the class: an engine's shutdown (503) asks for it
    as a model still loading does."""
    from wick.engine.errors import EngineAbortedError
    from wick.server.app import ModelPool, create_app

    from .conftest import engine_loader

    app = create_app(ModelPool([engine_loader(tiny_a)]))

    @app.get("/__test_503__")
    async def shutting_down():
        raise EngineAbortedError("the engine stopped")

    app.router.routes.insert(0, app.router.routes.pop())  # (before the catch-all routes)
    live = LiveServer(app)
    try:
        live.wait_ready()
        r = httpx.get(f"{live.url}/__test_503__")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "engine_aborted"
    finally:
        live.stop()


def test_health_forgets_replicas_that_are_gone():
    """/health and /metrics read the replicas that report; when none does any more (all gone)
    the model keeps its info and limits with nothing in flight, not the last counts seen."""
    from wick.server.ray_serve import RemoteEngine, ReplicaCore, apply_snapshots

    def snap(running: int, free: int) -> dict:
        return {"info": {"model": "m"}, "running": running, "waiting": 0, "unfinished": running,
                "num_pages": 8, "free_pages": free, "cached_pages": 0, "speculation": {},
                "metrics": {}, "max_batch_size": 4, "max_total_tokens": 128}

    engine = RemoteEngine(None, "m", {"": ReplicaCore(snap(0, 8))})
    engines = {"m": engine}
    apply_snapshots(engines, {"r1": {"m": snap(2, 5)}, "r2": {"m": snap(1, 6)}})
    assert sorted(engine.replicas) == ["r1", "r2"]
    assert (engine.core.snap["running"], engine.core.snap["num_pages"]) == (3, 16)
    apply_snapshots(engines, {"r2": {"m": snap(1, 6)}})  # r1 gone
    assert sorted(engine.replicas) == ["r2"] and engine.core.snap["running"] == 1
    apply_snapshots(engines, {})  # every replica gone
    assert engine.replicas == {}
    idle = engine.core.snap
    assert (idle["running"], idle["num_pages"], idle["max_total_tokens"]) == (0, 0, 128)
    assert idle["info"] == {"model": "m"}


def test_a_replica_whose_engine_failed_its_last_step_is_unhealthy():
    """Ray Serve calls ``check_health`` on each replica: it raises, naming the model and the
    error, while an engine's runner's last call failed (``core.runner_error``), and returns
    once none has."""
    from wick.server.ray_serve import EngineReplica

    good = SimpleNamespace(core=SimpleNamespace(runner_error=None))
    lost = SimpleNamespace(core=SimpleNamespace(runner_error="DeviceError: the GPU was lost"))
    replica = SimpleNamespace(pool=SimpleNamespace(engines={"a": good, "b": lost}))
    with pytest.raises(RuntimeError, match="b: DeviceError: the GPU was lost") as e:
        EngineReplica.check_health(replica)
    assert "a:" not in str(e.value)
    replica.pool.engines["b"] = good
    assert EngineReplica.check_health(replica) is None


def test_health_shows_a_replicas_failed_runner():
    """A replica's snapshot carries its core's ``runner_error``: /health's replica entry shows
    it as ``step_error``, and leaves it out while the runner works."""
    from wick.server.model_pool import engine_health
    from wick.server.ray_serve import ReplicaCore

    snap = {"info": SimpleNamespace(sampling_defaults={}), "running": 0, "waiting": 0,
            "unfinished": 0, "num_pages": 8, "free_pages": 8, "cached_pages": 0,
            "speculation": {}, "metrics": {}, "max_batch_size": 4, "max_total_tokens": 128}
    assert "step_error" not in engine_health(ReplicaCore({**snap, "runner_error": None}))
    lost = engine_health(ReplicaCore({**snap, "runner_error": "DeviceError: the GPU was lost"}))
    assert lost["step_error"] == "DeviceError: the GPU was lost"
    # the model's entry (all replicas combined) shows it whichever replica failed
    both = ReplicaCore.combined([ReplicaCore({**snap, "runner_error": None}),
                                 ReplicaCore({**snap, "runner_error": "DeviceError: lost"})])
    assert engine_health(both)["step_error"] == "DeviceError: lost"


def test_a_flooded_prefix_replica_is_passed_over():
    """A shared prompt goes to the replica holding it, unless that replica has IMBALANCE more
    requests in flight than the least loaded one (then every replica is one rank again)."""
    import asyncio
    from types import SimpleNamespace

    from wick.server.ray_serve import IMBALANCE, PrefixAwareRouter, prompt_digests

    class Router(PrefixAwareRouter):
        queues: dict = {}

        def __init__(self) -> None:  # (Ray's own state is not needed for the choice)
            self.initialize_state()

        @property
        def replica_queue_len_cache(self):
            return SimpleNamespace(get=self.queues.get)

    body = {"messages": [{"role": "system", "content": SYSTEM * 4},
                         {"role": "user", "content": "Where does the ship go?"}]}
    request = SimpleNamespace(args=("m", "chat", body), kwargs={},
                              metadata=SimpleNamespace(call_method="create"))
    assert prompt_digests(body)
    a, b = SimpleNamespace(replica_id="a"), SimpleNamespace(replica_id="b")
    router = Router()
    router.on_request_routed(request, "a", None)

    def choose():
        return asyncio.run(router.choose_replicas([a, b], request))

    assert choose() == [[a], [b]]  # the prefix's replica first
    router.queues = {"a": IMBALANCE, "b": 0}
    assert choose() == [[a], [b]]  # busier, within the margin
    router.queues = {"a": IMBALANCE + 1, "b": 0}
    assert choose() == [[a, b]]  # flooded: least loaded decides


def test_round_robin_takes_the_replicas_in_turn():
    """bench/scale.py's baseline router: each request to the next replica, whatever its
    prompt (the others ranked after it, for when it is full)."""
    import asyncio
    from types import SimpleNamespace

    from wick.server.ray_serve import ROUTERS, RoundRobinRouter

    class Router(RoundRobinRouter):
        def __init__(self) -> None:
            self.initialize_state()

    from wick.server.replicas import ROUTER_NAMES

    assert ROUTERS["round-robin"] is RoundRobinRouter
    assert sorted(ROUTERS) == sorted(ROUTER_NAMES)  # (the CLI's choices)
    a, b, c = (SimpleNamespace(replica_id=n) for n in "abc")
    router = Router()
    firsts = [asyncio.run(router.choose_replicas([c, a, b]))[0] for _ in range(4)]
    assert firsts == [[a], [b], [c], [a]]
    assert asyncio.run(router.choose_replicas([b, a])) == [[a], [b]]  # (turn 4 of 2: a)


def test_replica_gpus_are_placed_per_node_and_per_gpu():
    """A replica's GPUs come from one node, and fractions share a GPU floor(1 / g) to one: the
    cluster's total would let 3 x 0.6 onto 2 GPUs, or 1 x 2 across two 1-GPU nodes, and both
    would wait forever."""
    from wick.server.ray_serve import check_gpus

    check_gpus(Replicas(fixed=4, gpus=0.5), [2.0])
    check_gpus(Replicas(fixed=2, gpus=2), [4.0, 1.0])
    check_gpus(Replicas(fixed=8, gpus=0), [])
    for scaling, nodes in [(Replicas(fixed=3, gpus=0.6), [2.0]),
                           (Replicas(fixed=1, gpus=2), [1.0, 1.0]),
                           (Replicas(low=3, high=5, gpus=1), [2.0])]:
        with pytest.raises(ValueError, match="do not fit"):
            check_gpus(scaling, nodes)
