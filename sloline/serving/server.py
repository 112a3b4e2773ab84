"""Runs a router's front doors in one asyncio event loop: REST (uvicorn) on the HTTP
port, and one gRPC server carrying both the Open Inference Protocol service for clients
and the WorkerService that workers dial. Ports default to Triton's (8000 HTTP, 8001 gRPC);
port 0 picks a free one (tests), and the bound ports are reported back. `/metrics` is on
the HTTP port, and also alone on `metrics_port` when one is set (Kubernetes: the
Service's `metrics` port, which a ServiceMonitor scrapes without touching the data plane).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.types import ASGIApp

from sloline.serving.grpc_frontdoor import add_inference_service
from sloline.serving.http import bind_socket, create_http_app, create_metrics_app
from sloline.serving.router import Router, add_worker_service

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class _UvicornServer(uvicorn.Server):
    """uvicorn without its own signal handling: the embedding process owns SIGINT/SIGTERM
    and shuts the HTTP server down last, after in-flight requests have drained."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int | None = None  # a separate /metrics-only port (0 = any free one)
    max_body_bytes: int = 64 * 1024 * 1024


class RouterServer:
    """Owns the listening sockets and servers of one router."""

    def __init__(
        self, router: Router, registry: CollectorRegistry, settings: ServerSettings
    ) -> None:
        self.router = router
        self.registry = registry
        self.settings = settings
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._http: list[_UvicornServer] = []
        self._tasks: list[asyncio.Task[None]] = []  # the uvicorn servers
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen on every port; on failure (port in use) close whatever was opened."""
        try:
            await self._start()
        except BaseException:
            await self.stop(grace_s=0.0)
            raise

    async def _start(self) -> None:
        s = self.settings
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        self._grpc = grpc.aio.server(options=options)
        add_worker_service(self._grpc, self.router)
        add_inference_service(self._grpc, self.router)
        self.grpc_port = self._grpc.add_insecure_port(f"{s.host}:{s.grpc_port}")
        if self.grpc_port == 0:
            raise OSError(f"cannot listen for gRPC on {s.host}:{s.grpc_port} (port in use?)")
        await self._grpc.start()
        metrics = make_asgi_app(self.registry)
        app = create_http_app(self.router, max_body_bytes=s.max_body_bytes, metrics_app=metrics)
        self.http_port = await self._serve_http(app, s.http_port, "HTTP")
        if s.metrics_port is not None:
            self.metrics_port = await self._serve_http(
                create_metrics_app(metrics), s.metrics_port, "metrics"
            )
        self._expiry = asyncio.create_task(self.router.expire_queued())

    async def _serve_http(self, app: ASGIApp, port: int, what: str) -> int:
        """Start uvicorn for `app` on `port`; return the bound port once it serves."""
        host = self.settings.host
        try:
            sock = bind_socket(host, port)
        except OSError as exc:
            raise OSError(f"cannot listen for {what} on {host}:{port}: {exc}") from None
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        server = _UvicornServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        self._http.append(server)
        self._tasks.append(task)
        while not server.started:
            if task.done():
                task.result()  # raises the start-up error
            await asyncio.sleep(0.005)
        return int(sock.getsockname()[1])

    async def stop(self, grace_s: float = 2.0) -> None:
        for server in self._http:
            server.should_exit = True
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
        tasks = list(self._tasks)
        if self._expiry is not None:
            self._expiry.cancel()
            tasks.append(self._expiry)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
