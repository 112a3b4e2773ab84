"""A router's drain (`RouterApp.drain`, what SIGTERM starts once the preStop pause is over):
a real router with real workers of the sleepy pipeline in this process, and real clients.

It turns unready and takes no new connection at once; a REST request in flight is
answered with `Connection: close`, and so is one that a keep-alive client sends on its
open (idle) connection after the drain began, each connection closing after its answer,
so a client behind a Service reconnects to another router instead of failing; an
in-flight gRPC call completes; the drain ends once every client has left.

Behind a Service (the process kubelet's kube-proxy, `tests/support/kube/proxy.py`, in
front of two routers that share their workers), a gRPC client calling all along leaves
the draining router without a single failed call: its connection is closed for its age
(`grpc_max_age_s`), with the graceful GOAWAY, before the router stops its gRPC server."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from sloline.model_server.worker import Worker, WorkerSettings
from sloline.runtimes import load_pipeline_stage
from sloline.serving.app import RouterApp
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import load_pipeline
from tests.support.aio import wait_until
from tests.support.net import free_port
from tests.support.serve import NOOP, SLEEPY

PROXY = Path(__file__).resolve().parents[2] / "support" / "kube" / "proxy.py"

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


class Service:
    """kube-proxy's TCP proxy on a free loopback port: `route(*ports)` sets the endpoints
    (router ports on 127.0.0.1) a new connection may go to; open ones keep theirs."""

    def __init__(self) -> None:
        self.port = free_port()
        self._proxy = subprocess.Popen(
            [sys.executable, "-I", str(PROXY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def route(self, *ports: int) -> None:
        assert self._proxy.stdin is not None and self._proxy.stdout is not None
        table = {f"127.0.0.1:{self.port}": [f"127.0.0.1:{p}" for p in ports]}
        self._proxy.stdin.write(json.dumps(table) + "\n")
        self._proxy.stdin.flush()
        assert json.loads(self._proxy.stdout.readline()) == {"errors": []}

    def close(self) -> None:
        assert self._proxy.stdin is not None
        self._proxy.stdin.close()
        self._proxy.wait(10)


@pytest.fixture
def service() -> Iterator[Service]:
    proxy = Service()
    yield proxy
    proxy.close()


@pytest.mark.timeout(120)
async def test_grpc_clients_behind_a_service_leave_a_draining_router_without_a_failed_call(
    service: Service,
) -> None:
    loaded = load_pipeline(NOOP)
    settings = ServerSettings(http_port=0, grpc_port=0, insecure_workers=True, grpc_max_age_s=1.0)
    a, b = (
        RouterApp(
            loaded, max_batch={"s1": 4, "s2": 4, "s3": 4}, server=settings, router=RouterSettings()
        )
        for _ in range(2)
    )
    await a.start()
    await b.start()
    workers = [
        Worker(
            WorkerSettings(
                pipeline_file=Path(loaded.file), stage=stage, routers=(a.worker_url, b.worker_url)
            ),
            load_pipeline_stage(loaded, stage),
            loaded.name,
        )
        for stage in ("s1", "s2", "s3")
    ]
    serving = [asyncio.create_task(w.serve()) for w in workers]
    client = grpcaio.InferenceServerClient(f"127.0.0.1:{service.port}")
    try:
        await wait_until(lambda: a.router.ready() and b.router.ready(), "both routers ready")
        service.route(a.server.grpc_port)
        x = grpcaio.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(np.ones(3, np.float32))
        await client.infer("noop", [x])  # connected to router A
        service.route(b.server.grpc_port)  # A leaves the endpoints (its preStop pause)
        outcomes: Counter[str] = Counter()

        async def call() -> None:
            try:
                await client.infer("noop", [x], parameters=LONG)  # a slow machine is no failure
                outcomes["OK"] += 1
            except InferenceServerException as exc:
                outcomes[f"{exc.status()} {exc.message()}"] += 1

        calls, draining = [], None
        for i in range(1000):  # a call every 2 ms; A drains after the first 100
            calls.append(asyncio.create_task(call()))
            if i == 100:
                draining = asyncio.create_task(a.drain(10.0))
            await asyncio.sleep(0.002)
        await asyncio.gather(*calls)
        assert draining is not None
        await draining
        assert outcomes == {"OK": 1000}, outcomes
        assert a.router.metrics.codes[200] > 1 and b.router.metrics.codes[200] > 0
    finally:
        await client.close()
        for worker in workers:
            worker.stop()
        for app in (a, b):
            await app.stop()
        await asyncio.wait_for(asyncio.gather(*serving), 10)
