"""No request's grammar can crash ``wick serve`` or stall the others (issue #27, part 1 and 2):
the reproducers of the outside probe get 400s naming what is too large while streams run; with
the bounds opened, a grammar that segfaults xgrammar costs a compile child and that request
only; a slow compile is stopped at its budget while small schemas pass it; a client that
leaves abandons its compile.

Tiny random Llama (q0f32) of ``conftest.py``; the crash runs against ``wick serve`` in a child
process (were the crash to reach the server, it must not take pytest with it)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import wick_process_env
from tests.hostile_grammars import ebnf_chain, properties, ref_chain
from tests.server.conftest import (
    HELLO,
    LiveServer,
    assert_openai_error,
    finish_streams,
    post,
    start_streams,
)
from wick.engine.grammar_limits import GrammarLimits
from wick.server.app import ModelPool, create_app

SLOW = 'root ::= (("a"{0,16}){0,16}){0,16}'  # far over any time budget (xgrammar 0.1.27)



def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


def tool(parameters: dict) -> list:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


SCHEMA = "response_format.json_schema.schema"
TOO_LARGE = "grammar_too_large"
# the outside probe's inputs, each once crashed or stalled the server: (fields, param, code)
REPRODUCERS = {
    "ref chain": ({"response_format": schema_format(ref_chain(4000))}, SCHEMA, TOO_LARGE),
    # 4,000 deep, tool definitions outgrow the (tiny) model's context first
    "tools auto": ({"tools": tool(ref_chain(4000)), "tool_choice": "auto"}, "tools",
                   "context_length_exceeded"),
    "tools auto, 40 deep": ({"tools": tool(ref_chain(40)), "tool_choice": "auto"},
                            "tools[0].function.parameters", TOO_LARGE),
    "tools required, 40 deep": ({"tools": tool(ref_chain(40)), "tool_choice": "required"},
                                "tools[0].function.parameters", TOO_LARGE),
    "ebnf chain": ({"response_format": {"type": "grammar", "grammar": ebnf_chain(40_000)}},
                   "response_format.grammar", TOO_LARGE),
    "required": ({"response_format": schema_format(properties(100_000, required=True))},
                 SCHEMA, TOO_LARGE),
    "optional": ({"response_format": schema_format(properties(4_000, required=False))},
                 SCHEMA, TOO_LARGE),
}



@pytest.fixture(scope="module")
def guarded(tiny_a):
    """A server with the default bounds and a compile budget of 1.5 s."""
    from wick.server.local import AsyncEngine

    engine = AsyncEngine(str(tiny_a), grammar_limits=GrammarLimits(compile_timeout_s=1.5))
    live = LiveServer(create_app(ModelPool.of(engine)))
    yield live
    live.stop()


def test_reproducers_are_refused_while_streams_run(guarded):
    name = next(iter(guarded.pool.engines))
    # encoded before the streams start: this client shares the server's process (and GIL),
    # and encoding 4 MB of JSON would stall the streams on the client's account
    bodies = {label: json.dumps({"model": name, "messages": HELLO, "max_tokens": 4, **extra})
              for label, (extra, _, _) in REPRODUCERS.items()}
    pool, futures, outs = start_streams(guarded.url, name, 8)
    t0 = time.monotonic()
    for label, (_, param, code) in REPRODUCERS.items():
        sent = time.monotonic()
        err = assert_openai_error(post(guarded, "/v1/chat/completions", bodies[label]), 400,
                                  param=param, code=code)
        if code == TOO_LARGE:
            assert "the bound is" in err["message"] and "wick serve --grammar-" in err["message"]
        assert time.monotonic() - sent < 5, label
    gap = finish_streams(pool, futures, outs, t0, time.monotonic())
    print(f"largest gap between chunks: {gap:.2f} s")
    assert gap < 1.0, f"a stream waited {gap:.2f} s for its next chunk"
    engine = guarded.pool.engines[name]
    assert engine.core.grammar.pool.stats.started == 0  # nothing reached a compile child


def test_a_slow_compile_is_stopped_and_small_schemas_pass_it(guarded):
    name = next(iter(guarded.pool.engines))
    body = {"model": name, "messages": HELLO, "max_tokens": 2,
            "response_format": {"type": "grammar", "grammar": SLOW}}

    def small(key: str) -> dict:
        return {"model": name, "messages": HELLO, "max_tokens": 2, "response_format":
                schema_format({"type": "object", "properties": {key: {}}})}

    # both compile children started first (a child starts on first use: ~1 s on a busy
    # machine, which is not what this test times)
    with ThreadPoolExecutor(2) as two:
        assert [r.status_code for r in two.map(
            lambda key: post(guarded, "/v1/chat/completions", small(key)), ["w0", "w1"])] == \
            [200, 200]
    with ThreadPoolExecutor(1) as one:
        t0 = time.monotonic()
        slow = one.submit(post, guarded, "/v1/chat/completions", body)
        time.sleep(0.3)
        for i in range(3):
            sent = time.monotonic()
            assert post(guarded, "/v1/chat/completions", small(f"k{i}")).status_code == 200
            assert time.monotonic() - sent < 1.0
            if i == 0:  # (the first one within 1.3 s of the start: the slow one still runs;
                # all three could outlast its 1.5 s budget on a loaded machine, as one
                # clean-clone run's did)
                assert not slow.done()
        err = assert_openai_error(slow.result(), 400, param="response_format.grammar",
                                  code="grammar_too_large")
        assert 1.5 <= time.monotonic() - t0 < 4
    assert "took longer than 1.5 s" in err["message"]


def test_a_client_that_leaves_abandons_its_compile(guarded):
    name = next(iter(guarded.pool.engines))
    pool = guarded.pool.engines[name].core.grammar.pool
    before = pool.stats.abandoned
    grammar = 'root ::= (("b"{0,12}){0,12}){0,12}'  # not remembered from another test
    for stream in (True, False):
        body = {"model": name, "messages": HELLO, "max_tokens": 2, "stream": stream,
                "response_format": {"type": "grammar", "grammar": grammar + " " * stream}}
        with socket.create_connection(guarded.sock.getsockname()[:2]) as s:
            raw = json.dumps(body).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: "
                      + str(len(raw)).encode() + b"\r\n\r\n" + raw)
            deadline = time.monotonic() + 5
            while not pool.pids:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            time.sleep(0.2)
        deadline = time.monotonic() + 1.5  # well within the 1.5 s budget
        while pool.stats.abandoned == before:
            assert time.monotonic() < deadline, "the compile went on after its client left"
            time.sleep(0.02)
        before = pool.stats.abandoned
    assert pool.stats.timed_out == 1  # the slow-compile test's only


# ---------------------------------------------------------------------------------------------
# The bounds opened: a grammar that crashes xgrammar reaches a compile child


OPEN = ["--grammar-max-bytes", "100000000", "--grammar-max-depth", "1000000",
        "--grammar-max-properties", "1000000", "--grammar-max-rules", "1000000",
        "--grammar-timeout", "30"]


@pytest.fixture(scope="module")
def open_server(tiny_a, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wick.server.cli", "serve", str(tiny_a), "--port", str(port),
             *OPEN], stdout=out, stderr=subprocess.STDOUT, env=wick_process_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield proc, url, log
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def test_a_grammar_that_crashes_the_compiler_costs_one_request(open_server):
    proc, url, log = open_server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    pool, futures, outs = start_streams(url, name, 6, max_tokens=90)
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": name, "messages": HELLO, "max_tokens": 4,
        "response_format": schema_format(ref_chain(5000))})
    err = assert_openai_error(r, 400, param=SCHEMA,
                              code="invalid_json_schema")
    assert "crashed" in err["message"] and "SIGSEGV" in err["message"]
    gap = finish_streams(pool, futures, outs, t0, time.monotonic())
    # (the streams keep going: 1.8 s was seen beside the other test worker's compiles on two
    # cores, so the bound is 3 s)
    assert gap < 3.0, f"a stream waited {gap:.2f} s for its next chunk"
    assert proc.poll() is None
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and all(e["requests"] == 0
                                            for e in health["engines"].values())
    ok = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": name, "messages": HELLO, "max_tokens": 30, "temperature": 0,
        "response_format": schema_format({"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]})})
    assert ok.status_code == 200
    reply = ok.json()["choices"][0]["message"]["content"]
    assert ok.json()["choices"][0]["finish_reason"] == "length" or "n" in json.loads(reply)
    text = log.read_text()
    assert "the grammar compiler crashed" in text and "Traceback" not in text
