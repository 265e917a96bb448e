"""``wick serve MODEL --replicas N``: the engines as replicas of a Ray Serve deployment (#32).

The ``wick serve`` process keeps the HTTP side, the same app as a single server (OpenAI
routes, chat page, artifact host, errors, ``--api-key``: pyserver/app.py and routes.py), and
reaches the engines through a Ray Serve deployment handle instead of in-process:

* ``EngineReplica`` (the deployment, N replicas or autoscaled between bounds) loads the models
  like a single server does and answers ``create``/``embed``/``tokens`` calls; a streamed
  completion is an async generator of chunk dicts, an error is data (its class, status and
  OpenAI fields), so nothing of wick's errors is lost in Ray's exception wrapping. Closing the
  stream on the caller's side (a client that disconnects) cancels the replica's generator, which
  aborts the engine request.
* ``PrefixAwareRouter`` is the deployment's request router (Ray Serve's extension point, run
  inside the handle): a request goes to the replica that was sent the longest leading part of
  its prompt before, where that part is in its prefix cache (blocks of the prompt's text,
  chained digests, as the engine's page digests are chained); with no such replica, to the
  least loaded (Ray probes the queue lengths of one rank).
* Each replica reports a snapshot (requests, KV pages, metrics) to a named actor every
  ``REPORT_S``; ``/health`` lists the replicas and ``/metrics`` labels each replica's numbers
  with ``replica`` (pyserver/metrics.py).

Ray is an optional dependency (``pip install 'wick-llm[ray]'``); this module imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
import random
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import ray
from ray import serve
from ray.serve.request_router import RequestRouter

from ..engine.errors import WickError
from .model_pool import ModelPool
from .replica_progress import ProgressLog, ReplicaProgress, relay_progress

log = logging.getLogger("wick")

NAMESPACE = "wick"  # the Ray namespace of every wick application's actors
REPORT_S = 0.5  # how often a replica reports its snapshot
STALE_S = 10.0  # a replica silent this long is left out of /health and /metrics
BLOCK_CHARS = 64  # prefix-routing granularity (characters of the prompt's text)
MAX_BLOCKS_PER_REPLICA = 100_000  # digests remembered per replica (oldest forgotten first)
# requests a replica may have in flight beyond the least loaded one's and still be chosen for
# a shared prefix (past it, a flood of one shared prompt spreads: a recompute beats a queue)
IMBALANCE = 8


# ----------------------------------------------------------------------------- routing


def prompt_digests(body: Any) -> list[bytes]:
    """Chained digests of the prompt's text in blocks of BLOCK_CHARS (whole blocks only): two
    requests share the first k digests exactly when their first k blocks are equal."""
    if not isinstance(body, dict):
        return []
    if isinstance(body.get("messages"), list):
        text = "".join(f"<{m.get('role')}>{m.get('content')}" if isinstance(m, dict) else str(m)
                       for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    digests, h = [], b""
    for i in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS):
        h = hashlib.blake2b(h + text[i:i + BLOCK_CHARS].encode(), digest_size=12).digest()
        digests.append(h)
    return digests


def _request_body(pending_request) -> Any:
    """The body of a ``create(model, api, body)`` call (None for other calls)."""
    if pending_request is None or len(pending_request.args) < 3 or \
            getattr(pending_request.metadata, "call_method", "create") != "create":
        return None
    return pending_request.args[2]


class PrefixAwareRouter(RequestRouter):
    """The replica holding the longest share of the prompt, unless it is IMBALANCE requests
    busier than the least loaded; else the least loaded. (Not FIFO:
    Ray's FIFOMixin hands a replica chosen for one request to the oldest one waiting, which
    would send a prompt to another prompt's replica under load.)

    A prompt's blocks are claimed for a replica when it is chosen, not when Ray reports the
    request routed: requests with one new system prompt that arrive together (a burst after a
    deploy, a client's parallel calls) then all follow the first to one replica, where
    claiming at ``on_request_routed`` let each find no owner and spread them over all."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._held: dict[Any, OrderedDict[bytes, None]] = {}

    def _matched(self, replica_id: Any, digests: list[bytes]) -> int:
        held = self._held.get(replica_id)
        n = 0
        while held is not None and n < len(digests) and digests[n] in held:
            n += 1
        return n

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        candidates = list(candidate_replicas)
        digests = prompt_digests(_request_body(pending_request))
        if not digests or not candidates:
            return [candidates]  # one rank: Ray picks the shorter queue of two in it
        best, best_n = None, 0
        for replica in candidates:
            n = self._matched(replica.replica_id, digests)
            if n > best_n:
                best, best_n = replica, n
        if best is not None and self._overloaded(best, candidates):
            return [candidates]  # (not claimed: on_request_routed records where it went)
        if best is None:
            best = self._least_loaded(candidates)
        self._claim(best.replica_id, digests)
        return [[best], [r for r in candidates if r is not best]]

    def _least_loaded(self, candidates):
        """The candidate with the fewest requests in flight as far as the router's cache of
        queue lengths knows (unknown: 0), then the one holding the fewest prompt blocks (new
        prefixes spread), then any."""
        queues = self.replica_queue_len_cache
        return min(candidates, key=lambda r: (queues.get(r.replica_id) or 0,
                                              len(self._held.get(r.replica_id, ())),
                                              random.random()))

    def _overloaded(self, best, candidates) -> bool:
        """Whether ``best`` has IMBALANCE more requests in flight than the least loaded
        candidate (as far as the router's cache of queue lengths knows)."""
        queues = self.replica_queue_len_cache
        mine = queues.get(best.replica_id)
        known = [n for n in (queues.get(r.replica_id) for r in candidates) if n is not None]
        return mine is not None and mine - min(known) > IMBALANCE

    def _claim(self, replica_id: Any, digests: list[bytes]) -> None:
        held = self._held.setdefault(replica_id, OrderedDict())
        for d in digests:
            held[d] = None
            held.move_to_end(d)
        while len(held) > MAX_BLOCKS_PER_REPLICA:
            held.popitem(last=False)

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        # (where it went: the chosen replica, or another if that one was full or the choice
        # was left to Ray)
        self._claim(replica_id, prompt_digests(_request_body(pending_request)))

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in [r for r in self._held if r not in live]:  # (scaled down)
            del self._held[gone]

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._held.pop(replica_id, None)


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in turn, whatever its prompt or their queues
    (``--replica-router round-robin``: the baseline bench/scale.py measures routing against)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._turn = 0

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        ordered = sorted(candidate_replicas, key=lambda r: str(r.replica_id))
        if not ordered:
            return []
        first = ordered[self._turn % len(ordered)]
        self._turn += 1
        return [[first], [r for r in ordered if r is not first]]  # (if it is full: the others)


# by replicas.ROUTER_NAMES (tested to match; replicas.py imports this module, not the reverse)
ROUTERS = {"prefix": PrefixAwareRouter, "round-robin": RoundRobinRouter,
           "least-loaded": None}  # (None: Ray Serve's own, power of two choices)


# ----------------------------------------------------------------------------- replicas


@ray.remote(num_cpus=0)
class ReplicaRegistry:
    """Each replica's latest snapshot (a named actor: the replicas write, the server reads)."""

    def __init__(self) -> None:
        self._snapshots: dict[str, tuple[float, dict]] = {}
        self._progress = ProgressLog()  # (the replicas' long work while they load)

    def put(self, replica: str, snapshot: dict) -> None:
        self._snapshots[replica] = (time.time(), snapshot)

    def remove(self, replica: str) -> None:
        self._snapshots.pop(replica, None)

    def snapshots(self) -> dict[str, dict]:
        now = time.time()
        return {r: s for r, (t, s) in self._snapshots.items() if now - t < STALE_S}

    def progress(self, replica: str, model: str, stage: str, done: int, total: int) -> None:
        self._progress.add(replica, model, stage, done, total)

    def progress_since(self, cursor: int) -> list[tuple]:
        return self._progress.since(cursor)


def _error_data(e: WickError) -> dict:
    return {"__wick_error__": {"message": e.message, "type": e.type, "param": e.param,
                               "code": e.code, "status": e.status, "class": type(e).__name__}}


def _error_classes(cls: type = WickError) -> dict[str, type]:
    """WickError and its subclasses, by name (those imported in this process)."""
    found = {cls.__name__: cls}
    for sub in cls.__subclasses__():
        found.update(_error_classes(sub))
    return found


def _raise_if_error(data: Any) -> None:
    """Raise the replica's error as the same class here (the server's handlers read the class:
    a 503's Retry-After, a 401's WWW-Authenticate), with its fields as the replica set them."""
    if isinstance(data, dict) and "__wick_error__" in data:
        e = data["__wick_error__"]
        cls = _error_classes().get(e.get("class"), WickError)
        err = cls.__new__(cls)  # (a subclass's own __init__ may take other arguments)
        WickError.__init__(err, e["message"], param=e["param"], code=e["code"], type=e["type"],
                           status=e["status"])
        raise err


def core_snapshot(core) -> dict:
    """What /health and /metrics read of an engine core, as plain data (copied on the
    engine's own thread's terms: a counter may move while it is read, as in one server)."""
    running, waiting = core.requests_by_state()
    metrics = core.metrics
    for _ in range(3):  # (a dict the engine grows meanwhile: copy again)
        try:
            metrics = copy.deepcopy(core.metrics)
            break
        except RuntimeError:
            continue
    return {"info": core.info, "running": running, "waiting": waiting,
            "unfinished": core.num_unfinished(), "num_pages": core.kv.num_pages,
            "free_pages": core.kv.free_pages, "cached_pages": core.kv.cached_pages,
            "speculation": core.stats.speculation(), "metrics": metrics,
            "max_batch_size": core.scheduler.max_batch_size,
            "max_total_tokens": core.max_total_tokens, "runner_error": core.runner_error}


def raise_if_failing(engines: dict) -> None:
    """RuntimeError naming each engine (by model) whose runner's last call failed
    (``EngineCore.runner_error``)."""
    failing = {name: e.core.runner_error for name, e in engines.items()
               if e.core.runner_error is not None}
    if failing:
        raise RuntimeError("the wick engine's last step failed: " + "; ".join(
            f"{name}: {error}" for name, error in failing.items()))


def engine_snapshot(engine) -> dict:
    """core_snapshot, and where the engine's artifact is and what it runs on."""
    return {**core_snapshot(engine.core), "artifact_dir": str(engine.artifact_dir),
            "device_name": getattr(engine, "device_name", "?")}


class EngineReplica:
    """One replica: the served models' engines, named as a single server names them."""

    def __init__(self, models: list[str], engine_options: dict, registry: str) -> None:
        from .model_pool import ModelPool
        from .local import AsyncEngine

        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self._registry = ray.get_actor(registry, namespace=NAMESPACE)
        # (a compile or download here is drawn by the server that waits for this replica)
        self.pool = ModelPool.of(*[
            AsyncEngine(m, progress=ReplicaProgress(self._registry, self.replica, m),
                        **engine_options) for m in models])
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="wick-report", daemon=True).start()

    def _report(self) -> None:
        while not self._stop.wait(REPORT_S):
            try:
                snapshot = {name: engine_snapshot(e) for name, e in self.pool.engines.items()}
                ray.get(self._registry.put.remote(self.replica, snapshot))
            except Exception as e:  # noqa: BLE001 - reported, then tried again
                log.warning("replica %s could not report: %s", self.replica, e)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # (None: the constructor failed)
        if stop is not None:
            stop.set()

    async def info(self) -> dict:
        return {name: engine_snapshot(e) for name, e in self.pool.engines.items()}

    def check_health(self) -> None:
        """Ray Serve's health check (every ``health_check_period_s``): a replica whose engine's
        last step failed, with none run since (a lost device stays lost), raises, and Ray puts
        a new replica in its place."""
        raise_if_failing(self.pool.engines)

    async def create(self, model: str, api: str, body: dict) -> AsyncIterator[dict]:
        """A completion's chunks (stream) or its one reply, as dicts; an error as data."""
        try:
            engine = self.pool.select(model)
            endpoint = engine.chat.completions if api == "chat" else engine.completions
            result = await endpoint.create(**body)
        except WickError as e:
            yield _error_data(e)
            return
        if body.get("stream") is not True:
            yield result.to_dict()
            return
        try:
            async for chunk in result:
                yield chunk.to_dict()
        except WickError as e:
            yield _error_data(e)
        finally:
            await result.aclose()  # (cancelled: the client left; the request is aborted)

    async def embed(self, model: str, body: dict) -> dict:
        try:
            return (await self.pool.select(model).embeddings.create(**body)).to_dict()
        except WickError as e:
            return _error_data(e)

    async def tokens(self, model: str, work: str, body: Any) -> dict:
        try:
            engine = self.pool.select(model)
            fn = engine.tokenize if work == "tokenize" else engine.detokenize
            return await engine.prepare_off_loop(lambda: fn(body))
        except WickError as e:
            return _error_data(e)


# ----------------------------------------------------------------------------- the server's side


class _Data:
    """A reply dict read like the engine's protocol objects (missing fields are None)."""

    def __init__(self, data: Any) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        value = self._data.get(name) if isinstance(self._data, dict) else None
        if isinstance(value, dict):
            return _Data(value)
        if isinstance(value, list):
            return [_Data(v) if isinstance(v, dict) else v for v in value]
        return value

    def to_dict(self) -> Any:
        return self._data


class _RemoteStream:
    """A replica's chunk stream; ``aclose`` cancels it there (the engine aborts the request)."""

    def __init__(self, first: dict, rest) -> None:
        self._first: dict | None = first
        self._rest = rest

    def __aiter__(self) -> _RemoteStream:
        return self

    async def __anext__(self) -> _Data:
        if self._first is not None:
            data, self._first = self._first, None
        else:
            data = await self._rest.__anext__()
        _raise_if_error(data)
        return _Data(data)

    async def aclose(self) -> None:
        self._rest.cancel()


class _Stats:
    def __init__(self, speculation: Any) -> None:
        self._speculation = speculation

    def speculation(self) -> Any:
        return self._speculation


SUMMED = ("running", "waiting", "unfinished", "num_pages", "free_pages", "cached_pages")


@dataclass
class ReplicaCore:
    """An engine core as /health and /metrics read one, from a replica's snapshot (or the
    sum of all replicas': ``combined``)."""

    snap: dict

    @classmethod
    def combined(cls, cores: list[ReplicaCore]) -> ReplicaCore:
        """Requests and KV pages summed over ``cores``, a runner error if any has one; the rest
        (info, limits, metrics, speculation) the first one's."""
        snap = dict(cores[0].snap)
        for key in SUMMED:
            snap[key] = sum(c.snap[key] for c in cores)
        # (a failing replica's error, whichever replica it is)
        snap["runner_error"] = next((c.runner_error for c in cores if c.runner_error), None)
        return cls(snap)

    def idle(self) -> ReplicaCore:
        """This core's model (info, limits) with nothing in flight and no pages: what the
        model looks like while no replica reports."""
        return type(self)({**self.snap, **{key: 0 for key in SUMMED}})

    @property
    def info(self):
        return self.snap["info"]

    @property
    def metrics(self):
        return self.snap["metrics"]

    @property
    def kv(self):
        return _Data({k: self.snap[k] for k in ("num_pages", "free_pages", "cached_pages")})

    @property
    def stats(self) -> _Stats:
        return _Stats(self.snap["speculation"])

    @property
    def scheduler(self):
        return _Data({"max_batch_size": self.snap["max_batch_size"]})

    @property
    def max_total_tokens(self) -> int:
        return self.snap["max_total_tokens"]

    draft = None  # (a draft model's artifact is not hosted for browsers from replicas)

    @property
    def runner_error(self) -> str | None:
        return self.snap.get("runner_error")

    def requests_by_state(self) -> tuple[int, int]:
        return self.snap["running"], self.snap["waiting"]

    def num_unfinished(self) -> int:
        return self.snap["unfinished"]

    def has_unfinished(self) -> bool:
        return self.snap["unfinished"] > 0


class _Endpoint:
    def __init__(self, engine: RemoteEngine, api: str) -> None:
        self._engine, self._api = engine, api  # the request's API: "chat" | "completion"

    async def create(self, **body: Any) -> Any:
        return await self._engine.create(self._api, body)


@dataclass
class RemoteEngine:
    """One served model on the deployment's replicas, in the shape app.py serves."""

    handle: Any
    name: str
    replicas: dict[str, ReplicaCore] = field(default_factory=dict)  # replica id -> its core
    last: ReplicaCore | None = None  # a replica's last report: the model while none reports

    def __post_init__(self) -> None:
        self.last = self.last or next(iter(self.replicas.values()), None)
        self.chat = type("Chat", (), {})()
        self.chat.completions = _Endpoint(self, "chat")
        self.completions = _Endpoint(self, "completion")
        self.embeddings = type("Embeddings", (), {})()
        self.embeddings.create = self._embed

    @property
    def core(self) -> ReplicaCore:
        """All replicas as one core: requests and pages summed, the model's info and limits
        (with no replica reporting: the model's, nothing in flight)."""
        if not self.replicas:
            return self.last.idle()
        return ReplicaCore.combined(list(self.replicas.values()))

    async def create(self, api: str, body: dict) -> Any:
        stream = self.handle.options(stream=True).create.remote(self.name, api, body)
        try:
            first = await stream.__anext__()
            _raise_if_error(first)
        except BaseException:
            stream.cancel()
            raise
        if body.get("stream") is True:
            return _RemoteStream(first, stream)
        stream.cancel()
        return _Data(first)

    async def _embed(self, **body: Any) -> _Data:
        data = await self.handle.embed.remote(self.name, body)
        _raise_if_error(data)
        return _Data(data)

    def tokenize(self, body: Any) -> dict:
        return self._tokens("tokenize", body)

    def detokenize(self, body: Any) -> dict:
        return self._tokens("detokenize", body)

    def _tokens(self, work: str, body: Any) -> dict:
        data = self.handle.tokens.remote(self.name, work, body).result()
        _raise_if_error(data)
        return data

    @property
    def artifact_dir(self):
        """The artifact's directory on the replicas' machine (hosted for browsers when it is
        this one's: a local Ray cluster)."""
        from pathlib import Path

        return Path(self.core.snap["artifact_dir"])

    @property
    def device_name(self) -> str:
        return f"{len(self.replicas)} replicas on {self.core.snap['device_name']}"

    software_notice = None

    async def prepare_off_loop(self, prepare):
        return await asyncio.to_thread(prepare)

    def abort_all(self, error: Exception) -> None:
        """(At shutdown: the server's own streams end as it stops, and each one's end cancels
        its call in the replica, which aborts the request there.)"""

    async def aclose(self) -> None:
        pass


# ----------------------------------------------------------------------------- the pool


@contextlib.contextmanager
def _signals_kept():
    """The process's SIGTERM/SIGINT handling as it was before Ray started: Ray's core worker
    installs a failure handler that aborts the process on SIGTERM, where `wick serve` shuts
    down gracefully (running requests finish, Ray is stopped). Only the main thread can set
    signal handlers (`wick serve`'s server loop runs there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def name_taken(app: str) -> str:
    return (f"a Ray Serve application named {app!r} already runs on this cluster (another wick "
            f"serve?): name this one with --ray-app NAME, or stop that one first "
            f"(`serve delete {app}`)")


def check_gpus(scaling, node_gpus: list[float]) -> None:
    """Replicas asking for more GPUs than the cluster can place would wait for them forever, and
    the server with them: refused before anything is deployed, with the numbers. A replica takes
    its GPUs on one node; fractions share a GPU, floor(1 / fraction) replicas to one.
    ``node_gpus``: the GPUs of each live node."""
    g = scaling.gpus
    if g <= 0:
        return
    fit = sum(int(n // g) if g > 1 else int(n) * int(1 / g + 1e-9) for n in node_gpus)
    if fit < scaling.least:
        raise ValueError(f"{scaling.least} replica(s) of {g:g} GPU each do not fit the Ray "
                         f"cluster's GPUs ({', '.join(f'{n:g}' for n in node_gpus) or 'none'} "
                         f"per node: room for {fit}): lower --replica-gpus or --replicas, or "
                         f"add GPU nodes")


def apply_snapshots(engines: dict[str, RemoteEngine], snapshots: dict[str, dict]) -> None:
    """Each engine's replicas: those whose snapshot is fresh (the registry drops one silent for
    STALE_S), none when every replica is gone (not the last ones seen)."""
    for name, engine in engines.items():
        cores = {replica: ReplicaCore(snap[name]) for replica, snap in sorted(snapshots.items())
                 if name in snap}
        if cores:
            engine.last = next(iter(cores.values()))
        engine.replicas = cores


def _join_ray(address: str | None) -> None:
    """``ray.init`` on a new local cluster (None) or the cluster at ``address``. Ray sends its
    token (~/.ray/auth_token, RAY_AUTH_TOKEN) to a cluster it finds itself -- ``ray.init()``
    after ``ray start`` on this machine -- and, on purpose, to no address it is given unless
    RAY_AUTH_MODE=token: ``--ray-address 127.0.0.1:6379`` after ``ray start --head`` failed
    after 20 s with only "Failed to connect". An address naming the cluster ``ray.init()``
    would find gets the found cluster's rule here; any other needs RAY_AUTH_MODE=token, and a
    refusal says so."""
    options = dict(namespace=NAMESPACE, include_dashboard=False, log_to_driver=False,
                   configure_logging=False)
    _quiet_ray_notices()
    if address is None:
        ray.init(address="local", **options)
        return
    if _is_the_current_cluster(address):
        # (Ray's own step for a cluster it finds, pinned Ray 2.60: RAY_AUTH_MODE=token for
        # this process and Ray's config reloaded, when the mode is unset and a token is there)
        from ray._private.authentication.authentication_token_setup import \
            maybe_enable_token_auth_if_token_available

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        ray.init(address=address, **options)
    except ConnectionError as e:
        asks_token = "InvalidAuthToken" in str(e.__cause__)
        raise ConnectionError(f"could not join the Ray cluster at {address} ({e})"
                              + (RAY_TOKEN_ADVICE if asks_token else "")) from e


def _serve_running() -> bool:
    """Whether the cluster runs Serve already (its controller, a named actor): its HTTP
    options are kept, and asking for others only draws Ray's warning that they are ignored."""
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return True
    except ValueError:
        return False


class _RayNotices(logging.Filter):
    """Ray's start-up notices that say nothing to a `wick serve` user: its SIGTERM handler is
    wick's (set on the main thread, ``_signals_kept``); the token notice is about the local
    cluster wick starts for itself and stops with the server."""

    DROPPED = ("SIGTERM handler is not set because",
               "Token authentication is enabled for this Ray cluster.")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.DROPPED)


def _quiet_ray_notices() -> None:
    """Ray's notices above dropped, and Ray Serve's INFO lines (started, ready, deleting:
    wick's own log says when the models serve) kept out of the server's output; its warnings
    and errors stay. (Its logs on the cluster are Ray's as always.)"""
    for name in ("ray._private.worker", "ray._private.authentication.authentication_token_setup"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RayNotices) for f in logger.filters):
            logger.addFilter(_RayNotices())
    logging.getLogger("ray.serve").setLevel(logging.WARNING)


def _is_the_current_cluster(address: str) -> bool:
    """Whether ``address`` is the cluster ``ray.init()`` would find on this machine (the last
    ``ray start``'s), localhost and this machine's IP being one host, as Ray takes them."""
    from ray._private.services import canonicalize_bootstrap_address
    from ray._private.utils import read_ray_address

    current = read_ray_address()
    try:
        return current is not None and \
            canonicalize_bootstrap_address(address) == canonicalize_bootstrap_address(current)
    except Exception:  # noqa: BLE001 - an address Ray cannot read: ray.init says why
        return False


RAY_TOKEN_ADVICE = (": it asks for a token; set RAY_AUTH_MODE=token and put the cluster's "
                    "token in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH or in "
                    "~/.ray/auth_token")


@dataclass
class ReplicaPool(ModelPool):
    """The served models on a Ray Serve deployment's replicas (``ModelPool``'s names and
    errors): ``load`` starts Ray (or joins ``replicas.address``) and the deployment, then keeps
    every replica's snapshot fresh for /health and /metrics; ``aclose`` deletes the deployment
    and stops the Ray it started."""

    models: list[str] = field(default_factory=list)
    engine_options: dict = field(default_factory=dict)
    scaling: Any = None  # replicas.Replicas: a count, or autoscaling bounds
    # the bars that draw a model's load on its replicas: progress_for(model) -> a
    # ``progress(stage, done, total)`` callback with ``close()`` (None: not drawn)
    progress_for: Any = None
    handle: Any = None
    _started_ray: bool = False
    _refresher: Any = None
    _registry: Any = None
    _ray_owner: Any = None
    _ray_owner_stop: Any = None
    _ray_stopping: bool = False
    _deployed: bool = False

    def __post_init__(self) -> None:
        # (the app's lifespan loads a pool that has loaders: here the models' labels, which
        # load() deploys together)
        self.loaders = [(model, None) for model in self.models]
        # held while the registry is read and while Ray is stopped: a read that outlived the
        # cluster waited a minute for its GCS, and the process's exit with it
        self._ray_lock = threading.Lock()

    def _start_ray(self) -> None:
        """``ray.init`` on a thread that lives until ``aclose``: Ray starts its local cluster's
        processes with a parent-death signal, which Linux sends when the starting *thread*
        ends (a load's short-lived thread would take the cluster down with it)."""
        started: list[BaseException | None] = []
        ready = threading.Event()
        self._ray_owner_stop = threading.Event()

        def own() -> None:
            try:
                if self.scaling.address is None:
                    # The processes of a cluster of our own start with SIGTERM blocked, as Ray
                    # blocks SIGINT in them (a child keeps its parent thread's signal mask):
                    # a SIGTERM to the whole process group (systemd stopping the service,
                    # `timeout`) then stops the server alone, which stops them in order. (It
                    # reached them too: Serve's stop waited a minute on the GCS, then Ray
                    # ended the process with an error.) Python runs handlers on the main
                    # thread, which this mask leaves as it is.
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                # ("local": a new cluster of our own, never one that RAY_ADDRESS or another
                # process left running, whose Serve apps aclose would stop)
                _join_ray(self.scaling.address)
                started.append(None)
            except BaseException as e:  # noqa: BLE001 - raised on the deploying thread
                started.append(e)
            ready.set()
            if started[0] is None:
                self._ray_owner_stop.wait()

        self._ray_owner = threading.Thread(target=own, name="wick-ray", daemon=True)
        self._ray_owner.start()
        ready.wait()
        if started[0] is not None:
            raise started[0]

    def _deploy(self) -> Any:
        from ray.serve.config import RequestRouterConfig

        if not ray.is_initialized():
            self._started_ray = self.scaling.address is None
            self._start_ray()
        scaling = self.scaling
        check_gpus(scaling, [n["Resources"].get("GPU", 0.0) for n in ray.nodes()
                             if n.get("Alive")])  # (before anything is started or claimed)
        # The application's name is claimed by this server's registry, a named actor: Ray
        # refuses a second actor of one name at once (two servers starting together cannot both
        # pass), and the actor dies with this process, freeing the name. (It also holds the
        # replicas' snapshots.)
        try:
            self._registry = ReplicaRegistry.options(name=scaling.registry,
                                                     namespace=NAMESPACE).remote()
        except ValueError:
            raise ValueError(name_taken(scaling.app)) from None
        if _serve_running():  # (a cluster's own Serve, its HTTP proxy as it is)
            serve.start()
        else:
            serve.start(http_options={"location": "NoServer"})
        if scaling.app in serve.status().applications:  # (left by a server that died)
            raise ValueError(name_taken(scaling.app))
        self._deployed = True  # (from here the name is ours: a failed deploy is ours to delete)
        router = ROUTERS[scaling.router]
        routing = {} if router is None else {
            "request_router_config": RequestRouterConfig(request_router_class=router)}
        deployment = serve.deployment(name="engines")(EngineReplica).options(
            ray_actor_options={"num_cpus": 0, "num_gpus": scaling.gpus}, max_ongoing_requests=64,
            **routing, **scaling.deployment_options())
        # (serve.run returns once the replicas run: their loading is drawn meanwhile)
        stop = threading.Event()
        relay = None if self.progress_for is None else threading.Thread(
            target=relay_progress, args=(self._registry, self.progress_for, stop,
                                         self._ray_lock, lambda: self._ray_stopping),
            name="wick-progress", daemon=True)
        if relay is not None:
            relay.start()
        try:
            handle = serve.run(deployment.bind(self.models, self.engine_options,
                                               scaling.registry),
                               name=scaling.app, route_prefix=None, blocking=False)
            # the handle's router is made on its first call, with blocking calls to Ray:
            # here, off the server's event loop; then one replica's account of the models
            # (all serve all)
            return handle, handle.info.remote().result()
        finally:
            stop.set()
            if relay is not None:
                relay.join(timeout=20)  # (a read in flight: 5 s, and the lock's holder's)

    async def load(self) -> None:
        from .model_pool import _in_daemon_thread

        try:
            self.loading = ", ".join(self.models)
            with _signals_kept():
                self.handle, info = await _in_daemon_thread(self._deploy)
            for name, snap in info.items():
                self.add(RemoteEngine(self.handle, name, {"": ReplicaCore(snap)}))
            for label in self.models:  # (the names the models were served by work too)
                if label not in self._aliases and len(info) == len(self.models):
                    self._aliases[label] = list(info)[self.models.index(label)]
            # (every replica that starts with the deployment reports within a few cycles: the
            # log's "N replicas" then counts them all, not the first one to report)
            for _ in range(int(5 / REPORT_S)):
                await self._refresh()
                if all(len(e.replicas) >= self.scaling.least for e in self.engines.values()):
                    break
                await asyncio.sleep(REPORT_S)
            if self.on_loaded is not None:
                for name, engine in self.engines.items():
                    self.on_loaded(name, engine)
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())
            self.state, self.loading = "ready", None
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"
            log.error("starting the replicas failed: %s", self.error)
            if self.on_failed is not None:
                self.on_failed(e)

    async def _refresh(self) -> None:
        # (a blocking get on a thread: an ObjectRef awaited on this server's loop never
        # resolved here, the loop not being one Ray made)
        snapshots = await asyncio.to_thread(self._read_snapshots)
        if snapshots is not None:
            apply_snapshots(self.engines, snapshots)

    def _read_snapshots(self) -> dict | None:
        with self._ray_lock:
            if self._ray_stopping:
                return None
            return ray.get(self._registry.snapshots.remote(), timeout=30)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REPORT_S)
            try:
                await self._refresh()
            except Exception as e:  # noqa: BLE001 - the last snapshots stay; said once a cycle
                log.warning("could not read the replicas' state: %s", e)

    def cores(self) -> list[tuple[str, str | None, Any]]:
        return [(name, replica, core) for name, e in self.engines.items()
                for replica, core in e.replicas.items()]

    def replicas(self) -> dict[str, Any]:  # type: ignore[override]
        from .model_pool import engine_health

        out: dict[str, Any] = {}
        for name, e in self.engines.items():
            for replica, core in e.replicas.items():
                out.setdefault(replica, {})[name] = engine_health(core)
        return out

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        if not self._deployed and not self._started_ray and self._registry is None:
            return

        def stop() -> None:
            with self._ray_lock:  # (after any read in flight; none starts after this)
                self._ray_stopping = True
            try:
                try:
                    if self._deployed:  # (never another server's application of that name)
                        serve.delete(self.scaling.app)
                finally:
                    if self._registry is not None and not self._started_ray:
                        ray.kill(self._registry)  # (the name's claim, on a cluster that stays)
                # (a cluster of our own goes as a whole: ray.shutdown stops its processes,
                # Serve's controller too; serve.shutdown first left Serve's calls in flight to
                # fail, each a line from the raylet)
            finally:
                if self._started_ray:
                    ray.shutdown()
                if self._ray_owner_stop is not None:  # (a joined cluster's thread too)
                    self._ray_owner_stop.set()

        await asyncio.to_thread(stop)
