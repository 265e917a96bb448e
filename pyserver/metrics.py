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
too (``finished_reason="abort"``, its end-to-end time included, even when it never ran). Under
``--replicas`` (pyserver/ray_serve.py) each replica's numbers carry the label ``replica``. The
engine keeps the numbers (``engine/metrics.py``, plain Python: it runs in a browser too); this
collector reads them at each scrape, so nothing is copied per request."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

PREFIX = "wick:"
FINISHED_REASONS = ("stop", "length", "abort")  # (each reported, 0 until it happens)


class EngineCollector(Collector):
    """The metrics of ``cores()`` (``(served name, replica or None, engine core)`` triples:
    ModelPool.cores), read at scrape time; the label ``replica`` where there are replicas."""

    def __init__(self, cores: Callable[[], Iterable[tuple[str, str | None, Any]]]) -> None:
        self._cores = cores

    def collect(self) -> Iterable[Metric]:
        cores = list(self._cores())
        replicas = any(replica is not None for _, replica, _ in cores)
        labels = ["model", "replica"] if replicas else ["model"]

        def label(model: str, replica: str | None) -> list[str]:
            return [model, replica or ""] if replicas else [model]

        states = [core.requests_by_state() for _, _, core in cores]

        def family(kind, name: str, doc: str, value: Callable[[Any], float]):
            f = kind(PREFIX + name, doc, labels=labels)
            for model, replica, core in cores:
                f.add_metric(label(model, replica), value(core))
            return f

        for name, doc, i in (("num_requests_running",
                              "Requests with a sequence in the running batch.", 0),
                             ("num_requests_waiting", "Requests waiting to be scheduled.", 1)):
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            for (model, replica, _), state in zip(cores, states):
                g.add_metric(label(model, replica), state[i])
            yield g
        yield family(GaugeMetricFamily, "kv_cache_usage_perc",
                     "Fraction of KV-cache pages held by requests (1 = full); pages kept only "
                     "for the prefix cache count as free.", kv_cache_usage)
        yield family(GaugeMetricFamily, "prefix_cache_hit_ratio",
                     "Prompt tokens the prefix cache gave, over the prompt tokens looked up.",
                     lambda core: core.metrics.prefix_cache_hit_ratio)
        for name, doc, attr in (
                ("prompt_tokens", "Prompt tokens processed (cached ones included).",
                 "prompt_tokens"),
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                 "prefix_queries"),
                ("prefix_cache_hits", "Prompt tokens the prefix cache gave.", "prefix_hits"),
                ("generation_tokens", "Tokens generated.", "generation_tokens")):
            yield family(CounterMetricFamily, name, doc,
                         lambda core, attr=attr: getattr(core.metrics, attr))
        success = CounterMetricFamily(PREFIX + "request_success",
                                      "Finished requests, by the reason they finished.",
                                      labels=[*labels, "finished_reason"])
        for model, replica, core in cores:
            counts = core.metrics.request_success
            for reason in sorted(set(FINISHED_REASONS) | set(counts)):
                success.add_metric([*label(model, replica), reason], counts.get(reason, 0))
        yield success
        for name, doc, attr in (
                ("time_to_first_token_seconds", "From a request's arrival to its first token.",
                 "ttft"),
                ("inter_token_latency_seconds", "Between a request's successive outputs.",
                 "itl"),
                ("e2e_request_latency_seconds", "From a request's arrival to its end.", "e2e")):
            h = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
            for model, replica, core in cores:
                hist = getattr(core.metrics, attr)
                h.add_metric(label(model, replica), [(_le(b), n) for b, n in hist.cumulative()],
                             hist.sum)
            yield h


def kv_cache_usage(core) -> float:
    kv = core.kv
    held = kv.num_pages - kv.free_pages - kv.cached_pages
    return held / kv.num_pages if kv.num_pages else 0.0


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def metrics_registry(cores: Callable[[], Iterable[tuple[str, str | None, Any]]]
                     ) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(cores))
    return registry
