"""A worker follows the routers its `--router` names resolve to: real routers (RouterApp
with its gRPC worker port) and a real worker (the no-op stage) in this process. Name
resolution is real for `resolve`; to make a name's answer change (a router appearing and
vanishing, as a headless Service's records do) the worker's resolver is replaced, since
no DNS server whose records a test could change runs here."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from sloline.model_server import worker as worker_module
from sloline.model_server.worker import Worker, WorkerSettings
from sloline.runtimes import load_pipeline_stage
from sloline.serving.app import RouterApp
from sloline.serving.peers import resolve
from sloline.serving.router import RouterSettings
from sloline.serving.server import ServerSettings
from sloline.spec import load_pipeline
from tests.support.aio import wait_until
from tests.support.serve import NOOP


async def test_resolve_returns_every_address_of_a_name() -> None:
    expected = {
        f"[{info[4][0]}]:8003" if info[0] == socket.AF_INET6 else f"{info[4][0]}:8003"
        for info in socket.getaddrinfo("localhost", 8003, type=socket.SOCK_STREAM)
    }
    assert "127.0.0.1:8003" in expected
    assert await resolve(("localhost:8003",)) == (expected, [])
    both = await resolve(("127.0.0.1:1", "127.0.0.2:2"))
    assert both == ({"127.0.0.1:1", "127.0.0.2:2"}, [])
    addresses, failed = await resolve(("no-such-router.invalid:8003",))
    assert addresses is None
    assert [f.split(" (")[0] for f in failed] == ["no-such-router.invalid:8003 does not resolve"]
    addresses, failed = await resolve(("127.0.0.1:1", "no-such-router.invalid:8003"))
    assert addresses == {"127.0.0.1:1"} and len(failed) == 1


async def test_worker_follows_routers_that_come_and_go(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_pipeline(NOOP)
    server = ServerSettings(http_port=0, grpc_port=0, insecure_workers=True)
    apps = [
        RouterApp(
            loaded, max_batch={"s1": 4, "s2": 4, "s3": 4}, server=server, router=RouterSettings()
        )
        for _ in range(2)
    ]
    for app in apps:
        await app.start()
    a, b = (app.worker_url for app in apps)
    answer: set[str] = {a}

    async def fake_resolve(_: tuple[str, ...]) -> tuple[set[str], list[str]]:
        return set(answer), []

    monkeypatch.setattr(worker_module, "resolve", fake_resolve)
    runner = load_pipeline_stage(loaded, "s1")
    settings = WorkerSettings(
        pipeline_file=Path(loaded.file), stage="s1", routers=("routers:1",), resolve_s=0.05
    )
    worker = Worker(settings, runner, loaded.name)
    serving = asyncio.create_task(worker.serve())
    queue_a, queue_b = (app.router.queues["s1"] for app in apps)
    try:
        await wait_until(lambda: queue_a.workers == 1, "the worker at router A")
        answer.add(b)  # a second router appears
        await wait_until(lambda: queue_b.workers == 1, "the worker at router B")
        assert queue_a._idle and not queue_b._idle  # the one credit stays at A
        assert worker.credit.holder == a
        answer.discard(a)  # router A leaves the answer: served until it closes the stream
        await asyncio.sleep(0.3)
        assert queue_a.workers == 1 and set(worker.sessions) == {a, b}
        await apps[0].drain(0.1)
        await apps[0].stop()  # closes the stream; the worker does not dial it again
        await wait_until(lambda: bool(queue_b._idle), "the credit to move to router B")
        await wait_until(lambda: a not in worker._followers, "the worker to forget router A")
        assert worker.credit.holder == b and set(worker.sessions) == {b}
        answer.add(a)  # back in the answer (a new router on that address)
        apps[0] = RouterApp(
            loaded,
            max_batch={"s1": 4, "s2": 4, "s3": 4},
            server=replace(server, worker_port=int(a.rsplit(":", 1)[1])),
            router=RouterSettings(),
        )
        await apps[0].start()
        queue_a = apps[0].router.queues["s1"]
        await wait_until(lambda: queue_a.workers == 1, "the worker to dial router A again")
        assert not queue_a._idle  # on standby there: the credit stays at router B
    finally:
        worker.stop()
        await asyncio.wait_for(serving, 10)
        for app in apps:
            await app.drain(0.1)
            await app.stop()  # a second stop of a stopped one does nothing
