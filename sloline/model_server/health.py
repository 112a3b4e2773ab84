"""The worker's health endpoint for Kubernetes probes: `GET /live` and `GET /ready`.

A stdlib HTTP server on its own thread, not on the worker's event loop: a batch runs on
that loop and may hold it for seconds, and a liveness probe must not fail because the
model is busy. `/live` answers 200 while the process runs; `/ready` answers 200 only
while the model is loaded, the stream to the router is up and the worker is not
stopping (503 otherwise), so a Service or a rollout never counts a replica that cannot
take batches.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HealthState:
    """What `/ready` reports. Plain attribute writes from the worker's loop; the health
    thread only reads them (a bool store is atomic in CPython)."""

    def __init__(self) -> None:
        self.loaded = False
        self.connected = False
        self.stopping = False

    @property
    def ready(self) -> bool:
        return self.loaded and self.connected and not self.stopping

    def describe(self) -> str:
        if self.stopping:
            return "stopping"
        if not self.loaded:
            return "loading the model"
        if not self.connected:
            return "not connected to the router"
        return "ready"


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class HealthServer:
    """`GET /live` and `GET /ready` on (host, port); port 0 picks a free one."""

    def __init__(self, state: HealthState, host: str, port: int) -> None:
        self.state = state

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/live":
                    self._answer(200, "live")
                elif self.path == "/ready":
                    self._answer(200 if state.ready else 503, state.describe())
                else:
                    self._answer(404, "use /live or /ready")

            def _answer(self, code: int, text: str) -> None:
                body = f"{text}\n".encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds would flood the worker's log."""

        server_class = _Server6 if ":" in host else ThreadingHTTPServer
        try:
            self._server = server_class((host, port), Handler)
        except OSError as exc:
            raise OSError(f"cannot listen for health probes on {host}:{port}: {exc}") from None
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()  # blocks until serve_forever returns; only if it runs
        self._server.server_close()
