"""Front-door overhead: what the OIP v2 REST and gRPC doors cost over the transport floor.

One server process runs, on one asyncio loop (as the router does), four servers over an
echo data plane (the output is the input tensor, no model):

- REST front door (`create_http_app` on uvicorn), binary tensor extension both ways;
  once on plain uvicorn and once with the router's uvicorn settings (its front-door
  limits: header/body timeouts and connection cap, `serving/limits.py`);
- raw HTTP echo: uvicorn with a bare ASGI app returning the request body (same bytes);
- gRPC front door (`add_inference_service` on grpc.aio), raw_input/output_contents;
- raw gRPC echo: a grpc.aio unary method returning its request bytes (no protobuf).

The client (this process) sends pre-encoded bodies, so client-side encoding costs the
same for a door and its raw floor, and the difference is the door's server-side work
(framework, parsing, validation, codec, plane call, encoding). Payloads: 64 B and
602 KB (1x3x224x224) FP32. For each: p50 / p99 latency of sequential requests, and
requests/s with 1 and with `--concurrency` requests in flight. A second table gives the
in-process ASGI dispatch cost of the web frameworks considered for the REST door.

Usage: `python benchmarks/frontdoor_overhead.py [--quick] [--malloc-threshold-mib 64]`;
prints markdown tables. `--malloc-threshold-mib` raises glibc's mmap/trim thresholds in
the server process (as `MALLOC_MMAP_THRESHOLD_` would), which matters for large tensors.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import functools
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sloline.common.tensors import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    Tensor,
    TensorMetadata,
)
from sloline.serving import grpc_codec, rest_codec
from sloline.serving.grpc_frontdoor import add_inference_service, server_options
from sloline.serving.http import bind_socket, create_http_app
from sloline.serving.limits import HttpLimits
from sloline.serving.server import uvicorn_config

MODEL = "echo"
ECHO_METHOD = "/bench.Echo/Echo"
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
PAYLOADS = {"64 B": (1, 16), "602 KB": (1, 3, 224, 224)}
MAX_BYTES = 64 * 1024 * 1024


class EchoPlane:
    """Data plane whose model returns its input `x` as output `y`."""

    metadata = ModelMetadata(MODEL, "echo", ("1",), (TensorMetadata("x", "FP32", (-1,)),),
                             (TensorMetadata("y", "FP32", (-1,)),))  # fmt: skip

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def check_model(self, _name: str, _version: str = "") -> None:
        pass

    def model_ready(self, _name: str, _version: str = "") -> bool:
        return True

    def model_metadata(self, _name: str, _version: str = "") -> ModelMetadata:
        return self.metadata

    async def infer(self, request: InferRequest) -> InferResponse:
        return InferResponse(request.model_name, {"y": request.inputs["x"]}, request.id)


async def raw_http_echo(scope: Scope, receive: Receive, send: Send) -> None:
    """The HTTP floor: uvicorn and the same bytes back, no framework, no parsing."""
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _raw_grpc_echo(request: bytes, _context: object) -> bytes:
    return request


async def _serve(conn: Connection) -> None:
    plane = EchoPlane()
    server = grpc.aio.server(options=server_options(MAX_BYTES))
    add_inference_service(server, plane)
    echo = grpc.unary_unary_rpc_method_handler(_raw_grpc_echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": echo}),)
    )
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servers: list[uvicorn.Server] = []
    tasks = []
    ports = {"grpc": grpc_port}
    door = create_http_app(plane, max_body_bytes=MAX_BYTES)
    for key, app in (("rest", door), ("rest_limits", door), ("raw_http", raw_http_echo)):
        sock = bind_socket("127.0.0.1", 0)
        ports[key] = sock.getsockname()[1]
        if key == "rest_limits":
            config = uvicorn_config(app, HttpLimits(), keepalive_timeout_s=5.0)
        else:
            config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="off")
        servers.append(uvicorn.Server(config))
        tasks.append(asyncio.create_task(servers[-1].serve(sockets=[sock])))
    deadline = time.monotonic() + 10
    while not all(s.started for s in servers):  # poll with a deadline
        if time.monotonic() > deadline or any(t.done() for t in tasks):
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    conn.send(ports)
    await asyncio.gather(*tasks)


def tune_malloc(threshold_bytes: int) -> None:
    """Keep glibc from mmap-ing (and trimming) every big buffer: each 602 KB request
    otherwise costs several fresh mmaps and ~150 page faults per copy."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    if not (libc.mallopt(m_mmap_threshold, threshold_bytes)
            and libc.mallopt(m_trim_threshold, 4 * threshold_bytes)):  # fmt: skip
        raise RuntimeError("mallopt failed")


def serve(conn: Connection, malloc_threshold_bytes: int) -> None:
    if malloc_threshold_bytes:
        tune_malloc(malloc_threshold_bytes)
    asyncio.run(_serve(conn))


class HttpConnection:
    """Minimal keep-alive HTTP/1.1 client, so client cost stays small and identical."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @staticmethod
    async def open(port: int) -> HttpConnection:
        deadline = time.monotonic() + 10
        while True:
            try:
                return HttpConnection(*await asyncio.open_connection("127.0.0.1", port))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def post(self, head: bytes, body: bytes) -> bytes:
        self.writer.writelines((head, body))
        status = await self.reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"HTTP request failed: {status!r}")
        length = 0
        while (line := await self.reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def http_head(path: str, body: bytes, header_length: int | None) -> bytes:
    extra = f"Inference-Header-Content-Length: {header_length}\r\n" if header_length else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode()  # fmt: skip


Call = Callable[[], Awaitable[bytes]]


async def measure(calls: list[Call], sequential: int, duration_s: float) -> dict[str, float]:
    """p50/p99 over `sequential` requests on calls[0]; req/s with 1 and len(calls) in flight."""
    first = calls[0]
    for _ in range(max(5, sequential // 10)):
        await first()
    latencies = []
    for _ in range(sequential):
        start = time.perf_counter()
        await first()
        latencies.append(time.perf_counter() - start)
    latencies.sort()

    async def loop(call: Call, until: float, counts: list[int]) -> None:
        while time.perf_counter() < until:
            await call()
            counts[0] += 1

    result = {
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
    }
    for key, group in (("rps_1", calls[:1]), ("rps_n", calls)):
        counts = [0]
        start = time.perf_counter()
        until = start + duration_s
        await asyncio.gather(*(loop(call, until, counts) for call in group))
        result[key] = counts[0] / (time.perf_counter() - start)
    return result


async def open_http(port: int, head: bytes, body: bytes, count: int) -> list[HttpConnection]:
    """Fresh keep-alive connections for one case (none idles past uvicorn's timeout)."""
    conns = [await HttpConnection.open(port) for _ in range(count)]
    reply = await conns[0].post(head, body)
    assert len(reply) > len(body) // 2, f"no tensor in the answer: {reply[:200]!r}"
    return conns


async def run_payload(
    label: str, shape: tuple[int, ...], ports: dict[str, int], channel: Any,
    args: argparse.Namespace,
) -> list[list[str]]:  # fmt: skip
    x = Tensor.from_array(np.random.default_rng(0).random(shape, dtype=np.float32))
    request = InferRequest(MODEL, {"x": x}, parameters={rest_codec.BINARY_DATA_OUTPUT: True})
    rest = rest_codec.encode_rest_request(request, binary=True)
    grpc_body = grpc_codec.request_to_proto(request).SerializeToString()
    grpc_infer = channel.unary_unary(INFER_METHOD)
    grpc_echo = channel.unary_unary(ECHO_METHOD)
    assert len(await grpc_infer(grpc_body)) > x.nbytes, "gRPC door answered no tensor"
    door_head = http_head(f"/v2/models/{MODEL}/infer", rest.body, rest.header_length)
    raw_head = http_head("/echo", rest.body, None)
    rows = []
    cases: list[tuple[str, int | Any, bytes]] = [  # (name, HTTP port or gRPC method, head)
        ("REST OIP door (binary)", ports["rest"], door_head),
        ("REST OIP door (binary), front-door limits", ports["rest_limits"], door_head),
        ("raw HTTP echo (uvicorn, bare ASGI)", ports["raw_http"], raw_head),
        ("gRPC OIP door", grpc_infer, b""),
        ("raw gRPC echo (grpc.aio, bytes)", grpc_echo, b""),
    ]
    for name, target, head in cases:
        conns = []
        if isinstance(target, int):
            conns = await open_http(target, head, rest.body, args.concurrency)
            calls: list[Call] = [functools.partial(c.post, head, rest.body) for c in conns]
        else:
            calls = [functools.partial(target, grpc_body)] * args.concurrency
        stats = await measure(calls, args.requests, args.duration_s)
        rows.append([name, label, f"{stats['p50_ms']:.3f}", f"{stats['p99_ms']:.3f}",
                     f"{stats['rps_1']:.0f}", f"{stats['rps_n']:.0f}"])  # fmt: skip
        for conn in conns:
            conn.close()
    return rows


async def run_client(ports: dict[str, int], args: argparse.Namespace) -> list[list[str]]:
    target = f"127.0.0.1:{ports['grpc']}"
    channel = grpc.aio.insecure_channel(target, options=server_options(MAX_BYTES))
    await channel.channel_ready()
    rows = []
    for label, shape in PAYLOADS.items():
        rows += await run_payload(label, shape, ports, channel, args)
    await channel.close()
    return rows


def asgi_dispatch_rows(requests: int) -> list[list[str]]:
    """In-process cost of routing one POST through each framework (no sockets)."""

    async def handler(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    decorated = FastAPI()
    decorated.post("/v2/models/{name}/infer")(handler)
    plain_route = FastAPI()
    plain_route.add_route("/v2/models/{name}/infer", handler, methods=["POST"])
    starlette = Starlette(routes=[Route("/v2/models/{name}/infer", handler, methods=["POST"])])
    body = b'{"inputs": []}'
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v2/models/echo/infer",
             "raw_path": b"/v2/models/echo/infer", "query_string": b"", "root_path": "",
             "headers": [(b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}  # fmt: skip

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(_message: object) -> None:
        return None

    async def per_request_us(app: Callable[..., Awaitable[None]]) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(requests):
                await app(dict(scope), receive, send)
            best = min(best, (time.perf_counter() - start) / requests * 1e6)
        return best

    async def run() -> list[list[str]]:
        return [[name, f"{await per_request_us(app):.1f}"] for name, app in (
            ("FastAPI, decorated route (DI)", decorated),
            ("FastAPI, plain Starlette route", plain_route),
            ("Starlette (used)", starlette),
        )]  # fmt: skip

    return asyncio.run(run())


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke mode (CI): ~15 s")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument(
        "--malloc-threshold-mib", type=int, default=0,
        help="server: raise glibc's mmap/trim thresholds to this (0: glibc defaults)",
    )  # fmt: skip
    args = parser.parse_args()
    args.requests = 300 if args.quick else 3000
    args.duration_s = 0.5 if args.quick else 3.0

    parent, child = mp.get_context("spawn").Pipe()
    threshold = args.malloc_threshold_mib * 1024 * 1024
    server = mp.get_context("spawn").Process(target=serve, args=(child, threshold), daemon=True)
    server.start()
    try:
        if not parent.poll(30):
            raise RuntimeError("benchmark servers did not start within 30 s")
        rows = asyncio.run(run_client(parent.recv(), args))
    finally:
        server.terminate()
        server.join(10)

    environment = (
        f"python {platform.python_version()}, grpcio {grpc.__version__}, uvicorn "
        f"{uvicorn.__version__}, {os.cpu_count()} CPUs, asyncio loop, client and server in "
        f"separate processes on loopback; {args.requests} sequential requests, "
        f"{args.duration_s} s per throughput run; server malloc thresholds: "
        f"{args.malloc_threshold_mib or 'glibc default'} MiB"
    )
    print(environment + "\n")
    print(table(["path", "payload", "p50 ms", "p99 ms", "req/s (1 in flight)",
                 f"req/s ({args.concurrency} in flight)"], rows))  # fmt: skip
    dispatch = asgi_dispatch_rows(3000 if args.quick else 20000)
    print("\nASGI dispatch per request, in-process, 14-byte body:\n")
    print(table(["framework", "us/request"], dispatch))
    if args.json:
        keys = ["path", "payload", "p50_ms", "p99_ms", "rps_1", f"rps_{args.concurrency}"]
        args.json.write_text(json.dumps({
            "environment": environment,
            "frontdoors": [
                {k: v if k in ("path", "payload") else float(v)
                 for k, v in zip(keys, row, strict=True)}
                for row in rows
            ],
            "asgi_dispatch_us": {name: float(us) for name, us in dispatch},
        }, indent=2) + "\n")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
