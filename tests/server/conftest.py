"""Shared by the server tests: two tiny random Llamas (compiled q0f32, context window 128) on
the native wgpu backend behind a live uvicorn server on a free loopback port (one per module),
and helpers to post raw bodies and check OpenAI-shaped errors."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from wick.server.app import ModelPool, create_app
from wick.server.artifact_host import ArtifactHost
from wick.server.serve import ServerThread

from tests.conftest import ROOT, tool_missing

WINDOW = 128
HELLO = [{"role": "user", "content": "hello there"}]


# ---------------------------------------------------------------------------------------------
# A live server in a background thread


class LiveServer(ServerThread):
    @property
    def pool(self) -> ModelPool:
        return self.app.state.pool

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while httpx.get(f"{self.url}/health").status_code != 200:
            assert self.pool.state != "failed", self.pool.error
            assert time.monotonic() < deadline, "models did not load"
            time.sleep(0.05)


def engine_loader(artifact: Path):
    from wick.server.local import AsyncEngine

    return str(artifact), lambda: AsyncEngine(str(artifact))


@pytest.fixture(scope="module")
def tiny_a(tiny_llama_dir, compiled) -> Path:
    return compiled(tiny_llama_dir, "q0f32", context_window=WINDOW, max_batch_size=16)


@pytest.fixture(scope="module")
def tiny_b(tmp_path_factory, compiled) -> Path:
    from tests.tiny_models import make_tiny_llama

    src = make_tiny_llama(tmp_path_factory.mktemp("tiny-b") / "tiny-llama-b", seed=1, layers=1)
    return compiled(src, "q0f32", context_window=WINDOW, max_batch_size=4)


@pytest.fixture(scope="module")
def server(tiny_a, tiny_b):
    from wick.compiler.paths import artifacts_dir

    pool = ModelPool([engine_loader(tiny_a), engine_loader(tiny_b)])
    live = LiveServer(create_app(pool, artifacts=ArtifactHost(artifacts_dir())))
    live.wait_ready()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def names(server) -> list[str]:
    return list(server.pool.engines)


@pytest.fixture(scope="module")
def engine(server, names):
    return server.pool.engines[names[0]]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def post(server, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.url}{path}", content=content, timeout=60,
                      headers={"Content-Type": "application/json", **(headers or {})})


def assert_openai_error(resp: httpx.Response, status: int, *, param=..., code=...) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    if param is not ...:
        assert err["param"] == param
    if code is not ...:
        assert err["code"] == code
    return err


# ---------------------------------------------------------------------------------------------
# Streams running beside something else


def stream_times(url: str, body: dict, out: list, started: threading.Event | None = None) -> None:
    """POST a streaming request; append (arrival time, data) of every event to ``out``."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append((time.monotonic(), line[6:]))
                if started is not None and len(out) >= 3:
                    started.set()


def events(raw: list) -> list:
    return [json.loads(d) if d != "[DONE]" else d for _, d in raw]


def start_streams(url: str, model: str, count: int, max_tokens: int = 80):
    """``count`` greedy streams (ignore_eos), returned once the first has chunks:
    (executor, futures, the (time, data) events of each)."""
    body = {"model": model, "messages": HELLO, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}
    outs: list[list] = [[] for _ in range(count)]
    started = threading.Event()
    pool = ThreadPoolExecutor(count)
    futures = [pool.submit(stream_times, url, body, out, started if i == 0 else None)
               for i, out in enumerate(outs)]
    assert started.wait(60), "no stream started"
    return pool, futures, outs


def finish_streams(pool, futures, outs, since: float, until: float) -> float:
    """Every stream ends whole ("length", then [DONE], no error event); the longest wait for
    a chunk between ``since`` and ``until``."""
    for f in futures:
        f.result(timeout=120)
    pool.shutdown()
    for out in outs:
        evs = events(out)
        assert evs[-1] == "[DONE]" and not any("error" in e for e in evs[:-1])
        assert evs[-2]["choices"][0]["finish_reason"] == "length"
    gaps = [b[0] - a[0] for out in outs for a, b in zip(out, out[1:])
            if b[0] > since and a[0] < until]
    assert gaps, "no stream was running meanwhile"
    return max(gaps)


def still_running(processes: list, timeout: float = 30) -> list:
    """Those of ``processes`` (psutil) still running after ``timeout`` s (zombies and the
    processes gone meanwhile are not)."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)

    def running(p) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p for p in alive if running(p)]


def free_port() -> int:
    """A loopback port free now (for a server a test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ Ray (the replicas' tests)
RAY_LLM = ROOT / ".venv" / "ray-llm"  # (scripts/setup.sh --test)
RAY_LLM_SITE = Path(__file__).with_name("ray_llm_site")
# (~80 tokens of the tiny model's 128: three pages of it cacheable, for prefix-aware routing)
SYSTEM = "You are a careful assistant for a shipping company: answer in one line, name the port."


def ray_llm_env() -> dict[str, str]:
    """This process's environment with Ray Serve LLM's OpenAI types on the path."""
    import os

    if not (RAY_LLM / "sglang").is_dir():
        tool_missing("Ray Serve LLM's OpenAI types are not installed (.venv/ray-llm)")
    # (ray_llm_site first: its sitecustomize keeps SGLang's package start-up out of each process)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(RAY_LLM_SITE), str(RAY_LLM), *filter(None, [os.environ.get("PYTHONPATH")])])}
