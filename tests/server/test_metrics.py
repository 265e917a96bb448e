"""GET /metrics (issue #32): Prometheus' text format, parsed with prometheus_client's own
parser; every value checked against a known load (the requests this module sends, their
``usage``) and against /health."""

from __future__ import annotations

import httpx
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
    # the hit ratio is hits over look-ups (= prompt tokens), since the server started
    hits = [round(value(m, "wick:prefix_cache_hit_ratio", model)
                  * value(m, "wick:prompt_tokens_total", model)) for m in (before, after)]
    assert hits[1] - hits[0] == sum(cached(u) for u in usages) > usages[0].prompt_tokens // 2
    assert value(after, "wick:num_requests_running", model) == 0
    assert value(after, "wick:num_requests_waiting", model) == 0
    assert value(after, "wick:kv_cache_usage_perc", model) == 0
    health = httpx.get(f"{server.url}/health").json()["engines"][model]
    assert health["kv_pages_free"] + health["kv_pages_cached"] == health["kv_pages"]


def test_a_running_stream_shows_and_its_abort_is_counted(server, names):
    """While a stream runs its request is running and holds KV pages; the client leaving
    aborts it (finished_reason "abort"), and its pages are let go."""
    model = names[0]
    before = scrape(server)
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": model, "prompt": "hello", "max_tokens": 100,
                            "temperature": 0, "ignore_eos": True, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                during = scrape(server)
                break  # (closing the connection aborts the request)
    assert value(during, "wick:num_requests_running", model) == 1
    assert value(during, "wick:num_requests_waiting", model) == 0
    assert 0 < value(during, "wick:kv_cache_usage_perc", model) <= 1
    for _ in range(200):  # the abort lands at the engine's next step
        after = scrape(server)
        if value(after, "wick:num_requests_running", model) == 0:
            break
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
