"""The router's side of the worker channel: one `WorkerConn` per connected worker, and
the `WorkerService.Connect` stream workers dial (Hello, then results up and batches
down). The router's bookkeeping for them (`Router.attach`, `on_result`, `detach`) is in
`router.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from sloline.serving import wire

if TYPE_CHECKING:
    from sloline.serving.router import Router

log = logging.getLogger(__name__)


class WorkerConn:
    """One connected worker process and its stream.

    The router sends a batch by handing its encoded message to `send`; the stream's
    handler (`WorkerService.Connect`) writes it in `write_until_closed`. That is one
    future and one task step per batch, and gRPC gets one write at a time.
    """

    __slots__ = ("_closing", "_pending", "_wake", "dispatched_at", "hardware", "id", "pid", "stage")

    def __init__(self, id: str, stage: str, pid: int, hardware: str) -> None:
        self.id = id
        self.stage = stage
        self.pid = pid
        self.hardware = hardware
        self.dispatched_at = 0.0  # when its batch in flight (one at most) was dispatched
        self._pending: deque[bytes] = deque()
        self._closing = False
        self._wake: asyncio.Future[None] | None = None

    def send(self, message: bytes) -> None:
        self._pending.append(message)
        self._notify()

    def close(self, *, flush: bool = True) -> None:
        """End the stream once everything sent so far is written (`flush`), or at once:
        a detached worker's batch is back in the queue and must not reach it too."""
        if not flush:
            self._pending.clear()
        self._closing = True
        self._notify()

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def write_until_closed(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        pending = self._pending
        loop = asyncio.get_running_loop()
        while True:
            while pending:
                await context.write(pending.popleft())
            if self._closing:
                return
            self._wake = loop.create_future()
            await self._wake


class WorkerService:
    """gRPC endpoint workers dial: Hello, then results up and batches down.

    Registered with `wire`'s (de)serialisers (`add_worker_service`): messages arrive as
    (message, payload) pairs and leave as encoded bytes.
    """

    def __init__(self, router: Router) -> None:
        self.router = router

    async def Connect(  # noqa: N802 - gRPC method name
        self,
        _requests: AsyncIterator[wire.Sent],
        context: grpc.aio.ServicerContext[wire.Sent, bytes],
    ) -> None:
        first = await context.read()
        if first is grpc.aio.EOF or not first[0].HasField("hello"):
            await context.write(wire.welcome_message("first message must be Hello"))
            return
        try:
            conn = self.router.attach(first[0].hello)
        except ValueError as exc:
            await context.write(wire.welcome_message(str(exc)))
            return
        await context.write(wire.welcome_message())
        reader = asyncio.create_task(self._read(conn, context))
        try:
            await conn.write_until_closed(context)
        finally:
            reader.cancel()
            self.router.detach(conn)

    async def _read(
        self, conn: WorkerConn, context: grpc.aio.ServicerContext[wire.Sent, bytes]
    ) -> None:
        try:
            while (received := await context.read()) is not grpc.aio.EOF:
                message, payload = received
                if message.HasField("result"):
                    self.router.on_result(conn, message.result, payload)
                elif message.HasField("credit"):
                    self.router.on_credit(conn, message.credit)
                elif message.HasField("leaving"):
                    self.router.leaving(conn)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("worker %s sent a message the router could not handle", conn.id)
        finally:
            self.router.detach(conn)


def add_worker_service(server: grpc.aio.Server, router: Router) -> None:
    """Register `WorkerService.Connect` for `router` on a `grpc.aio.Server` (before start)."""
    handler = grpc.stream_stream_rpc_method_handler(
        WorkerService(router).Connect,
        request_deserializer=wire.decode_worker_message,
        response_serializer=wire.identity,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(wire.SERVICE, {"Connect": handler}),)
    )
