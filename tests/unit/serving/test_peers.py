"""A router's peers over real sockets: each asked at once, a peer that is down, silent
or talks nonsense left out within the timeout and logged once until it answers again,
names resolved to every address, and this router's own address never asked."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import orjson
import pytest

from sloline.serving.auth import AuthConfigError
from sloline.serving.peers import Peers, address, get_json, resolve
from sloline.serving.server import ServerSettings
from tests.support.net import free_port

Answer = Callable[[], bytes]


def http(body: bytes, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Peer:
    """A TCP server that answers every request with `answer()` (or nothing)."""

    def __init__(self, answer: Answer | None) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests.append(await reader.readuntil(b"\r\n\r\n"))
        if self.answer is None:  # silent: hold the connection open
            await asyncio.sleep(30)
        else:
            writer.write(self.answer())
            await writer.drain()
        writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return address("127.0.0.1", self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def peers() -> AsyncIterator[Callable[[Answer | None], Any]]:
    started: list[Peer] = []

    async def start(answer: Answer | None) -> tuple[Peer, str]:
        peer = Peer(answer)
        started.append(peer)
        return peer, await peer.start()

    yield start
    for peer in started:
        assert peer.server is not None
        peer.server.close()


async def test_every_peer_is_asked_and_the_bad_ones_are_left_out_in_time(
    peers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    good, good_at = await peers(lambda: http(orjson.dumps({"n": 1})))
    _, silent_at = await peers(None)
    _, refusing_at = await peers(lambda: http(b'{"error": "no"}', "404 Not Found"))
    _, garbled_at = await peers(lambda: http(b"not json"))
    down_at = address("127.0.0.1", free_port())  # nothing listens
    docs: list[Any] = []
    group = Peers((good_at, silent_at, refusing_at, garbled_at, down_at), timeout_s=0.5)
    caplog.set_level(logging.INFO, "sloline.serving.peers")
    start = time.monotonic()
    assert await group.gather("/some/path", docs.append) == 1
    assert time.monotonic() - start < 2.0  # the silent peer costs the timeout, no more
    assert docs == [{"n": 1}]
    assert good.requests[0].startswith(b"GET /some/path HTTP/1.1\r\n")
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 4
    for peer in (silent_at, refusing_at, garbled_at, down_at):
        assert sum(peer in line for line in left_out) == 1
    assert any("404" in line for line in left_out) and any("JSON" in line for line in left_out)
    # Asked again: still left out, not logged again.
    caplog.clear()
    assert await group.gather("/some/path", docs.append) == 1
    assert not [r for r in caplog.records if "left out" in r.getMessage()]


async def test_a_refused_document_counts_as_a_failure_until_it_is_used(
    peers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, at = await peers(lambda: http(b"{}"))
    group = Peers((at,))
    caplog.set_level(logging.INFO, "sloline.serving.peers")
    refuse = True

    def use(doc: Any) -> None:
        if refuse:
            raise ValueError("not statistics")

    assert await group.gather("/", use) == 0
    assert "unusable answer: ValueError: not statistics" in caplog.text
    refuse = False
    assert await group.gather("/", use) == 1
    assert f"statistics peer {at} answers again" in caplog.text


async def test_asks_at_once_share_the_first_resolution(peers: Any) -> None:
    """Two asks at once, before the names were ever resolved: both ask the peer (the
    second waits for the first one's resolution instead of finding no address yet)."""
    peer, at = await peers(lambda: http(b"{}"))
    group = Peers((f"localhost:{at.rsplit(':', 1)[1]}",))
    used = await asyncio.gather(*(group.gather("/", lambda _: None) for _ in range(3)))
    assert used == [1, 1, 1]
    assert len(peer.requests) == 3


async def test_own_address_and_no_entries_ask_no_one(peers: Any) -> None:
    me, at = await peers(lambda: http(b"{}"))
    group = Peers((at,))
    port = int(at.rsplit(":", 1)[1])
    group.set_own("127.0.0.1", port)
    assert await group.addresses() == set()
    assert await group.gather("/", lambda _: None) == 0
    assert me.requests == []
    assert await Peers().gather("/", lambda _: None) == 0


async def test_names_resolve_to_every_address_again_when_they_change() -> None:
    found, failed = await resolve(("localhost:8002", "127.0.0.1:9"))
    assert found is not None and "127.0.0.1:8002" in found and "127.0.0.1:9" in found
    assert not failed
    unknown = "no-such-router.invalid:8002"
    found, failed = await resolve((unknown,))
    assert found is None and unknown in failed[0]
    now = [0.0]
    group = Peers(("127.0.0.1:8002",), resolve_s=2.0, clock=lambda: now[0])
    assert await group.addresses() == {"127.0.0.1:8002"}
    group.entries = (unknown,)  # new entries resolve at once; none found: start empty
    assert await group.addresses() == set()
    group.entries = ("127.0.0.1:8002", "localhost:8003")
    assert await group.addresses() >= {"127.0.0.1:8002", "127.0.0.1:8003"}


async def test_get_json_refuses_an_answer_without_a_sane_length(peers: Any) -> None:
    _, at = await peers(lambda: b"HTTP/1.1 200 OK\r\n\r\n{}")
    with pytest.raises(Exception, match="Content-Length"):
        await get_json(at, "/")
    _, huge = await peers(lambda: b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n")
    with pytest.raises(Exception, match="Content-Length"):
        await get_json(huge, "/")


def test_peers_need_a_metrics_port_to_be_asked_on() -> None:
    settings = ServerSettings(insecure_workers=True, stats_peers=("10.0.0.2:8002",))
    with pytest.raises(AuthConfigError, match="metrics-port"):
        settings.check()
    replace(settings, metrics_port=8002).check()
