"""``GET /metrics``: each served model's engine in Prometheus' text format (issue #32).

Where vLLM has a metric, the name is vLLM's with ``wick:`` in place of ``vllm:``, so that
dashboards, and the Kubernetes inference gateways that route on a replica's queue and KV-cache
use (llm-d, the Gateway API Inference Extension), read wick as they read vLLM:

    wick:num_requests_running, wick:num_requests_waiting      gauges
    wick:kv_cache_usage_perc        0-1: pages held by requests (cached-but-free ones are not)
    wick:prompt_tokens_total, wick:generation_tokens_total    counters
    wick:prefix_cache_queries_total, wick:prefix_cache_hits_total   prompt tokens looked up
                                    in the prefix cache, and found there (counters)
    wick:request_success_total{finished_reason="stop"|"length"|"abort"}
    wick:time_to_first_token_seconds, wick:inter_token_latency_seconds,
    wick:e2e_request_latency_seconds                            histograms

and wick's own ``wick:prefix_cache_hit_ratio`` (hits over queries since the start; for a rate,
divide the counters' rates). Each has the label ``model`` (the served name). A request of ``n``
choices counts once (its prompt, its place in the queue, its end); an aborted request ends
too (``finished_reason="abort"``, its end-to-end time included, even when it never ran). The
engine keeps the numbers (``engine/metrics.py``, plain Python: it runs in a browser too); this
collector reads them at each scrape, so nothing is copied per request."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

PREFIX = "wick:"
FINISHED_REASONS = ("stop", "length", "abort")  # (each reported, 0 until it happens)


class EngineCollector(Collector):
    """The metrics of ``engines()`` (served name -> an engine with ``.core``), read at scrape
    time."""

    def __init__(self, engines: Callable[[], Mapping[str, Any]]) -> None:
        self._engines = engines

    def collect(self) -> Iterable[Metric]:
        engines = dict(self._engines())
        labels = ["model"]
        states = {model: e.core.requests_by_state() for model, e in engines.items()}

        def gauge(name: str, doc: str, value: Callable[[Any], float]) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            for model, e in engines.items():
                g.add_metric([model], value(e.core))
            return g

        def counter(name: str, doc: str, value: Callable[[Any], float]) -> CounterMetricFamily:
            c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            for model, e in engines.items():
                c.add_metric([model], value(e.core))
            return c

        for name, doc, i in (("num_requests_running",
                              "Requests with a sequence in the running batch.", 0),
                             ("num_requests_waiting", "Requests waiting to be scheduled.", 1)):
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            for model in engines:
                g.add_metric([model], states[model][i])
            yield g
        yield gauge("kv_cache_usage_perc",
                    "Fraction of KV-cache pages held by requests (1 = full); pages kept only "
                    "for the prefix cache count as free.", kv_cache_usage)
        yield gauge("prefix_cache_hit_ratio",
                    "Prompt tokens the prefix cache gave, over the prompt tokens looked up.",
                    lambda core: core.metrics.prefix_cache_hit_ratio)
        yield counter("prompt_tokens", "Prompt tokens processed (cached ones included).",
                      lambda core: core.metrics.prompt_tokens)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      lambda core: core.metrics.prefix_queries)
        yield counter("prefix_cache_hits", "Prompt tokens the prefix cache gave.",
                      lambda core: core.metrics.prefix_hits)
        yield counter("generation_tokens", "Tokens generated.",
                      lambda core: core.metrics.generation_tokens)
        success = CounterMetricFamily(PREFIX + "request_success",
                                      "Finished requests, by the reason they finished.",
                                      labels=["model", "finished_reason"])
        for model, e in engines.items():
            counts = e.core.metrics.request_success
            for reason in sorted(set(FINISHED_REASONS) | set(counts)):
                success.add_metric([model, reason], counts.get(reason, 0))
        yield success
        for name, doc, attr in (
                ("time_to_first_token_seconds", "From a request's arrival to its first token.",
                 "ttft"),
                ("inter_token_latency_seconds", "Between a request's successive outputs.",
                 "itl"),
                ("e2e_request_latency_seconds", "From a request's arrival to its end.", "e2e")):
            h = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
            for model, e in engines.items():
                hist = getattr(e.core.metrics, attr)
                h.add_metric([model], [(_le(b), n) for b, n in hist.cumulative()], hist.sum)
            yield h


def kv_cache_usage(core) -> float:
    kv = core.kv
    held = kv.num_pages - kv.free_pages - kv.cached_pages
    return held / kv.num_pages if kv.num_pages else 0.0


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def metrics_registry(engines: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engines))
    return registry
