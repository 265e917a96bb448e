"""GET /metrics (issue #32): Prometheus' text format, parsed with prometheus_client's own
parser; every value checked against a known load (the requests this module sends, their
``usage``) and against /health."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

PROMPT = "The lighthouse keeper climbed the stairs to light the lamp at dusk, as every night"


def scrape(server) -> dict:
    """{(sample name, frozenset(labels)): value} of one scrape."""
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: dict, name: str, model: str, **labels) -> float:
    return m[(name, frozenset({"model": model, **labels}.items()))]


def test_every_metric_is_there_for_every_model(server, names):
    m = scrape(server)
    for model in names:
        for name in ("wick:num_requests_running", "wick:num_requests_waiting",
                     "wick:kv_cache_usage_perc", "wick:prefix_cache_hit_ratio",
                     "wick:prompt_tokens_total", "wick:generation_tokens_total",
                     "wick:time_to_first_token_seconds_count",
                     "wick:inter_token_latency_seconds_count",
                     "wick:e2e_request_latency_seconds_sum"):
            assert value(m, name, model) >= 0
        for reason in ("stop", "length", "abort"):
            assert value(m, "wick:request_success_total", model, finished_reason=reason) >= 0
        assert value(m, "wick:time_to_first_token_seconds_bucket", model, le="+Inf") == \
            value(m, "wick:time_to_first_token_seconds_count", model)


def cached(usage) -> int:
    details = usage.prompt_tokens_details
    return details.cached_tokens if details is not None and details.cached_tokens else 0


def test_counters_and_histograms_follow_a_known_load(server, names, client):
    """Three completions one after another (5 tokens each, EOS ignored; their shared start
    comes from the prefix cache after the first), then the first again: the counters move by
    the requests' own usage, every histogram by one observation per request (4 between
    tokens: 5 tokens, one a step), and an idle engine holds no KV."""
    model = names[0]
    before = scrape(server)
    usages = []
    for i in (0, 1, 2, 0):
        r = client.completions.create(model=model, prompt=f"{PROMPT} ({i})", max_tokens=5,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
        usages.append(r.usage)
    after = scrape(server)

    def delta(name, **labels):
        return value(after, name, model, **labels) - value(before, name, model, **labels)

    assert delta("wick:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("wick:generation_tokens_total") == sum(u.completion_tokens for u in usages) == 20
    assert delta("wick:request_success_total", finished_reason="length") == 4
    assert delta("wick:request_success_total", finished_reason="stop") == 0
    assert delta("wick:request_success_total", finished_reason="abort") == 0
    for name in ("time_to_first_token", "e2e_request_latency"):
        assert delta(f"wick:{name}_seconds_count") == 4
        assert delta(f"wick:{name}_seconds_bucket", le="+Inf") == 4
    assert delta("wick:inter_token_latency_seconds_count") == 16
    assert 0 < delta("wick:time_to_first_token_seconds_sum") < \
        delta("wick:e2e_request_latency_seconds_sum")
    hits = delta("wick:prefix_cache_hits_total")
    assert hits == sum(cached(u) for u in usages) > usages[0].prompt_tokens // 2
    assert delta("wick:prefix_cache_queries_total") == delta("wick:prompt_tokens_total")
    assert value(after, "wick:prefix_cache_hit_ratio", model) == pytest.approx(
        value(after, "wick:prefix_cache_hits_total", model)
        / value(after, "wick:prefix_cache_queries_total", model))
    assert value(after, "wick:num_requests_running", model) == 0
    assert value(after, "wick:num_requests_waiting", model) == 0
    assert value(after, "wick:kv_cache_usage_perc", model) == 0
    health = httpx.get(f"{server.url}/health").json()["engines"][model]
    assert health["kv_pages_free"] + health["kv_pages_cached"] == health["kv_pages"]
    assert health["kv_pages_cached"] > 0  # (cached pages: free to take, not counted as used)


def test_a_running_stream_shows_and_its_abort_is_counted(server, names):
    """While a stream runs its request is running and holds KV pages (the engine is held at
    its second step, so the request cannot end first); the client leaving aborts it
    (finished_reason "abort"), and its pages are let go."""
    import threading
    import time

    model = names[0]
    runner = server.pool.engines[model].core.runner
    gate, passes, step = threading.Event(), [1], runner.step

    def gated_step(batch):  # (the runner's steps run on a worker thread: this one may wait)
        if passes[0] > 0:
            passes[0] -= 1
        else:
            gate.wait(60)
        return step(batch)

    before = scrape(server)
    runner.step = gated_step
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                          json={"model": model, "prompt": "hello", "max_tokens": 100,
                                "temperature": 0, "ignore_eos": True, "stream": True}) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()  # (held: a dropped line iterator closes the connection)
            assert next(line for line in lines if line.startswith("data: {"))
            during = scrape(server)  # (the engine waits at its second step meanwhile)
            health = httpx.get(f"{server.url}/health").json()["engines"][model]
        # (the connection is closed: the request is aborted at the engine's next step)
    finally:
        gate.set()
        del runner.step
    assert value(during, "wick:num_requests_running", model) == 1
    assert value(during, "wick:num_requests_waiting", model) == 0
    assert 0 < value(during, "wick:kv_cache_usage_perc", model) <= 1
    # the same engine state as /health's
    assert health["requests"] == 1
    held = health["kv_pages"] - health["kv_pages_free"] - health["kv_pages_cached"]
    assert value(during, "wick:kv_cache_usage_perc", model) == pytest.approx(
        held / health["kv_pages"])
    deadline = time.monotonic() + 30
    while value(after := scrape(server), "wick:num_requests_running", model):
        assert time.monotonic() < deadline, "the abort never landed"
        time.sleep(0.05)
    assert value(after, "wick:request_success_total", model, finished_reason="abort") == \
        value(before, "wick:request_success_total", model, finished_reason="abort") + 1
    assert value(after, "wick:kv_cache_usage_perc", model) == 0
    assert value(after, "wick:e2e_request_latency_seconds_count", model) == \
        value(before, "wick:e2e_request_latency_seconds_count", model) + 1


def test_metrics_follow_the_api_key(tiny_a):
    from fastapi.testclient import TestClient

    from wick.server.app import ModelPool, create_app

    app = create_app(ModelPool.of(), api_key="sekret")
    with TestClient(app, base_url="http://localhost") as c:
        assert c.get("/metrics").status_code == 401
        r = c.get("/metrics", headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200
        names = {f.name for f in text_string_to_metric_families(r.text)}
        assert "wick:kv_cache_usage_perc" in names  # (no model: the families, no samples)
