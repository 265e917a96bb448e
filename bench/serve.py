"""Benchmark ``wick serve``: N concurrent streaming chat clients; prints a table.

    python bench/serve.py                              # smollm2-135m-instruct, 1/4/16 clients
    python bench/serve.py --model ARTIFACT_OR_NAME --clients 1,4,16 --max-tokens 64
    python bench/serve.py --tiny                       # a tiny random Llama (quick, offline)
    python bench/serve.py --url http://127.0.0.1:8000  # a server that is already running
    python bench/serve.py --tiny --modes invariant,mixed  # batch-invariant steps vs mixed

Without ``--url`` the server runs in a child process (so that client and server do not share
one interpreter) on a free loopback port. Each client sends ``--requests`` requests one after
the other (greedy, ``ignore_eos``: every request makes exactly ``--max-tokens`` tokens).
requests/s and output tokens/s are over the wall time of a level; TTFT is from sending the
request to the first content chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str,
                      max_tokens: int) -> tuple[float, int]:
    """(seconds to the first content chunk, completion tokens) of one streamed chat."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, tokens = float("nan"), 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if ttft != ttft and any(c["delta"].get("content") for c in chunk["choices"]):
                ttft = time.perf_counter() - start
    return ttft, tokens


async def level(url: str, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker(i: int) -> list[tuple[float, int]]:
            return [await one_request(client, url, model, f"Client {i}, request {j}: tell me "
                                      "a story about a lighthouse.", max_tokens)
                    for j in range(requests)]

        start = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(worker(i) for i in range(clients)))
                   for r in rs]
        wall = time.perf_counter() - start
    ttfts = [t for t, _ in results]
    tokens = sum(n for _, n in results)
    return {"clients": clients, "requests": len(results), "req_s": len(results) / wall,
            "tok_s": tokens / wall, "ttft_p50": percentile(ttfts, 0.5),
            "ttft_p99": percentile(ttfts, 0.99), "wall": wall}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, *options: str):
    """``wick serve MODEL OPTIONS...`` in a child process on a free loopback port, once ready:
    (process, url)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "wick.server.cli", "serve", model,
                             "--port", str(port), "--log-level", "warning", *options])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 3600  # a first run compiles the model
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the server did not become ready")
        time.sleep(0.25)


def tiny_model(max_batch: int) -> str:
    """A tiny random Llama, compiled q0f32 (context window 256) into the wick cache."""
    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import make_tiny_llama
    from wick.compiler.compile import compile_model

    src = make_tiny_llama(Path(tempfile.gettempdir()) / "wick-bench-tiny-llama")
    return str(compile_model(str(src), "q0f32", context_window=256, max_batch_size=max_batch))


def run_mode(args, levels: list[int], mode: str) -> tuple[str, list[dict]]:
    """Every concurrency level against one server (started here unless ``--url``) in
    ``mode``; returns the served model's id and one row per level."""
    proc = None
    url = args.url
    if url is None:
        model = tiny_model(max(levels)) if args.tiny else args.model
        options = [*(["--quantization", args.quantization] if args.quantization else []),
                   *(["--kv-cache-mib", str(args.kv_cache_mib)] if args.kv_cache_mib else []),
                   *(["--no-batch-invariant"] if mode == "mixed" else [])]
        proc, url = start_server(model, *options)
    try:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        asyncio.run(level(url, model, 1, 1, 8))  # warm-up
        return model, [asyncio.run(level(url, model, c, args.requests, args.max_tokens))
                       for c in levels]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="model name, HF dir or artifact dir (default smollm2-135m-instruct)")
    p.add_argument("--tiny", action="store_true", help="bench a tiny random Llama instead")
    p.add_argument("--quantization", "-q")
    p.add_argument("--url", help="use this running server instead of starting one")
    p.add_argument("--clients", default="1,4,16", help="concurrency levels (default 1,4,16)")
    p.add_argument("--requests", type=int, default=4, help="requests per client (default 4)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kv-cache-mib", type=int)
    p.add_argument("--modes", default="invariant",
                   help="scheduling modes to run, comma-separated: 'invariant' (the default: "
                        "prompt and decode work in separate steps) and/or 'mixed' "
                        "(--no-batch-invariant); with both, the ratio of their throughputs")
    args = p.parse_args()
    modes = args.modes.split(",")
    if not modes or set(modes) - {"invariant", "mixed"}:
        p.error("--modes takes 'invariant', 'mixed' or both")
    levels = [int(c) for c in args.clients.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the child server

    if args.url is not None and len(modes) > 1:
        p.error("--url runs one server as it is: give one --modes value")
    results = {mode: run_mode(args, levels, mode) for mode in modes}
    model = next(iter(results.values()))[0]
    print(f"\nwick serve: {model}, {args.max_tokens} tokens per request, greedy "
          f"({os.uname().machine})")
    print("| mode | clients | requests | requests/s | output tok/s | TTFT p50 | TTFT p99 |")
    print("|------|--------:|---------:|-----------:|-------------:|---------:|---------:|")
    for mode, (_, rows) in results.items():
        for r in rows:
            print(f"| {mode} | {r['clients']:>7} | {r['requests']:>8} | {r['req_s']:>10.2f} | "
                  f"{r['tok_s']:>12.1f} | {r['ttft_p50'] * 1e3:>6.0f} ms | "
                  f"{r['ttft_p99'] * 1e3:>6.0f} ms |")
    if len(results) == 2:
        for inv, mix in zip(results["invariant"][1], results["mixed"][1]):
            print(f"{inv['clients']:>3} clients: invariant / mixed output tok/s = "
                  f"{inv['tok_s'] / mix['tok_s']:.2f}, TTFT p50 "
                  f"{inv['ttft_p50'] / mix['ttft_p50']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
