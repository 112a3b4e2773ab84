"""Runs a router's servers in one asyncio event loop: REST (uvicorn) on the HTTP port,
the Open Inference Protocol gRPC service for clients on the gRPC port, and the
WorkerService that workers dial on a gRPC server of its own (`worker_port`). Client
ports default to Triton's (8000 HTTP, 8001 gRPC); port 0 picks a free one (tests, and the
embedded mode's worker port on loopback), and the bound ports are reported back.
`/metrics` is on the HTTP port, and also alone on `metrics_port` when one is set
(Kubernetes: the Service's `metrics` port, which a ServiceMonitor scrapes without
touching the data plane), beside the router's own Triton statistics, which the
pipeline's other routers (`stats_peers`) fetch there to answer for the whole pipeline.

Who may connect (docs/operations.md, "Security and threat model"): the worker server
requires `worker_token` on every call unless `insecure_workers` says otherwise; the
client doors are open unless `auth_tokens` (bearer tokens) or TLS (`tls_cert`/`tls_key`,
with `tls_client_ca` requiring client certificates) are set. The health probes and the
separate metrics port stay open: the kubelet and Prometheus carry no credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from ssl import CERT_REQUIRED
from typing import Any

import grpc
import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.types import ASGIApp

from sloline.serving.auth import AuthConfigError, TokenSet
from sloline.serving.grpc_frontdoor import add_inference_service
from sloline.serving.guard import BearerAuth, TokenInterceptor
from sloline.serving.http import (
    DEFAULT_MAX_BUFFERED_BODY_BYTES,
    DEFAULT_MAX_JSON_BODY_BYTES,
    bind_socket,
    create_http_app,
    create_metrics_app,
)
from sloline.serving.limits import (
    GrpcLimits,
    HttpLimits,
    LimitedHttpProtocol,
    fd_budget,
    grpc_server_options,
    limited_http_protocol,
    raise_fd_limit,
)
from sloline.serving.peers import Peers
from sloline.serving.router import Router
from sloline.serving.triton_stats import TritonExtensions
from sloline.serving.workers import add_worker_service

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# gRPC core closes a connection at its max age give or take this fraction.
GRPC_AGE_JITTER = 0.1


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
    # The workers' gRPC server (WorkerService only): its own address, never the clients'.
    worker_host: str = "127.0.0.1"
    worker_port: int = 0
    worker_token: str | None = None  # required on Connect; None only with insecure_workers
    insecure_workers: bool = False  # accept workers without a token (explicit opt-out)
    # Share the client HTTP and gRPC ports with the pipeline's other routers (SO_REUSEPORT;
    # the embedded mode's `--routers`); the worker and metrics ports stay this router's.
    reuse_port: bool = False
    # Client front doors: TLS (both doors) and bearer tokens; all off by default.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # require client certificates signed by this CA
    auth_tokens: tuple[str, ...] = ()
    # The pipeline's other routers' metrics ports (host:port; a name resolves to every
    # router, this one skipped): Triton's statistics answer for all of them
    # (`sloline.serving.triton_stats`). Served only with a metrics port.
    stats_peers: tuple[str, ...] = ()

    # Front-door limits (sloline/serving/limits.py; docs/operations.md "Front-door limits").
    max_json_body_bytes: int = DEFAULT_MAX_JSON_BODY_BYTES
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES  # all bodies at once
    header_timeout_s: float = 10.0  # REST headers, and gRPC's HTTP/2 handshake
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 5.0
    max_connections: int = 2048  # REST client connections
    grpc_max_connections: int = 2048
    grpc_max_concurrent_rpcs: int = 8192
    grpc_max_concurrent_streams: int = 4096  # per connection (the router sheds beyond 4096)
    grpc_idle_s: float = 300.0
    grpc_max_age_s: float | None = None

    def check(self) -> None:
        """Reject settings that cannot work, before any port is opened."""
        if not self.worker_token and not self.insecure_workers:
            raise AuthConfigError(
                "no worker token: set one (SLOLINE_WORKER_TOKEN or --worker-token-file), "
                "or accept unauthenticated workers explicitly (--insecure-workers)"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise AuthConfigError(
                "TLS needs both a certificate and its key (--tls-cert, --tls-key)"
            )
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise AuthConfigError("--tls-client-ca needs TLS on: give --tls-cert and --tls-key")
        if self.stats_peers and self.metrics_port is None:
            raise AuthConfigError(
                "statistics peers ask each other on their metrics ports: give --metrics-port"
            )

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AuthConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None


def server_credentials(settings: ServerSettings) -> grpc.ServerCredentials:
    """gRPC TLS credentials of the client door (mutual TLS with a client CA)."""
    assert settings.tls_cert is not None
    assert settings.tls_key is not None
    ca = settings.tls_client_ca
    return grpc.ssl_server_credentials(
        [(_read(settings.tls_key, "--tls-key"), _read(settings.tls_cert, "--tls-cert"))],
        root_certificates=_read(ca, "--tls-client-ca") if ca is not None else None,
        require_client_auth=ca is not None,
    )


METRICS_MAX_CONNECTIONS = 64


def uvicorn_config(
    app: ASGIApp, limits: HttpLimits, keepalive_timeout_s: float, **ssl: Any
) -> uvicorn.Config:
    """uvicorn's settings for a router's HTTP port: httptools with the front-door limits."""
    return uvicorn.Config(
        app,
        http=limited_http_protocol(limits),
        ws="none",  # no WebSocket routes: an Upgrade request is served as plain HTTP
        timeout_keep_alive=keepalive_timeout_s,  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        **ssl,
    )


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
        self.worker_port = 0
        self.metrics_port: int | None = None
        # Triton's extensions; their statistics add the peers' (`stats_peers`).
        self.triton = TritonExtensions(
            router, router.name, router.triton_stats, Peers(settings.stats_peers)
        )
        self._grpc: grpc.aio.Server | None = None
        self._workers: grpc.aio.Server | None = None
        self._http: list[_UvicornServer] = []  # the client door first, then metrics
        self._grpc_stopping: asyncio.Task[None] | None = None
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
        s.check()
        http_max, grpc_max = fd_budget(s.max_connections, s.grpc_max_connections, raise_fd_limit())
        if (http_max, grpc_max) != (s.max_connections, s.grpc_max_connections):
            log.warning(
                "the open-files limit fits %d HTTP and %d gRPC connections, not %d and %d",
                http_max,
                grpc_max,
                s.max_connections,
                s.grpc_max_connections,
            )
        http_limits = HttpLimits(s.header_timeout_s, s.body_timeout_s, http_max)
        limits = GrpcLimits(
            max_connections=grpc_max,
            handshake_timeout_s=s.header_timeout_s,
            max_concurrent_streams=s.grpc_max_concurrent_streams,
            max_concurrent_rpcs=s.grpc_max_concurrent_rpcs,
            idle_s=s.grpc_idle_s,
            max_age_s=s.grpc_max_age_s,
        )
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        workers = [TokenInterceptor(TokenSet([s.worker_token]), "worker")] if s.worker_token else []
        self._workers = grpc.aio.server(options=options, interceptors=workers)
        add_worker_service(self._workers, self.router)
        self.worker_port = self._workers.add_insecure_port(f"{s.worker_host}:{s.worker_port}")
        if self.worker_port == 0:
            raise OSError(
                f"cannot listen for workers on {s.worker_host}:{s.worker_port} (port in use?)"
            )
        await self._workers.start()
        tokens = TokenSet(s.auth_tokens) if s.auth_tokens else None
        clients = [TokenInterceptor(tokens, "gRPC client")] if tokens else []
        reuse = ("grpc.so_reuseport", int(s.reuse_port))
        self._grpc = grpc.aio.server(
            options=[*options[:-1], reuse, *grpc_server_options(limits)],
            interceptors=clients,
            maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
        )
        triton = self.triton
        add_inference_service(self._grpc, self.router, triton)
        address = f"{s.host}:{s.grpc_port}"
        if s.tls:
            self.grpc_port = self._grpc.add_secure_port(address, server_credentials(s))
        else:
            self.grpc_port = self._grpc.add_insecure_port(address)
        if self.grpc_port == 0:
            raise OSError(f"cannot listen for gRPC on {s.host}:{s.grpc_port} (port in use?)")
        await self._grpc.start()
        metrics = make_asgi_app(self.registry)
        app = create_http_app(
            self.router,
            max_body_bytes=s.max_body_bytes,
            max_json_body_bytes=s.max_json_body_bytes,
            max_buffered_body_bytes=s.max_buffered_body_bytes,
            metrics_app=metrics,
            triton=triton,
        )
        if tokens is not None:
            app = BearerAuth(app, tokens)
        self.http_port = await self._serve_http(
            app, s.http_port, "HTTP", http_limits, tls=s.tls, reuse_port=s.reuse_port
        )
        if s.metrics_port is not None:
            scrape = replace(http_limits, max_connections=METRICS_MAX_CONNECTIONS)
            self.metrics_port = await self._serve_http(
                create_metrics_app(metrics, self.router, triton), s.metrics_port, "metrics", scrape
            )
            triton.peers.set_own(s.host, self.metrics_port)
        self._expiry = asyncio.create_task(self.router.expire_queued())

    async def _serve_http(
        self,
        app: ASGIApp,
        port: int,
        what: str,
        limits: HttpLimits,
        *,
        tls: bool = False,
        reuse_port: bool = False,
    ) -> int:
        """Start uvicorn for `app` on `port`; return the bound port once it serves."""
        s = self.settings
        host = s.host
        ssl: dict[str, Any] = {}
        if tls:
            for flag, path in (("--tls-cert", s.tls_cert), ("--tls-key", s.tls_key)):
                assert path is not None
                _read(path, flag)  # a readable file, or the error names the flag
            ssl = {"ssl_certfile": str(s.tls_cert), "ssl_keyfile": str(s.tls_key)}
            if s.tls_client_ca is not None:
                _read(s.tls_client_ca, "--tls-client-ca")
                ssl |= {"ssl_ca_certs": str(s.tls_client_ca), "ssl_cert_reqs": CERT_REQUIRED}
        try:
            sock = bind_socket(host, port, reuse_port=reuse_port)
        except OSError as exc:
            raise OSError(f"cannot listen for {what} on {host}:{port}: {exc}") from None
        config = uvicorn_config(app, limits, s.keepalive_timeout_s, **ssl)
        try:
            config.load()  # reads the certificate now: a bad one is an error, not a dead port
        except Exception as exc:  # ssl.SSLError, OSError: the files are not a key pair
            sock.close()
            raise AuthConfigError(f"cannot use the TLS certificate/key for {what}: {exc}") from None
        server = _UvicornServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        self._http.append(server)
        self._tasks.append(task)
        while not server.started:
            if task.done():
                task.result()  # raises the start-up error
            await asyncio.sleep(0.005)
        return int(sock.getsockname()[1])

    def close_doors(self, grace_s: float) -> None:
        """Begin draining the client doors: take no new connection, answer every request
        that still comes on an open one and then close it (REST: `Connection: close`;
        gRPC: GOAWAY, so clients open their next stream elsewhere), and give in-flight
        gRPC calls `grace_s`. The worker and metrics ports stay open until `stop`."""
        if self._http:
            door = self._http[0]
            for listener in door.servers:
                listener.close()
            for connection in list(door.server_state.connections):
                if isinstance(connection, LimitedHttpProtocol):
                    connection.drain()
        if self._grpc is not None and self._grpc_stopping is None:
            self._grpc_stopping = asyncio.create_task(self._stop_grpc(self._grpc, grace_s))

    async def _stop_grpc(self, server: grpc.aio.Server, grace_s: float) -> None:
        """Stop the gRPC door within `grace_s`. A server stop sends its GOAWAY while calls
        may be on their way, and those it cancels (gRPC core does not send the graceful
        double GOAWAY on shutdown); a connection closed for its age does, serving every
        call that crossed it. So with `grpc_max_age_s` the door first waits until every
        connection has reached its age (with gRPC's 10 % jitter, and half a second for the
        GOAWAY's round trip): clients have reconnected elsewhere by then and send nothing
        more here, and the stop only lets the calls still in flight finish."""
        age_s = self.settings.grpc_max_age_s
        if age_s is not None:
            recycled_s = min(grace_s, age_s * (1 + GRPC_AGE_JITTER) + 0.5)
            await asyncio.sleep(recycled_s)
            grace_s -= recycled_s
        await server.stop(grace_s)

    def doors_closed(self) -> bool:
        """Every client connection of the doors is gone (after `close_doors`)."""
        open_http = bool(self._http) and bool(self._http[0].server_state.connections)
        return not open_http and (self._grpc_stopping is None or self._grpc_stopping.done())

    async def stop(self, grace_s: float = 2.0) -> None:
        for server in self._http:
            server.should_exit = True
        if self._grpc_stopping is not None:
            await self._grpc_stopping
        elif self._grpc is not None:
            await self._grpc.stop(grace_s)
        if self._workers is not None:
            await self._workers.stop(grace_s)
        tasks = list(self._tasks)
        if self._expiry is not None:
            self._expiry.cancel()
            tasks.append(self._expiry)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
