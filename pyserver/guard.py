"""What every request to ``wick serve`` passes before any route runs (an ASGI middleware).

A model server on 127.0.0.1 is reachable from every web page the user opens: a page can POST
to it (a "simple" ``text/plain`` request needs no CORS preflight) and, by DNS rebinding (its own
name re-pointed at 127.0.0.1), even read the answers. So:

- ``Host`` must name this server: an IP literal, ``localhost``, this machine's host name, or a
  name given with ``--allowed-host`` (``*`` turns the check off). A rebinding page sends its
  own name and is refused.
- A request carrying an ``Origin`` (browsers send it on every cross-origin request, and on
  same-origin POSTs) must come from this server's own origin or one allowed with
  ``--cors-origin``; CORS preflights from any other origin are refused the same way.
- While the server shuts down, new requests get a 503.

Every refusal is an OpenAI-shaped JSON error. JSON routes additionally require
``Content-Type: application/json`` (``routes.py``), which a form or a no-CORS fetch cannot send.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from ..engine.errors import WickError


class ForbiddenError(WickError):
    default_status = 403
    default_type = "invalid_request_error"


class RequestGuard:
    """ASGI middleware: Host and Origin checks, and refusing requests during shutdown."""

    def __init__(self, app: Any, *, allowed_hosts: Iterable[str] = (),
                 cors_origins: Iterable[str] = (),
                 shutting_down: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        hosts = {h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()}
        self.any_host = "*" in hosts
        self.hosts = hosts | {"localhost", socket.gethostname().lower()}
        self.origins = {o.rstrip("/").lower() for o in cors_origins}
        self.shutting_down = shutting_down

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        error = self.check(headers)
        if error is None and self.shutting_down():
            error = WickError("The server is shutting down; retry on another server or later.",
                              type="service_unavailable", code="server_shutting_down",
                              status=503)
        if error is None:
            await self.app(scope, receive, send)
            return
        body = json.dumps(error.to_dict()).encode()
        await send({"type": "http.response.start", "status": error.status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    def check(self, headers: dict[str, str]) -> WickError | None:
        """The refusal for a request with these (lower-cased) headers, or None."""
        host = headers.get("host", "")
        if host and not self.host_allowed(host):
            return ForbiddenError(
                f"Host {host!r} is not a name of this server (a page using DNS rebinding sends "
                "its own). If you reach wick by that name, start it with --allowed-host "
                f"{_hostname(host)}.", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            return ForbiddenError(
                f"Cross-origin requests from {origin} are not allowed. To let pages of that "
                f"origin use this server, start it with --cors-origin {origin}.",
                code="origin_not_allowed")
        return None

    def host_allowed(self, host: str) -> bool:
        if self.any_host:
            return True
        name = _hostname(host)
        try:
            ipaddress.ip_address(name)
            return True  # an address is not a name anyone can re-point
        except ValueError:
            pass
        return name in self.hosts or name.endswith(".localhost") or any(
            h.startswith(".") and name.endswith(h) for h in self.hosts)

    def origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self.origins or "*" in self.origins:
            return True
        parts = urlsplit(origin)
        # same origin: the page was served by this server under the name it used for it
        return parts.scheme in ("http", "https") and bool(host) and \
            _with_port(parts.netloc, parts.scheme) == _with_port(host.lower(), parts.scheme)


def _hostname(host: str) -> str:
    """``Host`` header -> the bare lower-case name or address (no port, no brackets). A value
    that is not ``name``, ``name:port``, ``[address]`` or ``[address]:port`` comes back whole,
    which names no server (``[::1]evil.example`` is not ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1:]
        if end > 0 and (rest == "" or (rest[0] == ":" and _port(rest[1:]))):
            return host[1:end]
        return host
    if host.count(":") == 1:
        name, port = host.split(":")
        return name.rstrip(".") if _port(port) else host
    return host.rstrip(".")


def _port(text: str) -> bool:
    return text == "" or (text.isascii() and text.isdigit() and len(text) <= 5)


def _with_port(netloc: str, scheme: str) -> str:
    if netloc.endswith("]") or ":" not in netloc.rsplit("]", 1)[-1]:
        return f"{netloc}:{443 if scheme == 'https' else 80}"
    return netloc
