"""Reliability of ``wick serve`` under load and abuse, against a tiny random Llama; prints figures.

    python bench/reliability.py                 # 64 clients x 3 rounds, 32 disconnects x 3
    python bench/reliability.py --clients 16 --rounds 1 --disconnects 8

1. Streaming clients: each of ``--clients`` prompts is first answered alone (greedy), then all
   at once, ``--rounds`` times; the concurrent answers must equal the solo ones.
2. Mid-stream disconnects: ``--disconnects`` streams are opened, read for two events and
   dropped, ``--rounds`` times; after each round the KV pool must be whole again
   (``/health``: ``kv_pages_free == kv_pages``, no request left) and the server's RSS flat.
3. The hostile battery: malformed, oversized, cross-site, rebinding, traversal, slow and
   half-sent requests; every answer must be a 4xx OpenAI error object, the server still up.
4. Slowloris: ``--slowloris`` connections that send nothing or half a request head; the
   server must close every one (``--header-timeout 2``).
5. Grammars: a battery of hostile and heavy response formats and tools (deep ``$ref``, ``items``,
   ``anyOf``, ``properties`` and ``prefixItems`` nesting, a 40k-rule EBNF chain, 100k required
   and 4k optional properties, tools with a deep schema, nested repetitions that compile for
   minutes, 16 different small schemas at once) sent while 8 streams run: per input the
   answer and its time, the streams' largest gap between chunks, the server's RSS (and its
   compile children's) before and after. Then the same crashers against a server whose
   bounds are opened (``--grammar-max-* huge``): each must cost one compile child, not the
   server.
6. Schemathesis for ``--schemathesis`` seconds (default 300) over every operation, valid and
   invalid inputs: 5xx answers, and the requests where the OpenAPI document and the server
   disagree (a valid request refused, an invalid one answered), leaving out the refusals no
   schema can announce (``request_schemas.refused_beyond_any_schema``), counted apart.

``--parts grammar,schemathesis`` runs some of them.

The server runs in a child process (``wick serve`` with ``--body-timeout 2``
``--header-timeout 2``) on a free port;
its log (warnings and errors only) goes to this terminal: a traceback there is a failure too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from serve import start_server  # bench/serve.py: `wick serve` in a child process

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.hostile_grammars import ebnf_chain, nested, properties, ref_chain  # noqa: E402
from tests.openapi_fuzz import bound_work, work_bounds  # noqa: E402

PARTS = ("streaming", "disconnects", "hostile", "slowloris", "grammar", "schemathesis")


def tiny_artifact() -> str:
    from tests.tiny_models import make_tiny_llama
    from wick.compiler.compile import compile_model

    src = make_tiny_llama(Path(tempfile.gettempdir()) / "wick-bench-tiny-llama")
    return str(compile_model(str(src), "q0f32", context_window=256, max_batch_size=32))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle(url: str, timeout: float = 30) -> bool:
    """Wait until every engine has no request and its whole KV pool free."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engines = httpx.get(f"{url}/health").json()["engines"].values()
        if all(e["requests"] == 0 and e["kv_pages_free"] == e["kv_pages"] for e in engines):
            return True
        time.sleep(0.05)
    return False


async def stream_text(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    text = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                text += [c["delta"].get("content") or "" for c in chunk["choices"]]
    return "".join(text)


async def streaming_rounds(url: str, clients: int, rounds: int, tokens: int) -> dict:
    prompts = [f"client {i} asks about lighthouse number {i * 7 % 13}" for i in range(clients)]
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 8)) as c:
        solo = [await stream_text(c, url, p, tokens) for p in prompts]
        equal, started = 0, time.perf_counter()
        for _ in range(rounds):
            together = await asyncio.gather(*(stream_text(c, url, p, tokens) for p in prompts))
            equal += sum(a == b for a, b in zip(solo, together))
        wall = time.perf_counter() - started
    return {"streams": clients * rounds, "equal_solo": equal, "wall_s": wall,
            "tok_s": clients * rounds * tokens / wall}


async def disconnect_rounds(url: str, pid: int, streams: int, rounds: int) -> dict:
    body = {"messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 200,
            "ignore_eos": True, "stream": True}
    rss, whole = [rss_mib(pid)], 0
    for _ in range(rounds):
        async def drop() -> None:
            async with httpx.AsyncClient(timeout=60) as c:
                async with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                    seen = 0
                    async for line in r.aiter_lines():
                        seen += line.startswith("data: ")
                        if seen >= 2:
                            return  # leaving the block drops the connection mid-stream
        await asyncio.gather(*(drop() for _ in range(streams)))
        whole += idle(url)
        rss.append(rss_mib(pid))
    return {"dropped": streams * rounds, "pool_whole_after": f"{whole}/{rounds} rounds",
            "rss_mib": " -> ".join(f"{r:.0f}" for r in rss)}


def raw(url: str, data: bytes, wait: float = 8) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def hostile(url: str) -> list[tuple[str, int, bool]]:
    """(case, status, is an OpenAI error object) for each hostile request."""
    j = {"Content-Type": "application/json"}
    msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    cases = [
        ("bad JSON", "POST", "/v1/chat/completions", j, b'{"messages": ['),
        ("not UTF-8", "POST", "/v1/chat/completions", j, b'{"a": "\xff"}'),
        ("100k-deep JSON", "POST", "/v1/chat/completions", j, b"[" * 100_000 + b"]" * 100_000),
        ("5000-digit number", "POST", "/v1/chat/completions", j, b'{"n": ' + b"9" * 5000 + b"}"),
        ("lone surrogate", "POST", "/v1/chat/completions", j,
         b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
        ("5 MiB body", "POST", "/v1/chat/completions", j, b" " * (5 << 20)),
        ("130k messages", "POST", "/v1/chat/completions", j, json.dumps(
            {"messages": [{"role": "user", "content": "x"}] * 130_000}).encode()),
        ("text/plain (cross-site form)", "POST", "/v1/chat/completions",
         {"Content-Type": "text/plain"}, json.dumps(msg).encode()),
        ("foreign Origin", "POST", "/v1/chat/completions",
         {**j, "Origin": "https://evil.example"}, json.dumps(msg).encode()),
        ("foreign preflight", "OPTIONS", "/v1/chat/completions",
         {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}, b""),
        ("DNS rebinding Host", "GET", "/v1/models", {"Host": "evil.example"}, b""),
        ("unknown field", "POST", "/v1/chat/completions", j, json.dumps({**msg, "x": 1}).encode()),
        ("n = 100000", "POST", "/v1/chat/completions", j, json.dumps({**msg, "n": 100000}).encode()),
        ("n over the batch", "POST", "/v1/chat/completions", j, json.dumps({**msg, "n": 33}).encode()),
        ("top_k = 2^40", "POST", "/v1/chat/completions", j, json.dumps({**msg, "top_k": 2**40}).encode()),
        ("context overflow", "POST", "/v1/completions", j,
         json.dumps({"prompt": "x" * 400, "max_tokens": 1}).encode()),
        ("unknown model", "POST", "/v1/chat/completions", j, json.dumps({**msg, "model": "gpt-9"}).encode()),
        ("traversal", "GET", "/artifacts/../../etc/passwd", {}, b""),
        ("encoded traversal", "GET", "/artifacts/x/%2e%2e%2f%2e%2e%2fsecret", {}, b""),
        ("300-char artifact id", "GET", "/artifacts/" + "a" * 300 + "/x", {}, b""),
        ("unknown route", "GET", "/v1/nope", {}, b""),
        ("wrong method", "DELETE", "/v1/models", {}, b""),
    ]
    out = []
    for name, method, path, headers, body in cases:
        r = httpx.request(method, f"{url}{path}", headers=headers, content=body, timeout=60)
        out.append((name, r.status_code, _openai_error(r.content)))
    half = raw(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                    b"application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\": [")
    out.append(("half-sent body", int(half[9:12] or 0), _openai_error(half.split(b"\r\n\r\n", 1)[-1])))
    return out


def slowloris(url: str, connections: int, timeout: float) -> dict:
    """Open ``connections`` sockets that send half a request head (or nothing) and never
    finish it; count those the server closes within ``timeout`` + 5 seconds."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for i in range(connections):
        s = socket.create_connection((host, int(port)))
        if i % 2:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(s)
    started = time.monotonic()
    closed, last = 0, 0.0
    for s in socks:
        s.settimeout(max(0.1, started + timeout + 5 - time.monotonic()))
        try:
            if s.recv(1) == b"":
                closed += 1
                last = time.monotonic() - started
        except (TimeoutError, OSError):
            pass
        s.close()
    return {"opened": connections, "closed": closed, "last_s": last}


def _openai_error(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
        return {"message", "type", "param", "code"} <= set(err)
    except (ValueError, KeyError, TypeError):
        return False


# ---------------------------------------------------------------------------------------------
# 5. Grammars




def fmt(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "s", "schema": schema}}}


def tools(parameters: dict, choice: str) -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            "tool_choice": choice}


def ebnf(text: str) -> dict:
    return {"response_format": {"type": "grammar", "grammar": text}}


TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}
# (name, request fields); what crashed or stalled the server before, and what must pass
GRAMMARS = [
    ("$ref chain 4000 (318 KB)", fmt(ref_chain(4000))),
    # (4000 deep, tools exceed the tiny model's context window before any grammar bound)
    ("tools auto, $ref chain 30", tools(ref_chain(30), "auto")),
    ("tools required, $ref chain 30", tools(ref_chain(30), "required")),
    ("EBNF chain 40k rules (977 KB)", ebnf(ebnf_chain(40_000))),
    ("100k required properties", fmt(properties(100_000, required=True))),
    ("4k optional properties (115 KB)", fmt(properties(4_000, required=False))),
    # (deeper than ~490 levels, the body itself is refused as JSON nested too deeply)
    ("items nested 480", fmt(nested(480, lambda s: {"type": "array", "items": s}))),
    ("anyOf nested 320", fmt(nested(320, lambda s: {"anyOf": [s, {"type": "null"}]}))),
    ("properties nested 320", fmt(nested(320, lambda s: {"type": "object",
                                                          "properties": {"x": s}}))),
    ("prefixItems nested 320", fmt(nested(320, lambda s: {"type": "array",
                                                           "prefixItems": [s]}))),
    ("EBNF parentheses 10k deep", ebnf("root ::= " + "(" * 10_000 + '"a"' + ")" * 10_000)),
    ("nested repetition (minutes)", ebnf('root ::= ((("a"{0,9}){0,9}){0,9}){0,9}')),
    ("recursive tree schema (allowed)", fmt(TREE)),
    ("1000 optional properties (allowed)", fmt(properties(1_000, required=False))),
]
CRASHERS = [GRAMMARS[i] for i in (0, 3, 4, 6)]  # with the bounds opened


def process_rss_mib(pid: int) -> tuple[float, float]:
    """(the server's RSS, its child processes' RSS together) in MiB."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return rss_mib(pid), sum(rss_mib(c) for c in children if Path(f"/proc/{c}").exists())


def ask(url: str, extra: dict, timeout: float = 300) -> tuple[int, str, float]:
    body = {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 8,
            "temperature": 0, **extra}
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
    code = r.json().get("error", {}).get("code") if r.status_code != 200 else "ok"
    return r.status_code, code or "", time.perf_counter() - t0


def stream_gaps(url: str, out: list, done: threading.Event) -> None:
    """Streams (ignore_eos) one after another until ``done``: chunk arrival times into
    ``out``, and "error" there when a stream failed."""
    body = {"messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 200,
            "ignore_eos": True, "stream": True, "temperature": 0}
    while not done.is_set():
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out.append(time.monotonic())
                    last = line
                    if '"error"' in line:
                        out.append("error")
            if last != "data: [DONE]":
                out.append("error")


def grammar_battery(url: str, pid: int, inputs: list, streams: int = 8) -> dict:
    rss_before = process_rss_mib(pid)
    outs: list[list] = [[] for _ in range(streams)]
    done = threading.Event()
    threads = [threading.Thread(target=stream_gaps, args=(url, out, done)) for out in outs]
    for t in threads:
        t.start()
    while not all(outs):
        time.sleep(0.05)
    t0 = time.monotonic()
    answers = [(name, *ask(url, extra)) for name, extra in inputs]
    if inputs is GRAMMARS:  # 16 different small schemas at once
        with ThreadPoolExecutor(16) as pool:
            started = time.perf_counter()
            small = list(pool.map(lambda i: ask(url, fmt({"type": "object", "properties": {
                f"k{i}": {"type": "string"}}, "required": [f"k{i}"]})), range(16)))
            wall = time.perf_counter() - started
        statuses = sorted({s for s, _, _ in small})
        answers.append((f"16 different small schemas at once ({wall:.2f} s in all)",
                        statuses[0] if len(statuses) == 1 else -1, "ok",
                        max(t for _, _, t in small)))
    t1 = time.monotonic()
    done.set()
    for t in threads:
        t.join()
    times = [[x for x in out if x != "error"] for out in outs]
    gaps = [b - a for out in times for a, b in zip(out, out[1:]) if b > t0 and a < t1]
    return {"answers": answers, "gap_s": max(gaps, default=float("nan")),
            "stream_errors": sum(out.count("error") for out in outs),
            "rss_before": rss_before, "rss_after": process_rss_mib(pid),
            "alive": httpx.get(f"{url}/health").status_code == 200}


def print_battery(title: str, result: dict) -> None:
    print(f"\n{title}")
    for name, status, code, seconds in result["answers"]:
        print(f"  {status}  {code:<22} {seconds:7.2f} s  {name}")
    (s0, c0), (s1, c1) = result["rss_before"], result["rss_after"]
    print(f"  8 streams meanwhile: largest gap between chunks {result['gap_s']:.2f} s, "
          f"{result['stream_errors']} failed; server RSS {s0:.0f} -> {s1:.0f} MiB (compile "
          f"children {c0:.0f} -> {c1:.0f} MiB); server {'up' if result['alive'] else 'DOWN'}")


# ---------------------------------------------------------------------------------------------
# 6. Schemathesis


def schemathesis_run(url: str, seconds: float) -> dict:
    """Every operation, valid and invalid inputs, round after round until ``seconds`` pass."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import (
        negative_data_rejection,
        positive_data_acceptance,
    )

    from wick.server.request_schemas import refused_beyond_any_schema

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    bounds = work_bounds(schema.raw_schema)
    tally = {"requests": 0, "5xx": 0, "rejected_valid": 0, "accepted_invalid": 0,
             "beyond_schema": 0}
    failures: dict[str, str] = {}
    deadline = time.monotonic() + seconds

    def check(case) -> None:
        if time.monotonic() > deadline:
            return
        case.body = bound_work(case.body, case.path, model, bounds)
        response = case.call(base_url=url, timeout=120)
        tally["requests"] += 1
        if response.status_code >= 500:
            tally["5xx"] += 1
            failures.setdefault(f"5xx {case.path}", response.text[:200])
            return
        error = None
        if response.status_code >= 400 and \
                response.headers.get("content-type", [""])[0] == "application/json":
            error = response.json().get("error", {})
        if error is not None and refused_beyond_any_schema(error):
            tally["beyond_schema"] += 1
            return
        try:
            case.validate_response(response, checks=[positive_data_acceptance,
                                                     negative_data_rejection])
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - schemathesis' FailureGroup
            key = "rejected_valid" if response.status_code >= 400 else "accepted_invalid"
            tally[key] += 1
            failures.setdefault(f"{key} {case.path}", f"{case.body!r:.300} -> "
                                                      f"{response.text[:200]} ({e!s:.100})")

    seed = 0
    while time.monotonic() < deadline:
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
                    continue  # nothing to make invalid
                @given(operation.as_strategy(generation_mode=mode))
                @settings(max_examples=100, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                def run(case) -> None:
                    check(case)

                try:
                    run()
                except Unsatisfiable:
                    pass
        seed += 1
    return {**tally, "rounds": seed, "failures": failures}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--disconnects", type=int, default=32)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--slowloris", type=int, default=200,
                   help="connections that never send a whole request head")
    p.add_argument("--schemathesis", type=float, default=300, metavar="SECONDS")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"which to run, comma-separated (default all: {','.join(PARTS)})")
    args = p.parse_args()
    sys.setrecursionlimit(20_000)  # (json.dumps of the nested schemas, in pure Python)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        p.error(f"unknown parts: {', '.join(sorted(parts - set(PARTS)))}")
    artifact = tiny_artifact()
    proc, url = start_server(artifact, "--body-timeout", "2", "--header-timeout", "2")
    try:
        streams = drops = battery = loris = grammars = fuzz = None
        if "streaming" in parts:
            streams = asyncio.run(streaming_rounds(url, args.clients, args.rounds, args.tokens))
        if "disconnects" in parts:
            drops = asyncio.run(disconnect_rounds(url, proc.pid, args.disconnects, args.rounds))
        if "hostile" in parts:
            battery = hostile(url)
        if "slowloris" in parts:
            loris = slowloris(url, args.slowloris, 2.0)
        if "grammar" in parts:
            grammars = grammar_battery(url, proc.pid, GRAMMARS)
        if "schemathesis" in parts:
            fuzz = schemathesis_run(url, args.schemathesis)
        alive = httpx.get(f"{url}/health").status_code == 200
    finally:
        proc.terminate()
        proc.wait(60)
    opened = None
    if "grammar" in parts:
        proc, open_url = start_server(artifact, "--grammar-max-bytes", "100000000",
                                      "--grammar-max-depth", "1000000",
                                      "--grammar-max-properties", "10000000",
                                      "--grammar-max-rules", "10000000",
                                      "--grammar-timeout", "60")
        try:
            opened = grammar_battery(open_url, proc.pid, CRASHERS)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"\nwick serve reliability (tiny random Llama q0f32, {url})")
    if grammars is not None:
        print_battery("grammar battery, default bounds (status, code, time):", grammars)
    if opened is not None:
        print_battery("the crashers with the bounds opened (a compile child each):", opened)
    if fuzz is not None:
        print(f"\nschemathesis, {args.schemathesis:.0f} s ({fuzz['rounds']} rounds): "
              f"{fuzz['requests']} requests, {fuzz['5xx']} 5xx, {fuzz['rejected_valid']} valid "
              f"requests refused, {fuzz['accepted_invalid']} invalid ones answered "
              f"({fuzz['beyond_schema']} refusals no schema can announce left out)")
        for key, detail in fuzz["failures"].items():
            print(f"  {key}: {detail}")
    if streams is not None:
        print(f"streaming: {streams['streams']} streams in {args.rounds} rounds of "
              f"{args.clients}, {streams['equal_solo']}/{streams['streams']} equal to the solo "
              f"answer, {streams['tok_s']:.0f} tok/s")
    if drops is not None:
        print(f"disconnects: {drops['dropped']} dropped mid-stream, KV pool whole again after "
              f"{drops['pool_whole_after']}, server RSS {drops['rss_mib']} MiB")
    if battery is not None:
        ok = sum(400 <= s < 500 and e for _, s, e in battery)
        print(f"hostile battery: {ok}/{len(battery)} answered with a 4xx OpenAI error")
        for name, status, is_error in battery:
            flag = "" if 400 <= status < 500 and is_error else "   <-- not a 4xx OpenAI error"
            print(f"  {status}  {name}{flag}")
    if loris is not None:
        print(f"slowloris: {loris['closed']}/{loris['opened']} connections without a whole "
              f"request head closed by the server (--header-timeout 2), the last after "
              f"{loris['last_s']:.1f} s")
    print(f"server {'still up' if alive else 'DOWN'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
