"""Front-door limits: what one client may hold of a router, whatever it sends.

A connection costs a file descriptor and some memory for as long as it is open, so every
phase of a client connection has a bound (defaults in `ServerSettings`, flags on `sloline
run` / `sloline router`, table in docs/operations.md "Front-door limits"):

- **REST** (uvicorn with httptools): `LimitedHttpProtocol` closes a connection whose
  request headers are not complete `header_timeout_s` after its first byte (or after the
  connection opened), and answers 408 when a body is not complete `body_timeout_s` after
  its headers (slowloris and trickled bodies), and aborts a connection whose client has
  not read its answer for `body_timeout_s` (a full send buffer that does not drain);
  uvicorn's `timeout_keep_alive` closes idle keep-alive connections. While the router
  drains (`LimitedHttpProtocol.drain`), every answer says `Connection: close` and the
  connection closes after it, so keep-alive clients reconnect elsewhere (through the
  Service, to another router) instead of finding their connection closed under a
  request. Beyond
  `max_connections` open connections a new one is answered 503 at once, before anything
  is read, and closed when the client has read it (at most 1 s later; under a flood, at
  once), so a flood of idle sockets costs one file descriptor per connection for at
  most a second, not for ever.
- **gRPC**: `grpc_server_options` bounds connections (`grpc.max_allowed_incoming_connections`),
  the HTTP/2 handshake, streams per connection, idle connections and (optionally) a
  connection's age, and enforces sane client keepalive pings; `grpc.aio.server(
  maximum_concurrent_rpcs=...)` answers RESOURCE_EXHAUSTED beyond a number of RPCs.
- **File descriptors**: `fd_budget` raises the soft RLIMIT_NOFILE to the hard limit at
  router start and shrinks the connection caps to fit well below it, keeping headroom
  for worker streams, log files and the metrics port.

The timers cost nothing on the hot path: a request that arrives in one read (headers and
body together, the usual case for small tensors) arms no timer; only a connection whose
request is split across reads arms one, and only until that request is complete.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sloline.serving.logthrottle import Throttle

log = logging.getLogger(__name__)
# A flood of refused connections must not flood the log too: one line per 10 s, counted.
log.addFilter(Throttle())

# File descriptors kept out of the connection caps: worker streams, log files, the
# metrics port, the profiler's pipes, gRPC's own wake-up fds.
FD_RESERVE: Final = 256


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The REST door's per-connection bounds (from `ServerSettings`)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 2048


class _Phase(Enum):
    HEADERS = 1  # waiting for (the rest of) a request's headers
    BODY = 2  # headers complete, body not yet
    IDLE = 3  # no request being received (answering one, or keep-alive)


def _response(status: bytes, message: bytes, retry_after: bool = False) -> bytes:
    body = b'{"error":"' + message + b'"}'
    return b"".join(
        (
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n",
            b"retry-after: 1\r\n" if retry_after else b"",
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body),
            body,
        )
    )


REFUSAL_LINGER_S: Final = 1.0
MAX_LINGERING: Final = 256
_LINGERING = [0]  # refused connections lingering now


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body read timeouts and a connection
    cap; `limited_http_protocol(limits)` makes the class uvicorn instantiates."""

    limits: HttpLimits = HttpLimits()
    _phase: _Phase
    _refused: bool
    _draining: bool
    _timer: asyncio.TimerHandle | None
    _write_timer: asyncio.TimerHandle | None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._phase = _Phase.HEADERS
        self._timer = self._write_timer = None
        self._refused = self._draining = False
        limits = self.limits
        if len(self.connections) > limits.max_connections:
            self._refuse(transport)
            return
        self._timer = self.loop.call_later(limits.header_timeout_s, self._headers_late)

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 before reading anything. The connection then lingers (its input
        discarded) until the client closes it, for at most `REFUSAL_LINGER_S`: closing at
        once would make the client's kernel answer its request with a reset, which many
        clients report instead of the 503. At most `MAX_LINGERING` linger at once; beyond
        them a refused connection is closed at once."""
        log.warning(
            "refused an HTTP connection: %d open is the limit (--max-connections)",
            self.limits.max_connections,
        )
        self.connections.discard(self)  # not one of the connections the cap counts
        self._refused = True
        transport.write(self._refusal)
        if _LINGERING[0] >= MAX_LINGERING:
            transport.close()
            return
        _LINGERING[0] += 1
        self._timer = self.loop.call_later(REFUSAL_LINGER_S, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused and self._timer is not None:
            _LINGERING[0] -= 1
        self._cancel_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        # The client is not reading its answer: it gets `body_timeout_s` to make room.
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.body_timeout_s, self._unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _unread(self) -> None:
        self._write_timer = None
        self.transport.abort()  # close() would wait for the unsent answer

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered 503 already: what the client sends is not read
        super().data_received(data)
        # A request split across reads: bound the phase it is in (one timer per phase).
        if self._timer is None and self._phase is not _Phase.IDLE:
            limits = self.limits
            if self._phase is _Phase.HEADERS:
                self._timer = self.loop.call_later(limits.header_timeout_s, self._headers_late)
            else:
                self._timer = self.loop.call_later(limits.body_timeout_s, self._body_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _Phase.HEADERS

    def on_headers_complete(self) -> None:
        self._cancel_timer()
        self._phase = _Phase.BODY
        super().on_headers_complete()
        if self._draining:
            self.cycle.keep_alive = False

    def drain(self) -> None:
        """The router is going away: answer the request in hand and any that still comes
        on this connection with `Connection: close`, then close. An idle connection is
        left to its keep-alive timeout, as ever: closing it now would race a request the
        client may be sending on it, which the client would see fail. (An answer already
        under way keeps the connection: the next request gets the `Connection: close`.)"""
        self._draining = True
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._phase = _Phase.IDLE
        super().on_message_complete()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._phase is not _Phase.HEADERS:
            return
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(self._headers_timeout)
        self.transport.close()

    def _body_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._phase is not _Phase.BODY:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not self.pipeline:
            # The app is waiting for the body: it reads a disconnect, and its answer (if it
            # tries one) goes nowhere; the client gets the 408. (A pipelined request queued
            # behind another one's answer just loses the connection.)
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.write(self._body_timeout)
        self.transport.close()

    _refusal: bytes = b""
    _headers_timeout: bytes = b""
    _body_timeout: bytes = b""


def limited_http_protocol(limits: HttpLimits) -> type[LimitedHttpProtocol]:
    """The protocol class for `uvicorn.Config(http=...)` enforcing `limits`."""
    return type(
        "LimitedHttpProtocol",
        (LimitedHttpProtocol,),
        {
            "limits": limits,
            "_refusal": _response(
                b"503 Service Unavailable",
                b"too many connections (limit %d); retry later" % limits.max_connections,
                retry_after=True,
            ),
            "_headers_timeout": _response(
                b"408 Request Timeout",
                b"request headers not received within %gs" % limits.header_timeout_s,
            ),
            "_body_timeout": _response(
                b"408 Request Timeout",
                b"request body not received within %gs of its headers" % limits.body_timeout_s,
            ),
        },
    )


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """The gRPC door's bounds (from `ServerSettings`)."""

    max_connections: int = 2048
    handshake_timeout_s: float = 10.0
    max_concurrent_streams: int = 4096
    max_concurrent_rpcs: int = 8192
    idle_s: float = 300.0
    max_age_s: float | None = None
    min_ping_interval_s: float = 10.0
    keepalive_s: float = 60.0  # the server pings quiet connections to find dead peers
    keepalive_timeout_s: float = 20.0


def grpc_server_options(limits: GrpcLimits) -> list[tuple[str, Any]]:
    """Channel options of the gRPC server for `limits` (message sizes are set apart)."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.server_handshake_timeout_ms", _ms(limits.handshake_timeout_s)),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.max_connection_idle_ms", _ms(limits.idle_s)),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(limits.min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.keepalive_time_ms", _ms(limits.keepalive_s)),
        ("grpc.keepalive_timeout_ms", _ms(limits.keepalive_timeout_s)),
    ]
    if limits.max_age_s is not None:
        # No age grace (gRPC's default: unbounded): a connection past its age takes no new
        # call and closes once its calls in flight are answered, however long they take.
        options.append(("grpc.max_connection_age_ms", _ms(limits.max_age_s)))
    return options


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # Linux's usual nr_open
    if soft == resource.RLIM_INFINITY:
        return target
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a container may forbid it
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft


def fd_budget(http_max: int, grpc_max: int, fd_limit: int) -> tuple[int, int]:
    """Connection caps (HTTP, gRPC) that fit `fd_limit`: together at most half of what is
    left after `FD_RESERVE`, shrunk in proportion when the configured caps do not fit."""
    budget = max(2, (fd_limit - FD_RESERVE) // 2)
    total = http_max + grpc_max
    if total <= budget:
        return http_max, grpc_max
    http = max(1, http_max * budget // total)
    return http, max(1, budget - http)
