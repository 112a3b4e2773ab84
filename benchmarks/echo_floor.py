"""Transport floors for the per-hop comparison: raw loopback echo round trips.

A sloline hop is one message router -> worker and one back on a gRPC bidi stream, plus
the work on both ends. Its floors, served by one process separate from the client:

- raw gRPC unary echo: a grpc.aio unary method returning its request bytes (no
  protobuf), as in `frontdoor_overhead.py`;
- raw gRPC stream ping-pong: a grpc.aio bidi stream writing back every message it
  reads, the transport a worker connection uses;
- raw HTTP echo: uvicorn with `frontdoor_overhead.raw_http_echo` (a bare ASGI app
  returning the body) on a socket from `sloline.serving.http.bind_socket`.

Runs as a child of the orchestrator speaking JSON lines: it answers `{"ports": ...}` on
start; then `{"kind": "grpc", "method": "unary"|"stream", "size": B, "count": N}` returns
sequential round-trip statistics. The HTTP echo is measured by the orchestrator with
the same load generator as the systems (`loadgen.py`), on `ports["raw_http"]`.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import sys
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontdoor_overhead import raw_http_echo
from loadgen import summarize

from sloline.serving.http import bind_socket

UNARY_METHOD = "/bench.Echo/Echo"
STREAM_METHOD = "/bench.Echo/PingPong"
MAX_BYTES = 64 * 1024 * 1024
OPTIONS = [("grpc.max_send_message_length", MAX_BYTES),
           ("grpc.max_receive_message_length", MAX_BYTES)]  # fmt: skip


async def _echo(request: bytes, _context: object) -> bytes:
    return request


async def _ping_pong(requests: AsyncIterator[bytes], _context: object) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


async def _serve(conn: Connection) -> None:
    server = grpc.aio.server(options=OPTIONS)
    handlers = {"Echo": grpc.unary_unary_rpc_method_handler(_echo),
                "PingPong": grpc.stream_stream_rpc_method_handler(_ping_pong)}  # fmt: skip
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sock = bind_socket("127.0.0.1", 0)
    http = uvicorn.Server(uvicorn.Config(raw_http_echo, log_level="error", access_log=False,
                                         lifespan="off"))  # fmt: skip
    task = asyncio.create_task(http.serve(sockets=[sock]))
    deadline = time.monotonic() + 30
    while not http.started:
        if task.done() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    conn.send({"grpc": grpc_port, "raw_http": sock.getsockname()[1]})
    await task


def serve(conn: Connection) -> None:
    asyncio.run(_serve(conn))


async def grpc_round_trips(
    target: str, method: str, size: int, count: int, warmup: int
) -> dict[str, Any]:
    payload = bytes(size)
    async with grpc.aio.insecure_channel(target, options=OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        if method == "unary":
            call = channel.unary_unary(UNARY_METHOD)

            async def once() -> bytes:
                return bytes(await call(payload))

            stream = None
        else:
            stream = channel.stream_stream(STREAM_METHOD)()

            async def once() -> bytes:
                await stream.write(payload)
                return bytes(await stream.read())

        for _ in range(warmup):
            assert len(await once()) == size
        latencies = []
        for _ in range(count):
            t0 = time.perf_counter()
            await once()
            latencies.append(time.perf_counter() - t0)
        if stream is not None:
            await stream.done_writing()
    return summarize(latencies)


def main() -> None:
    parent, child = mp.get_context("spawn").Pipe()
    server = mp.get_context("spawn").Process(target=serve, args=(child,), daemon=True)
    server.start()
    try:
        if not parent.poll(60):
            raise SystemExit("echo servers did not start within 60 s")
        ports = parent.recv()
        sys.stdout.write(json.dumps({"ports": ports, "pid": server.pid}) + "\n")
        sys.stdout.flush()
        for line in sys.stdin:
            command = json.loads(line)
            try:
                result = asyncio.run(grpc_round_trips(
                    f"127.0.0.1:{ports['grpc']}", command["method"], command["size"],
                    command["count"], command.get("warmup", 50),
                ))  # fmt: skip
            except Exception as exc:
                result = {"failed": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    finally:
        server.terminate()
        server.join(10)


if __name__ == "__main__":
    main()
