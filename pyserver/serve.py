"""``wick serve MODEL [MODEL ...]``: the REST server on this machine's GPU.

The server starts listening at once (``/health`` answers 503) and loads the models in the
background, compiling them on first use with progress on stderr; then it logs

    INFO  wick serving smollm2-135m-instruct (q4f16_1, wgpu: <adapter>) on http://127.0.0.1:8000

A model that fails to load stops the server with exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("wick.server")
QUANTIZATIONS = ("q4f16_1", "q4f32_1", "q0f16", "q0f32")
MAX_BODY_MIB = 4  # (fastapi and the engine load only when the server runs: `wick list` stays fast)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``wick serve`` flags (for ``build_parser`` in cli.py)."""
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="built-in name (wick models), Hugging Face dir, .gguf file or compiled "
                        "artifact dir; several may be served, the request's 'model' selects")
    p.add_argument("--model", "-m", action="append", default=[], dest="more_models",
                   metavar="MODEL", help="another model to serve (repeatable)")
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                   help="default: the best the device supports")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks one)")
    p.add_argument("--api-key", default=os.environ.get("WICK_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $WICK_API_KEY; "
                        "none: no key needed)")
    p.add_argument("--cors-origin", action="append", default=[], dest="cors_origins",
                   metavar="ORIGIN", help="allow browser pages from ORIGIN (repeatable; "
                                          "default: no cross-origin access)")
    p.add_argument("--kv-cache-mib", type=int,
                   help="KV cache budget per model in MiB (default 256)")
    p.add_argument("--max-body-mib", type=float, default=MAX_BODY_MIB,
                   help=f"largest request body accepted (default {MAX_BODY_MIB})")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   default="info")


def serve_main(args: argparse.Namespace) -> int:
    """``wick serve`` with the arguments of ``add_serve_arguments``; returns the exit status."""
    models = [*args.models, *args.more_models]
    if not models:
        print("error: name at least one model to serve (wick serve MODEL)", file=sys.stderr)
        return 2
    return run_server(
        models, host=args.host, port=args.port, api_key=args.api_key,
        cors_origins=args.cors_origins, quantization=args.quantization, device=args.device,
        kv_cache_bytes=args.kv_cache_mib << 20 if args.kv_cache_mib else None,
        max_body_bytes=int(args.max_body_mib * (1 << 20)), log_level=args.log_level,
    )


def run_server(
    models: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
    quantization: str | None = None,
    device: str = "auto",
    kv_cache_bytes: int | None = None,
    max_body_bytes: int = MAX_BODY_MIB << 20,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> int:
    """Serve ``models`` until interrupted. Returns 0, or 1 when a model failed to load."""
    import ipaddress

    import uvicorn

    from ..compiler.paths import artifacts_dir
    from ..engine.artifact import MANIFEST_NAME
    from .app import ModelPool, create_app
    from .artifact_host import ArtifactHost
    from .cli import ProgressBars
    from .local import AsyncEngine

    setup_logging(log_level)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        log.warning("listening on %s without --api-key: anyone who can reach this address "
                    "can use the models", host)
    host_artifacts = ArtifactHost(artifacts_dir())
    for m in models:  # artifact dirs outside the cache are served too, by their dir name
        if (Path(m) / MANIFEST_NAME).is_file():
            host_artifacts.add(Path(m))

    def loader(model: str):
        def load():
            bars = ProgressBars()
            try:
                return AsyncEngine(model, quantization=quantization, device=device,
                                   kv_cache_bytes=kv_cache_bytes, progress=bars)
            finally:
                bars.close()
        return model, load

    state = {"failed": False}
    server: uvicorn.Server | None = None
    sock = sock or bind_socket(host, port)
    url = _url(sock)

    def on_loaded(name: str, engine) -> None:
        info = engine.core.info
        log.info("wick serving %s (%s, %s) on %s", name, info.quantization,
                 getattr(engine, "device_name", "?"), url)

    def on_failed(err: BaseException) -> None:
        state["failed"] = True
        if server is not None:
            server.should_exit = True

    pool = ModelPool([loader(m) for m in models], on_loaded=on_loaded, on_failed=on_failed)
    app = create_app(pool, api_key=api_key, cors_origins=cors_origins,
                     max_body_bytes=max_body_bytes, artifacts=host_artifacts)
    log.info("loading %s; %s/health answers 503 until ready", ", ".join(models), url)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, log_config=None,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 1 if state["failed"] else 0


class ServerThread:
    """``app`` served by uvicorn in a daemon thread on ``host:port`` (0: a free port); for
    tests and benchmarks. ``url`` is set once it listens; ``stop()`` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning") -> None:
        import threading

        import uvicorn

        self.app = app
        self.sock = bind_socket(host, port)
        self.url = _url(self.sock)
        config = uvicorn.Config(app, log_level=log_level, access_log=False, log_config=None,
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="wick-serve", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread ended before it started listening")
            self.thread.join(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def setup_logging(level: str = "info") -> None:
    """``INFO  message`` lines on stderr for wick's logger (uvicorn's own keep their format)."""
    logger = logging.getLogger("wick")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)-5s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
