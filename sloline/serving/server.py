"""Runs a router's front doors in one asyncio event loop: REST (uvicorn) on the HTTP
port, and one gRPC server carrying both the Open Inference Protocol service for clients
and the WorkerService that workers dial. Ports default to Triton's (8000 HTTP, 8001 gRPC);
port 0 picks a free one (tests), and the bound ports are reported back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app

from sloline.serving.grpc_frontdoor import add_inference_service
from sloline.serving.http import bind_socket, create_http_app
from sloline.serving.proto import worker_pb2_grpc
from sloline.serving.router import Router, WorkerService

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
        self._grpc: grpc.aio.Server | None = None
        self._http: _UvicornServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        s = self.settings
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        self._grpc = grpc.aio.server(options=options)
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerService(self.router), self._grpc)
        add_inference_service(self._grpc, self.router)
        self.grpc_port = self._grpc.add_insecure_port(f"{s.host}:{s.grpc_port}")
        if self.grpc_port == 0:
            raise OSError(f"cannot listen for gRPC on {s.host}:{s.grpc_port} (port in use?)")
        await self._grpc.start()

        try:
            sock = bind_socket(s.host, s.http_port)
        except OSError as exc:
            raise OSError(f"cannot listen for HTTP on {s.host}:{s.http_port}: {exc}") from None
        self.http_port = sock.getsockname()[1]
        app = create_http_app(
            self.router, max_body_bytes=s.max_body_bytes, metrics_app=make_asgi_app(self.registry)
        )
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        self._http = _UvicornServer(config)
        self._tasks = [
            asyncio.create_task(self._http.serve(sockets=[sock])),
            asyncio.create_task(self.router.expire_queued()),
        ]
        while not self._http.started:
            if self._tasks[0].done():
                self._tasks[0].result()  # raises the start-up error
            await asyncio.sleep(0.005)

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._http is not None:
            self._http.should_exit = True
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
        for task in self._tasks[1:]:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
