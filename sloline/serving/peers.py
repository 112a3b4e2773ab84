"""A router's peers: the pipeline's other routers, asked for what only the pipeline as a
whole can answer (Triton's statistics, summed over every router: `triton_stats`).

Peers are named by `host:port` entries of their metrics ports (`--peers`). A name is
resolved to every address it has (a Kubernetes headless Service names every router pod),
again at most every `resolve_s` when asked, keeping the addresses it had while it does
not resolve. The router's own address is skipped, so one router alone asks no one.

Each ask goes to every peer at once over plain HTTP (the metrics port has no TLS and no
token, like `/metrics`), and waits at most `timeout_s` for it: a peer that does not
answer in time, answers with anything but 200 and a JSON document, or sends a document
the caller refuses, is left out of that answer. It is logged when it starts failing and
when it answers again, never once per ask (anyone may ask as often as they like).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)

MAX_DOCUMENT_BYTES = 1 << 20  # a peer's answer beyond this is refused


def address(host: str, port: int | str) -> str:
    """`host:port`, an IPv6 address in brackets (as `resolve` writes them)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve(entries: tuple[str, ...]) -> tuple[set[str] | None, list[str]]:
    """Every address the `host:port` entries resolve to (all of them: a headless Service
    or a hosts entry with several records names several routers), as `host:port`, or
    None when none resolves now (the caller keeps the addresses it has and tries again);
    and why each entry that does not resolve does not."""
    loop = asyncio.get_running_loop()
    addresses: set[str] = set()
    failed = []
    for entry in entries:
        host, _, port = entry.rpartition(":")
        host = host.strip("[]")
        try:
            infos = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except (OSError, ValueError) as exc:
            failed.append(f"{entry} does not resolve ({exc})")
            continue
        for _, _, _, _, sockaddr in infos:
            addresses.add(address(str(sockaddr[0]), port))
    return (addresses if addresses or not failed else None), failed


class PeerError(Exception):
    """A peer's answer that cannot be used."""


async def get_json(peer: str, path: str) -> Any:
    """`GET path` from the router at `peer` (`host:port`, plain HTTP): its JSON document."""
    host, _, port = peer.rpartition(":")
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {peer}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode("latin-1"))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise PeerError("headers too long") from None
        status, *headers = head.decode("latin-1").split("\r\n")
        parts = status.split(" ", 2)
        if len(parts) < 2 or parts[1] != "200":
            raise PeerError(f"answered {status.strip()!r}")
        length = next(
            (
                value.strip()
                for name, _, value in (h.partition(":") for h in headers)
                if name.strip().lower() == "content-length"
            ),
            "",
        )
        if not length.isdigit() or int(length) > MAX_DOCUMENT_BYTES:
            raise PeerError(f"Content-Length {length!r}: not a count up to {MAX_DOCUMENT_BYTES}")
        body = await reader.readexactly(int(length))
    finally:
        writer.close()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PeerError(f"not JSON: {exc}") from None


class Peers:
    """The routers `entries` name, without this one (`own`: its own addresses)."""

    def __init__(
        self,
        entries: tuple[str, ...] = (),
        *,
        timeout_s: float = 1.0,
        resolve_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entries = entries
        self.own: set[str] = set()
        self.timeout_s = timeout_s
        self.resolve_s = resolve_s
        self._clock = clock
        self._resolved: tuple[tuple[str, ...], float] = ((), float("-inf"))  # (for, when)
        self._addresses: set[str] = set()
        self._resolving: asyncio.Future[None] | None = None
        self._unresolved: list[str] = []
        self._failing: dict[str, str] = {}  # address -> why, while it fails

    def set_own(self, host: str, port: int) -> None:
        """This router's metrics port on `host`: never asked (a name that is not an IP
        address is not compared; the caller still recognises its own answer)."""
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return
        self.own = {address(str(ip), port)}

    async def addresses(self) -> set[str]:
        """The peers' addresses now: resolved again when `resolve_s` old or the entries
        changed (every ask meanwhile waits for that one resolution); the last ones found
        while no entry resolves."""
        entries, at = self._resolved
        if self._resolving is None and (
            entries != self.entries or self._clock() - at >= self.resolve_s
        ):
            self._resolving = asyncio.ensure_future(self._resolve())
        if self._resolving is not None:
            await asyncio.shield(self._resolving)  # an ask given up on leaves it running
        return self._addresses - self.own

    async def _resolve(self) -> None:
        previous, _ = self._resolved
        entries = self.entries
        try:
            found, failed = await asyncio.wait_for(resolve(entries), self.timeout_s)
        except TimeoutError:
            found, failed = None, [f"{', '.join(entries)}: no answer in time"]
        finally:
            self._resolved = (entries, self._clock())
            self._resolving = None
        if failed != self._unresolved:  # said when it starts, changes or ends
            for why in failed:
                log.warning("statistics peers: %s; retrying every %.1fs", why, self.resolve_s)
            if self._unresolved and not failed:
                log.info("statistics peers resolve again")
            self._unresolved = failed
        if found is not None or entries != previous:
            self._addresses = found or set()

    async def gather(self, path: str, use: Callable[[Any], None]) -> int:
        """`GET path` from every peer at once, each within `timeout_s`, and hand each
        document to `use` (which raises ValueError, KeyError or TypeError to refuse it);
        how many were used. A peer left out does not fail the ask."""
        peers = sorted(await self.addresses())
        if not peers:
            return 0
        answers = await asyncio.gather(
            *(asyncio.wait_for(get_json(peer, path), self.timeout_s) for peer in peers),
            return_exceptions=True,
        )
        used = 0
        for peer, answer in zip(peers, answers, strict=True):
            if isinstance(answer, Exception):  # refused, reset, timed out, not a document
                self._failed(peer, f"{type(answer).__name__}: {answer}".rstrip(": "))
                continue
            if isinstance(answer, BaseException):
                raise answer
            try:
                use(answer)
            except (ValueError, KeyError, TypeError) as exc:
                self._failed(peer, f"unusable answer: {type(exc).__name__}: {exc}")
                continue
            used += 1
            if self._failing.pop(peer, None) is not None:
                log.info("statistics peer %s answers again", peer)
        for gone in set(self._failing) - set(peers):
            del self._failing[gone]
        return used

    def _failed(self, peer: str, why: str) -> None:
        if peer not in self._failing:
            log.warning(
                "statistics peer %s left out (%s): the pipeline's totals miss its counts "
                "until it answers",
                peer,
                why,
            )
        self._failing[peer] = why
