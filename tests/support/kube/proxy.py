"""The process kubelet's kube-proxy: a TCP proxy from Service addresses to pod endpoints.

The kubelet (`kubelet.py`) runs it as a child process (`python -I proxy.py`), so the
bytes of every request through a Service are copied outside the test process and its GIL.
It reads its table from stdin, one JSON object per line, each a complete replacement:

    {"127.2.0.1:8001": ["127.1.0.3:8001"], "127.2.0.1:8000": []}

For every `clusterIP:port` with at least one endpoint it listens there; each connection
goes to an endpoint chosen at random (as kube-proxy's iptables mode does, once per
connection). An address whose Service has no endpoints does not listen, so a client is
refused as by kube-proxy's REJECT rule; an endpoint that refuses closes the client's
connection. Connections keep their endpoint while they last, like conntrack entries.
It exits when stdin closes (the kubelet is gone). Standard library only (uvloop where
installed).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

HIGH_WATER = 1 << 20


class Pipe(asyncio.Protocol):
    """One direction of a proxied connection: what arrives here is written to `peer`,
    with back-pressure (reading pauses while the peer's send buffer is full)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Pipe | None = None
        self.pending: list[bytes] = []
        self.paused = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.transport.set_write_buffer_limits(high=HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            if self.peer.transport.can_write_eof():
                self.peer.transport.write_eof()
            else:
                self.peer.transport.close()
        return True  # keep our write side open: the other direction may still send

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        if not self.closed.done():
            self.closed.set_result(None)

    def link(self, peer: Pipe) -> None:
        self.peer = peer
        for data in self.pending:
            self.data_received(data)
        self.pending.clear()


class Proxy:
    def __init__(self) -> None:
        self.table: dict[str, list[str]] = {}
        self.servers: dict[str, asyncio.Server] = {}

    async def update(self, table: dict[str, list[str]]) -> list[str]:
        """Apply a new table; the addresses that could not listen, with the reason."""
        self.table, errors = table, []
        for address in list(self.servers):
            if not table.get(address):
                self.servers.pop(address).close()
        for address, endpoints in table.items():
            if endpoints and address not in self.servers:
                host, port = address.rsplit(":", 1)
                try:
                    self.servers[address] = await asyncio.get_running_loop().create_server(
                        lambda a=address: self.accept(a), host, int(port), reuse_address=True
                    )
                except OSError as exc:
                    errors.append(f"{address}: {exc}")
        return errors

    def accept(self, address: str) -> Pipe:
        client = Pipe()
        asyncio.get_running_loop().create_task(self.connect(address, client))
        return client

    async def connect(self, address: str, client: Pipe) -> None:
        endpoints = self.table.get(address) or []
        if not endpoints:
            self.abort(client)
            return
        host, port = random.choice(endpoints).rsplit(":", 1)
        backend = Pipe()
        try:
            await asyncio.get_running_loop().create_connection(lambda: backend, host, int(port))
        except OSError:
            self.abort(client)
            return
        assert backend.transport is not None
        backend.link(client)
        client.link(backend)
        if client.closed.done():
            backend.transport.close()

    @staticmethod
    def abort(client: Pipe) -> None:
        if client.transport is not None:
            client.transport.abort()  # a reset, as a REJECT would answer


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    proxy = Proxy()
    while line := await reader.readline():
        errors = await proxy.update(json.loads(line))
        # The kubelet waits for this answer before it relies on the table.
        print(json.dumps({"errors": errors}), flush=True)


if __name__ == "__main__":
    try:  # the fastest event loop at hand: every request through a Service passes here
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
