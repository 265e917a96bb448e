"""The models a server answers with (``ModelPool``): loaded in the background, in order, and
selected by a request's ``model`` field; ``/health``'s view of an engine."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine import AsyncEngineAPI
from ..engine.errors import ModelNotFoundError, WickError

log = logging.getLogger("wick.server")


class ServiceUnavailableError(WickError):
    default_status = 503
    default_type = "service_unavailable"
    default_code = "model_loading"


Loader = Callable[[], AsyncEngineAPI]


@dataclass
class ModelPool:
    """The engines this server answers with, by name; ``load()`` builds them in order.

    ``state`` is ``loading`` -> ``ready`` (every loader done) or ``failed`` (one raised). A
    model serves as soon as it is loaded. Names: the engine's ``model_id`` (``/v1/models``),
    also ``model_id-quantization`` and the name it was loaded by; a request without ``model``
    gets the first model.
    """

    loaders: Sequence[tuple[str, Loader]] = ()  # (label for logs, loader)
    on_loaded: Callable[[str, AsyncEngineAPI], None] | None = None
    on_failed: Callable[[BaseException], None] | None = None
    state: str = "loading"
    loading: str | None = None  # label of the model being loaded
    error: str | None = None
    engines: dict[str, AsyncEngineAPI] = field(default_factory=dict)  # listed name -> engine
    _aliases: dict[str, str] = field(default_factory=dict)  # any accepted name -> listed name
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, *engines: AsyncEngineAPI) -> ModelPool:
        """A pool of engines that are already loaded."""
        pool = cls(state="ready")
        for engine in engines:
            pool.add(engine)
        return pool

    def add(self, engine: AsyncEngineAPI) -> str:
        model_id, full = engine.core.info.names
        name = model_id if model_id not in self._aliases else full
        if name in self._aliases:
            raise ValueError(f"model {full} is served twice")
        self.engines[name] = engine
        for alias in (name, full):
            self._aliases.setdefault(alias, name)
        return name

    async def load(self) -> None:
        try:
            for label, loader in self.loaders:
                self.loading = label
                engine = await _in_daemon_thread(loader)
                name = self.add(engine)
                # the name it was served by works too (wick serve hf://ORG/REPO: the model id
                # is ORG/REPO, as vLLM lists it; a client may send either)
                self._aliases.setdefault(label, name)
                if self.on_loaded is not None:
                    self.on_loaded(name, engine)
            self.state, self.loading = "ready", None
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"
            log.error("loading %s failed: %s", self.loading, self.error)
            if self.on_failed is not None:
                self.on_failed(e)

    def select(self, model: Any) -> AsyncEngineAPI:
        """The engine a request's ``model`` field names (a non-string goes to the first engine,
        whose validation rejects it)."""
        if isinstance(model, str):
            name = self._aliases.get(model)
            if name is not None:
                return self.engines[name]
        elif self.engines:
            return next(iter(self.engines.values()))
        if self.state == "loading":
            raise ServiceUnavailableError(
                f"wick is still loading {self.loading or 'its models'}; retry once GET /health "
                "answers 200.")
        if self.state == "failed":
            raise ServiceUnavailableError(f"loading the model failed: {self.error}",
                                          code="model_load_failed")
        if model is None:
            raise ServiceUnavailableError("no model is loaded", code="model_loading")
        raise ModelNotFoundError(model, self.engines)

    def cores(self) -> list[tuple[str, str | None, Any]]:
        """``(served name, replica, engine core)`` per engine (replica None: in-process)."""
        return [(name, None, e.core) for name, e in self.engines.items()]

    def replicas(self) -> dict[str, Any] | None:
        """Per replica, what /health says of it (None: no replicas, the engines run here)."""
        return None

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()


def engine_health(core: Any) -> dict[str, Any]:
    """What /health says of an engine core (of each replica's too, under --replicas); with
    ``step_error`` while its runner's last call failed (a lost device)."""
    health = {"requests": core.num_unfinished(), "kv_pages": core.kv.num_pages,
              "kv_pages_free": core.kv.free_pages, "kv_pages_cached": core.kv.cached_pages,
              "speculation": core.stats.speculation(),
              # what a request leaving sampling fields unset gets, and why
              "sampling_defaults": core.info.sampling_defaults}
    if core.runner_error is not None:
        health["step_error"] = core.runner_error
    return health


async def _in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a daemon thread (a compile must not keep Ctrl-C from exiting)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the server stopped (its loop closed) while this was loading
            pass

    threading.Thread(target=run, name="wick-load", daemon=True).start()
    return await future
