"""What an engine counts for monitoring (issue #32): tokens, finished requests by reason, the
prefix cache's hits, and latency histograms (time to first token, between tokens, end to end).

Kept here in plain Python (the engine runs in Pyodide too); the server exposes them in
Prometheus' text format (``pyserver/metrics.py``, with ``prometheus_client``) under the names
vLLM's dashboards and Kubernetes inference gateways read, ``wick:`` in place of ``vllm:``.
Histograms count by fixed upper bounds, as Prometheus histograms do: a scrape reads the
cumulative counts, so nothing is kept per request."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

# upper bounds in seconds (vLLM's): time to first token, between tokens, whole requests
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(slots=True)
class Histogram:
    """Counts of observations by upper bound (``le``), their sum and number."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bound, then one for +Inf
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # (le: a value on a bound counts in it)
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper bound, observations <= it), ..., (inf, count)]``."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out


@dataclass(slots=True)
class EngineMetrics:
    prompt_tokens: int = 0  # of requests whose prompt was processed (cached ones included)
    generation_tokens: int = 0  # tokens generated (kept drafts included)
    # finished requests by the reason their last sequence ended: stop, length, abort
    request_success: Counter = field(default_factory=Counter)
    prefix_hits: int = 0  # prompt tokens the prefix cache gave (of prefix_queries)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    @property
    def prefix_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache: every prompt token is."""
        return self.prompt_tokens

    @property
    def prefix_cache_hit_ratio(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
