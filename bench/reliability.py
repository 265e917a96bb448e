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

The server runs in a child process (``wick serve`` with ``--body-timeout 2``
``--header-timeout 2``) on a free port;
its log (warnings and errors only) goes to this terminal: a traceback there is a failure too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

from serve import start_server  # bench/serve.py: `wick serve` in a child process

ROOT = Path(__file__).resolve().parent.parent


def tiny_artifact() -> str:
    sys.path.insert(0, str(ROOT))
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--disconnects", type=int, default=32)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--slowloris", type=int, default=200,
                   help="connections that never send a whole request head")
    args = p.parse_args()
    proc, url = start_server(tiny_artifact(), "--body-timeout", "2", "--header-timeout", "2")
    try:
        streams = asyncio.run(streaming_rounds(url, args.clients, args.rounds, args.tokens))
        drops = asyncio.run(disconnect_rounds(url, proc.pid, args.disconnects, args.rounds))
        battery = hostile(url)
        loris = slowloris(url, args.slowloris, 2.0)
        alive = httpx.get(f"{url}/health").status_code == 200
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"\nwick serve reliability (tiny random Llama q0f32, {url})")
    print(f"streaming: {streams['streams']} streams in {args.rounds} rounds of {args.clients}, "
          f"{streams['equal_solo']}/{streams['streams']} equal to the solo answer, "
          f"{streams['tok_s']:.0f} tok/s")
    print(f"disconnects: {drops['dropped']} dropped mid-stream, KV pool whole again after "
          f"{drops['pool_whole_after']}, server RSS {drops['rss_mib']} MiB")
    ok = sum(400 <= s < 500 and e for _, s, e in battery)
    print(f"hostile battery: {ok}/{len(battery)} answered with a 4xx OpenAI error; server "
          f"{'still up' if alive else 'DOWN'}")
    for name, status, is_error in battery:
        flag = "" if 400 <= status < 500 and is_error else "   <-- not a 4xx OpenAI error"
        print(f"  {status}  {name}{flag}")
    print(f"slowloris: {loris['closed']}/{loris['opened']} connections without a whole request "
          f"head closed by the server (--header-timeout 2), the last after "
          f"{loris['last_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
