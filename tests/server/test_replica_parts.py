"""The parts of ``wick serve --replicas`` and ``wick.ray`` that need no Ray cluster: errors crossing
from a replica, /health's account of replicas that come and go or fail, the request routers'
choices, GPU placement, and the Ray Serve LLM server's placement and import error.
(test_replicas.py runs them on a cluster.)"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("ray")

from wick.server.replicas import Replicas  # noqa: E402

from .conftest import SYSTEM, LiveServer, ray_llm_env  # noqa: E402


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


def test_without_ray_serve_llm_types_the_import_says_what_to_install():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import wick.ray"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "ImportError: wick.ray needs Ray Serve LLM" in r.stderr
    assert "pip install 'ray[serve,llm]==2.60.0'" in r.stderr


def test_a_replicas_progress_reaches_the_registry_each_stage_whole():
    """A replica sends each stage's first and completing report and at most one per
    PROGRESS_EVERY_S between (a compile's thousands of steps are not thousands of Ray calls);
    the registry's log reads from a cursor on, keeping the newest EVENTS_KEPT."""
    from wick.server import replica_progress
    from wick.server.replica_progress import ProgressLog, ReplicaProgress

    log = ProgressLog()
    registry = SimpleNamespace(progress=SimpleNamespace(remote=log.add))
    report = ReplicaProgress(registry, "r1", "tiny")
    for done in range(1001):
        report("lower (TVM)", done, 1000)
    report("read", 1, 10)
    report("read", 7, 10)  # (held back: within PROGRESS_EVERY_S of the first)
    report("upload weights", 5, 10)
    events = log.since(0)
    stages = [(e[3], e[4]) for e in events]
    assert stages[0] == ("lower (TVM)", 0) and ("lower (TVM)", 1000) in stages
    # a stage left unfinished shows where it was left, before the next stage begins
    assert stages[-3:] == [("read", 1), ("read", 7), ("upload weights", 5)]
    assert len(events) < 20  # (1,002 reports in well under PROGRESS_EVERY_S)
    assert [e[0] for e in events] == list(range(len(events)))
    assert {(e[1], e[2]) for e in events} == {("r1", "tiny")}
    assert log.since(len(events) - 1) == events[-1:]
    for i in range(replica_progress.EVENTS_KEPT + 5):
        log.add("r2", "tiny", "read", i, 0)
    kept = log.since(0)
    assert len(kept) == replica_progress.EVENTS_KEPT  # the oldest dropped
    assert kept[-1][3:5] == ("read", replica_progress.EVENTS_KEPT + 4)
