"""A replica's long work (a compile, a download, the weights' upload) shown by the server that
started it, as one server shows its own: the replica's ``progress(stage, done, total)`` calls go
to the application's registry actor (``ReplicaRegistry.progress``), and the server, while it
waits for its replicas, draws them with its own bars (``relay_progress``).

Several replicas load at once; the bars follow, for each model, the first replica that reports
work for it (the others wait for the same compile, under its build lock, or repeat it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ray

PROGRESS_EVERY_S = 0.2  # a replica's reports within a stage, at most this often
EVENTS_KEPT = 10_000  # the registry's log of reports (the oldest dropped first)


class ProgressLog:
    """The registry's side: reports numbered in arrival order, read from a cursor on."""

    def __init__(self) -> None:
        self._events: list[tuple[int, str, str, str, int, int]] = []
        self._next = 0

    def add(self, replica: str, model: str, stage: str, done: int, total: int) -> None:
        self._events.append((self._next, replica, model, stage, done, total))
        self._next += 1
        del self._events[:-EVENTS_KEPT]

    def since(self, cursor: int) -> list[tuple[int, str, str, str, int, int]]:
        return [e for e in self._events if e[0] >= cursor]


class ReplicaProgress:
    """The replica's side: a ``progress`` callback that sends each stage's first report, its
    completing one (``done >= total``), and the ones between at most every PROGRESS_EVERY_S;
    a report held back is sent before the next stage's first (a stage left unfinished shows
    where it was left). It does not wait for the registry."""

    def __init__(self, registry: Any, replica: str, model: str) -> None:
        self.registry, self.replica, self.model = registry, replica, model
        self._stage: str | None = None
        self._sent = 0.0
        self._held: tuple[str, int, int] | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if stage == self._stage and now - self._sent < PROGRESS_EVERY_S and \
                not (total and done >= total):
            self._held = (stage, done, total)
            return
        if stage != self._stage and self._held is not None:
            self._send(*self._held)
        self._held, self._stage, self._sent = None, stage, now
        self._send(stage, done, total)

    def _send(self, stage: str, done: int, total: int) -> None:
        self.registry.progress.remote(self.replica, self.model, stage, done, total)


def relay_progress(registry: Any, bars_for: Callable[[str], Any], stop: threading.Event,
                   lock: threading.Lock, ray_stopping: Callable[[], bool]) -> None:
    """Draw the replicas' reports with ``bars_for(model)`` (a ``progress`` callback with
    ``close()``) until ``stop`` is set, or Ray is being stopped (``ray_stopping()``, read under
    ``lock``: no call to Ray after, which would start it again); then close the bars."""
    followed: dict[str, tuple[str, Any]] = {}  # model -> (the replica followed, its bars)
    cursor = 0
    try:
        while True:
            stopping = stop.wait(0.25)
            try:
                with lock:
                    if ray_stopping():
                        return
                    events = ray.get(registry.progress_since.remote(cursor), timeout=5)
            except Exception:  # noqa: BLE001 - a slow or lost registry: nothing to draw yet
                events = []
            for seq, replica, model, stage, done, total in events:
                cursor = seq + 1
                replica_bars = followed.get(model)
                if replica_bars is None:
                    replica_bars = followed[model] = (replica, bars_for(model))
                if replica_bars[0] == replica:
                    replica_bars[1](stage, done, total)
            if stopping:
                return
    finally:
        for _, bars in followed.values():
            bars.close()
