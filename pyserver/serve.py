"""``wick serve MODEL [MODEL ...]``: the REST server on this machine's GPU.

The server starts listening at once (``/health`` answers 503) and loads the models in the
background, compiling them on first use with progress on stderr; then it logs

    INFO  wick serving smollm2-135m-instruct (q4f16_1, wgpu: <adapter>) on http://127.0.0.1:8000

A model that fails to load stops the server with exit status 1. On SIGTERM or Ctrl-C it stops
accepting, gives running requests ``--shutdown-grace`` seconds, then ends the rest with an error
(streams: an error event and ``[DONE]``).

Browsers get the variants their WebGPU adapter runs: for a served f16 model, its f32 twin is
compiled in the background (``browser_variants.py``; ``--no-browser-variants`` skips it).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence

from ..compiler.quantization import QUANTIZATIONS as _SCHEMES
from ..native.devices import DEVICE_HELP, DEVICES
from ..native.devices import device as device_arg
from .arg_types import number_in, positive_int
from .connection import HEADER_TIMEOUT_S, WRITE_TIMEOUT_S
from .replicas import ROUTER_NAMES

log = logging.getLogger("wick.server")
QUANTIZATIONS = tuple(_SCHEMES)
MAX_BODY_MIB = 4  # (fastapi and the engine load only when the server runs: `wick list` stays fast)
SHUTDOWN_GRACE_S = 15.0


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``wick serve`` flags (for ``build_parser`` in cli.py)."""
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="built-in name (wick models), hf://ORG/REPO[@REVISION][/FILE.gguf], "
                        "Hugging Face dir, .gguf file or compiled artifact dir; several may be "
                        "served, the request's 'model' selects")
    p.add_argument("--model", "-m", action="append", default=[], dest="more_models",
                   metavar="MODEL", help="another model to serve (repeatable)")
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS,
                   help="default: the best the device supports")
    p.add_argument("--device", type=device_arg, default="auto", metavar="|".join(DEVICES),
                   help=DEVICE_HELP + "; cuda:N the N-th NVIDIA GPU")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=number_in(int, 0, 65535), default=8000,
                   help="port (default 8000; 0 picks one)")
    p.add_argument("--api-key", default=os.environ.get("WICK_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $WICK_API_KEY; "
                        "none: no key needed)")
    p.add_argument("--cors-origin", action="append", default=[], dest="cors_origins",
                   metavar="ORIGIN", help="allow browser pages from ORIGIN (repeatable; "
                                          "default: no cross-origin access)")
    p.add_argument("--allowed-host", action="append", default=[], dest="allowed_hosts",
                   metavar="NAME", help="also answer requests addressed to host NAME (repeatable; "
                                        "'.example.com' for its subdomains, '*' for any). "
                                        "Default: IP addresses, localhost and this machine's "
                                        "name, which keeps DNS-rebinding pages out")
    p.add_argument("--body-timeout", type=number_in(float, 0, above=True), metavar="SECONDS",
                   help="a request body must arrive within this (default 60; a pause over 15 s "
                        "also ends it): slow or half-sent bodies get a 408")
    p.add_argument("--header-timeout", type=number_in(float, 0, above=True),
                   default=HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="a connection must send each request's headers within this (default "
                        f"{HEADER_TIMEOUT_S:.0f}); connections that trickle or send nothing "
                        "are closed")
    p.add_argument("--write-timeout", type=number_in(float, 0, above=True),
                   default=WRITE_TIMEOUT_S, metavar="SECONDS",
                   help="a client that reads none of its response for this long (a model file, "
                        f"a stream) is disconnected (default {WRITE_TIMEOUT_S:.0f})")
    p.add_argument("--shutdown-grace", type=number_in(float, 0), default=SHUTDOWN_GRACE_S,
                   metavar="SECONDS",
                   help="on SIGTERM/Ctrl-C, how long running requests may finish before they "
                        f"are ended with an error (default {SHUTDOWN_GRACE_S:.0f})")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                   help="a request's tokens never depend on what else runs: greedy output is "
                        "reproducible under load (default on). --no-batch-invariant lets "
                        "prompts share steps with decodes: more throughput while prompts "
                        "arrive, greedy output then depends on the batch in the last bits")
    p.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV of prompt pages computed before: a chat's earlier turns, "
                        "a shared system prompt, n>1 choices (default on; "
                        "usage.prompt_tokens_details.cached_tokens counts the reused tokens)")
    p.add_argument("--no-browser-variants", action="store_false", dest="browser_variants",
                   help="do not compile the f32 twin of an f16 model for browsers without "
                        "shader-f16")
    add_grammar_arguments(p)
    add_speculative_arguments(p)
    add_replica_arguments(p)
    p.add_argument("--kv-cache-mib", type=positive_int,
                   help="KV cache budget per model in MiB (default 256)")
    p.add_argument("--max-body-mib", type=number_in(float, 0, above=True), default=MAX_BODY_MIB,
                   help=f"largest request body accepted (default {MAX_BODY_MIB})")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   default="info")


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, metavar="N",
                   help="run the engines as N replicas of a Ray Serve deployment behind this "
                        "server (prefix-aware routing; needs `pip install 'wick-llm[ray]'`)")
    p.add_argument("--min-replicas", type=int, metavar="N",
                   help="with --max-replicas: autoscale between the two (Ray Serve's "
                        "autoscaling on requests in flight) instead of a fixed --replicas")
    p.add_argument("--max-replicas", type=int, metavar="N")
    p.add_argument("--replica-router", choices=ROUTER_NAMES,
                   default="prefix",
                   help="how a request picks its replica: the one holding the longest share of "
                        "its prompt in its prefix cache, else the least loaded (default); "
                        "always the least loaded (Ray Serve's power of two choices); or each "
                        "in turn")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="an existing Ray cluster's GCS address (e.g. head:6379, or auto), "
                        "with wick serve on one of its nodes; default: a local cluster that "
                        "wick serve starts and stops itself")
    p.add_argument("--ray-app", metavar="NAME", default="wick",
                   help="the Ray Serve application's name (default: wick); each wick serve on "
                        "one cluster needs its own")
    p.add_argument("--replica-gpus", type=float, metavar="G",
                   help="GPUs Ray reserves for each replica, fractions sharing one (default: 1 "
                        "with --device cuda, else 0)")


def replicas_of(args: argparse.Namespace):
    """``--replicas``/``--min-replicas``/``--max-replicas`` as a ray_serve.Replicas, or None
    (the engines in this process); a bad combination is a ValueError with the fix."""
    fixed, low, high = args.replicas, args.min_replicas, args.max_replicas
    if fixed is None and low is None and high is None:
        for flag, value in (("--ray-address", args.ray_address),
                            ("--ray-app", args.ray_app != "wick"),
                            ("--replica-gpus", args.replica_gpus is not None)):
            if value:
                raise ValueError(f"{flag} needs --replicas N (or --min-replicas/--max-replicas)")
        return None
    if args.ray_address and args.ray_address.startswith("ray://"):
        # (Ray Client cannot stream from a Serve deployment, and every answer streams)
        raise ValueError(f"--ray-address {args.ray_address}: Ray Client (ray://) cannot stream "
                         "from Ray Serve replicas; run wick serve on a node of the cluster and "
                         "give its GCS address (e.g. head:6379, or auto)")
    if not args.ray_app or not all(c.isalnum() or c in "-_." for c in args.ray_app):
        raise ValueError(f"--ray-app {args.ray_app!r}: use letters, digits, '-', '_' or '.'")
    gpus = args.replica_gpus
    if gpus is None:
        gpus = 1.0 if args.device == "cuda" else 0.0
    if not (gpus == 0 or 1e-4 <= gpus <= 1024) or (gpus > 1 and not float(gpus).is_integer()):
        # (Ray shares a GPU in fractions below 1; above, only whole GPUs)
        raise ValueError(f"--replica-gpus {gpus:g}: give 0 or more, a fraction of one GPU "
                         "(e.g. 0.5) or a whole number")
    if fixed is not None and (low is not None or high is not None):
        raise ValueError("say either --replicas N or --min-replicas/--max-replicas, not both")
    if fixed is None and (low is None or high is None):
        raise ValueError("autoscaling needs both --min-replicas and --max-replicas")
    for name, value in (("--replicas", fixed), ("--min-replicas", low), ("--max-replicas", high)):
        if value is not None and value < (0 if name == "--min-replicas" else 1):
            raise ValueError(f"{name} must be at least {0 if name == '--min-replicas' else 1}")
    if low is not None and high < low:
        raise ValueError("--max-replicas must be at least --min-replicas")
    from .replicas import Replicas, ray_available

    if not ray_available():
        raise ValueError("--replicas runs the engines on Ray Serve, which is not installed: "
                         "pip install 'wick-llm[ray]'")
    return Replicas(fixed=fixed, low=low, high=high, address=args.ray_address,
                    router=args.replica_router, app=args.ray_app, gpus=gpus)


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    """Engine-level speculative decoding (engine/speculative.py), for ``serve`` and ``chat``."""
    from ..engine.speculative import DEFAULT_NUM_TOKENS, DRAFT_QUANTIZATION, METHODS

    p.add_argument("--speculative", choices=METHODS,
                   help="draft tokens and verify them in one step, output unchanged: ngram "
                        "copies them from the prompt and the text so far (pays when output "
                        "repeats its input: edits, quotes, extraction); draft runs a smaller "
                        "model (--draft-model; default: the model's own 4-bit twin). Requests "
                        "with OpenAI's `prediction` draft from it with or without this")
    p.add_argument("--draft-model", metavar="MODEL",
                   help="the draft model of --speculative draft (same tokenizer; default: the "
                        "served model itself)")
    p.add_argument("--draft-quantization", metavar="Q",
                   help=f"its variant (default {DRAFT_QUANTIZATION})")
    p.add_argument("--num-speculative-tokens", type=number_in(int, 1, 64), metavar="K",
                   help=f"most drafts per step (default {DEFAULT_NUM_TOKENS}); the engine "
                        "drafts fewer, or none, where a sequence's drafts are not accepted")


def speculative_of(args: argparse.Namespace):
    """The ``speculative`` option of ``add_speculative_arguments``' flags (None: off)."""
    from ..engine.errors import WickError
    from ..engine.speculative import DEFAULT_NUM_TOKENS, SpeculativeConfig

    k = args.num_speculative_tokens
    if args.speculative is None:
        if k is not None:
            raise WickError("--num-speculative-tokens bounds engine-level speculation: add "
                            "--speculative ngram (or draft)", code="invalid_argument")
    if args.speculative != "draft" and (args.draft_model or args.draft_quantization):
        raise WickError("--draft-model and --draft-quantization go with --speculative draft",
                        code="invalid_argument")
    if args.speculative is None:
        return None
    return SpeculativeConfig(args.speculative, k if k is not None else DEFAULT_NUM_TOKENS,
                             args.draft_model, args.draft_quantization)


def add_grammar_arguments(p: argparse.ArgumentParser) -> None:
    """Bounds on response formats and tool schemas (``GrammarLimits``: its defaults)."""
    from ..engine.grammar_limits import GrammarLimits

    d = GrammarLimits()
    g = p.add_argument_group(
        "structured output", "what one request's response_format or tools may ask of the "
        "grammar compiler; larger ones get a 400 naming the bound (README: Structured output)")
    g.add_argument("--grammar-max-bytes", type=int, default=d.max_bytes, metavar="N",
                   help=f"a schema or grammar's size (a request's tools together; default "
                        f"{d.max_bytes})")
    g.add_argument("--grammar-max-depth", type=int, default=d.max_depth, metavar="N",
                   help=f"nesting of a schema (through $ref) or of an EBNF's parentheses "
                        f"(default {d.max_depth})")
    g.add_argument("--grammar-max-properties", type=int, default=d.max_properties, metavar="N",
                   help=f"object properties in a schema (default {d.max_properties})")
    g.add_argument("--grammar-max-rules", type=int, default=d.max_rules, metavar="N",
                   help=f"rules of an EBNF grammar (default {d.max_rules})")
    g.add_argument("--grammar-timeout", type=float, default=d.compile_timeout_s,
                   metavar="SECONDS", help="a grammar's compile is stopped past this (default "
                                           f"{d.compile_timeout_s:g})")
    g.add_argument("--grammar-cache-mib", type=int, default=d.cache_bytes >> 20, metavar="MIB",
                   help=f"compiled grammars kept for reuse, per model (default "
                        f"{d.cache_bytes >> 20})")
    g.add_argument("--grammar-workers", type=int, default=d.workers, metavar="N",
                   help=f"grammars compiled at once, each in a child process (default "
                        f"{d.workers})")


def grammar_limits_of(args: argparse.Namespace):
    """The ``GrammarLimits`` the flags of ``add_grammar_arguments`` ask for; a bad value is
    one ``error:`` line."""
    from ..engine.errors import InvalidRequestError
    from ..engine.grammar_limits import GrammarLimits

    try:
        return GrammarLimits(
            max_bytes=args.grammar_max_bytes, max_depth=args.grammar_max_depth,
            max_properties=args.grammar_max_properties, max_rules=args.grammar_max_rules,
            compile_timeout_s=args.grammar_timeout, cache_bytes=args.grammar_cache_mib << 20,
            workers=args.grammar_workers)
    except ValueError as e:
        flag = str(e).split()[0].replace("GrammarLimits.", "--grammar-").replace("_", "-")
        raise InvalidRequestError(f"{flag}: {str(e).split(' ', 1)[1]}") from None


def serve_main(args: argparse.Namespace) -> int:
    """``wick serve`` with the arguments of ``add_serve_arguments``; returns the exit status."""
    models = [*args.models, *args.more_models]
    if not models:
        print("error: name at least one model to serve (wick serve MODEL)", file=sys.stderr)
        return 2
    try:
        replicas = replicas_of(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from .local import check_model_named, named_artifact

    models = [named_artifact(m) for m in models]  # (as wick chat: an artifact's dir name)
    if replicas is None:  # (replicas load on their own nodes, where other paths may exist)
        for model in models:
            check_model_named(model)
    return run_server(
        models, host=args.host, port=args.port, api_key=args.api_key,
        cors_origins=args.cors_origins, allowed_hosts=args.allowed_hosts,
        quantization=args.quantization, device=args.device,
        kv_cache_bytes=args.kv_cache_mib << 20 if args.kv_cache_mib else None,
        max_body_bytes=int(args.max_body_mib * (1 << 20)), log_level=args.log_level,
        shutdown_grace=args.shutdown_grace, header_timeout=args.header_timeout,
        write_timeout=args.write_timeout,
        browser_variants=args.browser_variants,
        batch_invariant=args.batch_invariant, prefix_cache=args.prefix_cache,
        body_timeout=args.body_timeout, grammar_limits=grammar_limits_of(args),
        speculative=speculative_of(args), replicas=replicas,
    )


def run_server(
    models: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    shutdown_grace: float = SHUTDOWN_GRACE_S,
    header_timeout: float = HEADER_TIMEOUT_S,
    write_timeout: float = WRITE_TIMEOUT_S,
    sock: socket.socket | None = None,
    **options,
) -> int:
    """Serve ``models`` until interrupted (``options``: those of ``serving_app``). Returns 0,
    or 1 when a model failed to load."""
    import ipaddress

    from .app import GracefulServer

    setup_logging(log_level)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not options.get("api_key"):
        log.warning("listening on %s without --api-key: anyone who can reach this address "
                    "can use the models", host)
    sock = sock or bind_socket(host, port)
    server = None

    def stop() -> None:  # a model failed to load
        if server is not None:
            server.should_exit = True

    app = serving_app(models, url=_url(sock), on_failed=stop, **options)
    server = GracefulServer(app, app.state.shutdown, shutdown_grace, log_level=log_level,
                            header_timeout=header_timeout, write_timeout=write_timeout)
    _after_shutdown_ignore_signals()
    server.run(sockets=[sock])
    return 1 if app.state.pool.state == "failed" else 0


def serving_app(
    models: Sequence[str],
    *,
    url: str = "",
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    quantization: str | None = None,
    device: str = "auto",
    kv_cache_bytes: int | None = None,
    max_body_bytes: int = MAX_BODY_MIB << 20,
    body_timeout: float | None = None,
    browser_variants: bool = True,
    batch_invariant: bool = True,
    prefix_cache: bool = True,
    grammar_limits=None,
    speculative=None,
    replicas=None,
    on_failed=None,
):
    """The app ``wick serve`` runs: ``models`` load in the background (compiling when needed),
    each is hosted for browsers once loaded, with its f32 twin built for browsers without
    shader-f16 (``browser_variants``); only served artifacts are hosted, never the rest of the
    cache."""
    from .app import ModelPool, create_app
    from .artifact_host import ArtifactHost
    from .browser_variants import BrowserVariants
    from .progress_bars import ProgressBars
    from .local import AsyncEngine

    host_artifacts = ArtifactHost()
    variants = BrowserVariants(host_artifacts) if browser_variants else None
    noticed: list[str] = []

    def loader(model: str):
        def load():
            bars = ProgressBars()
            try:
                return AsyncEngine(model, quantization=quantization, device=device,
                                   kv_cache_bytes=kv_cache_bytes, progress=bars,
                                   batch_invariant=batch_invariant, prefix_cache=prefix_cache,
                                   grammar_limits=grammar_limits, speculative=speculative)
            finally:
                bars.close()
        return model, load

    def on_loaded(name: str, engine) -> None:
        info = engine.core.info
        if engine.artifact_dir.is_dir():  # (replicas on other machines: not hostable here)
            host_artifacts.add(engine.artifact_dir)
        if engine.core.draft is not None and engine.core.draft.location:
            # a browser engine speculating with the same draft model (createEngine's
            # speculative: {method: "draft"}) fetches it from here
            host_artifacts.add(engine.core.draft.location)
        log.info("wick serving %s (%s, %s) on %s", name, info.quantization,
                 getattr(engine, "device_name", "?"), url)
        if engine.software_notice and not noticed:
            noticed.append(engine.software_notice)
            log.warning("%s", engine.software_notice)
        if variants is not None and engine.artifact_dir.is_dir():
            variants.add_for(engine.artifact_dir)

    if replicas is None:
        pool = ModelPool([loader(m) for m in models], on_loaded=on_loaded,
                         on_failed=lambda err: on_failed and on_failed())
    else:  # the engines on Ray Serve replicas (pyserver/ray_serve.py)
        from .replicas import replica_pool

        engine_options = dict(quantization=quantization, device=device,
                              kv_cache_bytes=kv_cache_bytes, batch_invariant=batch_invariant,
                              prefix_cache=prefix_cache, grammar_limits=grammar_limits,
                              speculative=speculative)
        pool = replica_pool(models, engine_options, replicas, on_loaded=on_loaded,
                            on_failed=lambda err: on_failed and on_failed(),
                            progress_for=lambda model: ProgressBars(
                                prefix=model if len(models) > 1 else ""))
    app = create_app(pool, api_key=api_key, cors_origins=cors_origins,
                     allowed_hosts=allowed_hosts, max_body_bytes=max_body_bytes,
                     artifacts=host_artifacts,
                     **({} if body_timeout is None else {"body_timeout": body_timeout}))
    app.state.browser_variants = variants
    log.info("loading %s; %s/health answers 503 until ready", ", ".join(models), url)
    return app


def _after_shutdown_ignore_signals() -> None:
    """uvicorn handles SIGINT/SIGTERM while it runs (graceful shutdown) and raises them again
    once done, through the handlers it found: make those no-ops, so that a stop the server
    already handled ends with exit status 0, not as an interrupt."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: None)


class ServerThread:
    """``app`` served by uvicorn in a daemon thread on ``host:port`` (0: a free port); for
    tests and benchmarks. ``url`` is set once it listens; ``stop()`` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", grace: float = 1.0,
                 header_timeout: float = HEADER_TIMEOUT_S,
                 write_timeout: float = WRITE_TIMEOUT_S) -> None:
        import threading

        from .app import GracefulServer

        self.app = app
        self.sock = bind_socket(host, port)
        self.url = _url(self.sock)
        self.server = GracefulServer(app, app.state.shutdown, grace, log_level, header_timeout,
                                     write_timeout)
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
    import errno

    from ..engine.errors import WickError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:  # (a port in use, an address not this machine's, a name unknown)
        sock.close()
        fix = ("another program listens there: choose another port with --port (0 picks a "
               "free one)" if e.errno == errno.EADDRINUSE else
               "ports below 1024 need privileges: choose --port 1024 or above"
               if e.errno == errno.EACCES else
               "check --host (an address of this machine, or a name that resolves to one)")
        raise WickError(f"cannot listen on {host}:{port} ({e.strerror or e}); {fix}",
                        code="address_unavailable") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a line is logged, not as it was when logging
    was set up (a host that swaps stderr, such as pytest's capture, closes the old one)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(level: str = "info") -> None:
    """``INFO  message`` lines on stderr for wick's logger (uvicorn's own keep their format)."""
    logger = logging.getLogger("wick")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)-5s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
