"""A router's drain (`RouterApp.drain`, what SIGTERM starts once the preStop pause is over):
a real router with real workers of the sleepy pipeline in this process, and real clients.

It turns unready and takes no new connection at once; a REST request in flight is
answered with `Connection: close`, and so is one that a keep-alive client sends on its
open (idle) connection after the drain began, each connection closing after its answer,
so a client behind a Service reconnects to another router instead of failing; an
in-flight gRPC call completes; the drain ends once every client has left."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio

from sloline.model_server.worker import Worker, WorkerSettings
from sloline.runtimes import load_pipeline_stage
from sloline.serving.app import RouterApp
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import load_pipeline
from tests.support.serve import SLEEPY

SLOW_ROWS = 25  # the slow stage sleeps 20 ms a row: ~0.5 s in flight
LONG = {"timeout_ms": 10_000}  # beyond the SLO: the request is slow on purpose


def body(rows: int) -> bytes:
    x = {"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": [1.0] * (4 * rows)}
    return json.dumps({"inputs": [x], "parameters": LONG}).encode()


def post(connection: http.client.HTTPConnection, rows: int) -> tuple[int, str]:
    """One request on a keep-alive connection: the status and its `Connection` header."""
    connection.request("POST", "/v2/models/sleepy/infer", body(rows), {"Content-Type": "json"})
    response = connection.getresponse()
    response.read()
    return response.status, (response.getheader("connection") or "").lower()


async def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
async def test_a_draining_router_answers_its_open_connections_then_closes_them() -> None:
    loaded = load_pipeline(SLEEPY)
    server = ServerSettings(http_port=0, grpc_port=0, insecure_workers=True)
    app = RouterApp(
        loaded, max_batch={"parse": 1, "slow": 1}, server=server, router=RouterSettings()
    )
    await app.start()
    workers = [
        Worker(
            WorkerSettings(pipeline_file=Path(loaded.file), stage=stage, routers=(app.worker_url,)),
            load_pipeline_stage(loaded, stage),
            loaded.name,
        )
        for stage in ("parse", "slow")
    ]
    serving = [asyncio.create_task(w.serve()) for w in workers]
    port = app.server.http_port
    busy = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    grpc_client = grpcaio.InferenceServerClient(f"127.0.0.1:{app.server.grpc_port}")
    try:
        await wait_until(app.router.ready, "the router ready")
        for connection in (busy, idle):  # both open, kept alive
            assert await asyncio.to_thread(post, connection, 1) == (200, "")
        x = grpcaio.InferInput("x", [SLOW_ROWS, 4], "FP32")
        x.set_data_from_numpy(np.ones((SLOW_ROWS, 4), np.float32))
        await grpc_client.infer("sleepy", [x], parameters=LONG)  # the channel is connected

        in_flight = asyncio.create_task(asyncio.to_thread(post, busy, SLOW_ROWS))
        in_flight_grpc = asyncio.create_task(grpc_client.infer("sleepy", [x], parameters=LONG))
        await wait_until(lambda: app.router.inflight == 2, "both requests in flight")
        draining = asyncio.create_task(app.drain(30.0))
        await wait_until(lambda: not app.router.ready(), "the router unready")
        with pytest.raises(ConnectionRefusedError):  # no new connection
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

        # The request in flight, and one sent on the idle connection now, are answered;
        # each answer says the connection closes.
        assert await in_flight == (200, "close")
        assert await asyncio.to_thread(post, idle, 1) == (200, "close")
        answer = await in_flight_grpc
        assert answer.as_numpy("x").shape == (SLOW_ROWS, 4)
        # Every client left: the drain ends well before its 30 s.
        await asyncio.wait_for(draining, 10)
        assert app.server.doors_closed() and app.router.inflight == 0
    finally:
        busy.close()
        idle.close()
        await grpc_client.close()
        for worker in workers:
            worker.stop()
        await app.stop()
        await asyncio.wait_for(asyncio.gather(*serving), 10)
