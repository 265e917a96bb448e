"""Scale-out benchmark: ``wick serve --replicas`` on Ray Serve, 1 vs 2 replicas, and prefix-aware
vs round-robin and least-loaded routing on a shared-system-prompt workload.

    python bench/scale.py [--model smollm2-135m-instruct] [--quantization q4f32_1]
                          [--clients 8] [--requests 4] [--max-tokens 16] [--device cpu]
                          [--out bench/results/scale.json]

Each configuration is a ``wick serve`` child process (the CLI, as a user runs it) on a free
loopback port, stopped with SIGTERM afterwards (its exit status and any Ray process left behind
are reported). Two workloads, each ``--clients`` concurrent clients sending ``--requests``
streamed chats one after the other (greedy, ``ignore_eos``):

* **distinct**: every request its own prompt: throughput (output tok/s) and TTFT p50/p95;
* **shared**: one long system prompt (~600 tokens) and a short question per request:
  TTFT p50/p95 and the share of prompt tokens served from a prefix cache
  (``usage.prompt_tokens_details.cached_tokens``).

On a machine with few cores the replicas share them: what two replicas can show here is
routing (cached tokens, TTFT), not throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import free_port, percentile  # noqa: E402

SYSTEM = ("You are the support assistant of a regional rail company. You answer questions "
          "about timetables, tickets, refunds, bicycles on trains, accessibility and delays. "
          "Be brief and precise, quote the rule you apply, and say when a passenger should "
          "call the service desk instead. ") * 6


async def chat(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int
               ) -> tuple[float, int, int, int]:
    """(TTFT s, completion tokens, prompt tokens, cached prompt tokens) of one streamed chat."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start, ttft, usage = time.perf_counter(), float("nan"), {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif ttft != ttft and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
    details = usage.get("prompt_tokens_details") or {}
    return ttft, usage["completion_tokens"], usage["prompt_tokens"], details.get("cached_tokens") or 0


async def workload(url: str, shared: bool, clients: int, requests: int, max_tokens: int) -> dict:
    async def client_run(c: int, client: httpx.AsyncClient) -> list:
        out = []
        for r in range(requests):
            question = f"Client {c}, question {r}: can I bring a folding bike on the 7:{10 + r} train?"
            messages = ([{"role": "system", "content": SYSTEM}] if shared else []) + [
                {"role": "user", "content": question if shared else
                 f"{question} Also tell me about route {c * 97 + r} and its history."}]
            out.append(await chat(client, url, messages, max_tokens))
        return out

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        results = [x for rs in await asyncio.gather(*(client_run(c, client) for c in range(clients)))
                   for x in rs]
        wall = time.perf_counter() - start
    ttfts = [t for t, *_ in results]
    return {"tok_s": sum(n for _, n, _, _ in results) / wall,
            "ttft_p50": percentile(ttfts, 0.5), "ttft_p95": percentile(ttfts, 0.95),
            "cached_share": sum(c for *_, c in results) / max(1, sum(p for *_, p, _ in results))}


def ray_processes() -> int:
    out = subprocess.run(["pgrep", "-fc", "raylet|gcs_server"], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def run_config(args, replicas: int, router: str) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "wick.server.cli", "serve", args.model, "--port", str(port),
           "--device", args.device, "--log-level", "warning", "--no-browser-variants"]
    if args.quantization:
        cmd += ["--quantization", args.quantization]
    if replicas:
        cmd += ["--replicas", str(replicas), "--replica-router", router]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=5)
                if health.status_code == 200 and len(health.json().get("replicas", {1: 0})) >= \
                        max(1, replicas):
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start ({' '.join(cmd)})")
            time.sleep(0.5)
        out = {name: asyncio.run(workload(url, name == "shared", args.clients, args.requests,
                                          args.max_tokens)) for name in ("distinct", "shared")}
    finally:
        proc.send_signal(signal.SIGTERM)
        out_code = proc.wait(timeout=120)
    time.sleep(2)
    return {**out, "exit": out_code, "ray_left": ray_processes()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--quantization", default="q4f32_1")
    p.add_argument("--device", default="cpu")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", type=Path, help="also write the numbers here (JSON)")
    args = p.parse_args()
    configs = [("one server, no Ray", 0, "prefix"), ("1 replica", 1, "prefix"),
               ("2 replicas, prefix-aware", 2, "prefix"),
               ("2 replicas, round-robin", 2, "round-robin"),
               ("2 replicas, least-loaded", 2, "least-loaded")]
    runs = []
    print(f"{args.model} {args.quantization} on {args.device}, {os.cpu_count()} cores; "
          f"{args.clients} clients x {args.requests} requests x {args.max_tokens} tokens")
    print("| configuration | distinct: tok/s | TTFT p50 / p95 s | shared: tok/s | TTFT p50 / p95 s "
          "| cached prompt share | exit, Ray processes left |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for label, replicas, router in configs:
        r = run_config(args, replicas, router)
        d, s = r["distinct"], r["shared"]
        print(f"| {label} | {d['tok_s']:.1f} | {d['ttft_p50']:.2f} / {d['ttft_p95']:.2f} | "
              f"{s['tok_s']:.1f} | {s['ttft_p50']:.2f} / {s['ttft_p95']:.2f} | "
              f"{100 * s['cached_share']:.0f} % | {r['exit']}, {r['ray_left']} |", flush=True)
        runs.append({"configuration": label, "replicas": replicas, "router": router, **r})
    if args.out:
        args.out.write_text(json.dumps({
            "model": args.model, "quantization": args.quantization, "device": args.device,
            "cores": os.cpu_count(), "clients": args.clients, "requests": args.requests,
            "max_tokens": args.max_tokens, "date": time.strftime("%Y-%m-%d"),
            "runs": runs}, indent=1).replace("NaN", "null") + "\n")


if __name__ == "__main__":
    main()
