"""A small HTTP proxy in front of the wick server for loader tests: it forwards every GET
(Range included) and can cut a chosen response off midway (the connection drops after half
the body, as a flaky network does, optionally after going silent for a while) or answer 503
for a chosen path."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "transfer-encoding", "content-length", "keep-alive"}


class CuttingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.cut: dict[str, int] = {}  # path suffix -> responses still to cut off midway
        self.stall_s = 0.0  # > 0: a cut response first goes silent for this long
        self.fail: set[str] = set()  # path suffixes answered with 503
        # (path, Range, status, when the request arrived: time.time(), which a page's Date.now()
        # can be set against)
        self.log: list[tuple[str, str | None, int, float]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                arrived = time.time()
                rng = self.headers.get("Range")
                if any(self.path.endswith(f) for f in proxy.fail):
                    proxy.log.append((self.path, rng, 503, arrived))
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                fwd = {k: v for k, v in self.headers.items() if k.lower() in
                       {"range", "if-none-match", "if-modified-since", "accept", "authorization"}}
                req = urllib.request.Request(proxy.upstream + self.path, headers=fwd)
                try:
                    with urllib.request.urlopen(req) as r:
                        status, headers, body = r.status, r.headers, r.read()
                except urllib.error.HTTPError as e:
                    status, headers, body = e.code, e.headers, e.read()
                cut = next((f for f in proxy.cut if self.path.endswith(f) and proxy.cut[f] > 0), None)
                proxy.log.append((self.path, rng, status, arrived))
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if cut is None:
                    self.wfile.write(body)
                    return
                proxy.cut[cut] -= 1
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                time.sleep(max(0.5, proxy.stall_s))  # the browser reads the first half first
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def requests_for(self, suffix: str) -> list[tuple[str | None, int]]:
        return [(rng, status) for path, rng, status, _ in self.log if path.endswith(suffix)]

    def request_times(self, suffix: str) -> list[float]:
        """When each request for `suffix` arrived (time.time())."""
        return [when for path, _, _, when in self.log if path.endswith(suffix)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PageServer:
    """Serves one HTML page at every path: a real loopback origin of its own (Chromium lets a
    loopback page reach another loopback origin; a page fulfilled by a route counts as public)."""

    def __init__(self, html: str) -> None:
        body = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
