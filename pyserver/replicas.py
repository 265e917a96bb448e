"""What ``wick serve --replicas`` asks for, importable without Ray (pyserver/ray_serve.py runs
it)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Sequence


# how a request picks its replica (``--replica-router``; ray_serve.ROUTERS: the classes)
ROUTER_NAMES = ("prefix", "least-loaded", "round-robin")


@dataclass(frozen=True)
class Replicas:
    """A fixed count, or autoscaling bounds (Ray Serve's autoscaling on requests in flight);
    ``address``: an existing Ray cluster, else a local one started and stopped with the server;
    ``app``: the Serve application's name (one per ``wick serve`` on a cluster); ``gpus``: GPUs
    Ray reserves for each replica (fractions share one)."""

    fixed: int | None = None
    low: int | None = None
    high: int | None = None
    address: str | None = None
    router: str = "prefix"  # "least-loaded": Ray Serve's own (power of two choices); "round-robin"
    app: str = "wick"
    gpus: float = 0.0

    @property
    def least(self) -> int:
        """Replicas that must start for the server to be ready."""
        return self.fixed if self.fixed is not None else max(1, self.low or 0)

    @property
    def registry(self) -> str:
        """The name of the actor that holds the replicas' snapshots (one per application)."""
        return f"{self.app}-replica-registry"

    def deployment_options(self) -> dict[str, Any]:
        if self.fixed is not None:
            return {"num_replicas": self.fixed}
        return {"autoscaling_config": {"min_replicas": self.low, "max_replicas": self.high,
                                       "initial_replicas": self.least,
                                       "target_ongoing_requests": 4}}


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def replica_pool(models: Sequence[str], engine_options: dict, replicas: Replicas, *,
                 on_loaded: Callable[[str, Any], None] | None = None,
                 on_failed: Callable[[BaseException], None] | None = None,
                 progress_for: Callable[[str], Any] | None = None):
    from .ray_serve import ReplicaPool

    return ReplicaPool(models=list(models), engine_options=engine_options, scaling=replicas,
                       on_loaded=on_loaded, on_failed=on_failed, progress_for=progress_for)
