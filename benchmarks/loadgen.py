"""The load generator of the serving benchmark: one client for every system.

It runs in its own process (so the server never shares an interpreter or a GIL with
it) and speaks JSON lines: the orchestrator (`serving.py`) writes one command per line
on stdin, the generator answers one result per line on stdout. Every command carries the
target (URL, headers, body bytes in a file), so the same code drives sloline (an OIP v2
binary-extension body), Ray Serve (raw bytes) and the HTTP echo floor.

Three load shapes, all bounded in count and time:

- ``sequential``: one request at a time (low-load latency).
- ``closed``: ``concurrency`` clients, each sending its next request when the previous
  one is answered, for ``duration_s`` after ``warmup_s`` (maximum throughput).
- ``open``: Poisson arrivals at ``rate_rps``, ``count`` requests, latency measured from
  each request's *scheduled* send time so a stalled server cannot hide its queueing
  (no coordinated omission).

Each result includes the generator's own CPU seconds over the measured window, so the
orchestrator can tell a saturated server from a saturated client.

Several generator processes can share one command (`serving.py --client-procs N`), so
that one client process, one event loop on one core, is not the ceiling of a server
with many routers: `split_command` gives each process its share (closed loop: the
concurrency; open loop: the count, at a proportional rate, each with its own seed, so the
sum of the Poisson streams is the Poisson stream of the whole rate) and
`merge_results` merges their answers (percentiles from every process's latencies).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

REQUEST_TIMEOUT_S = 30.0
MAX_OPEN_INFLIGHT = 4096  # open loop: beyond this many outstanding requests, stop sending


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    body: bytes
    headers: dict[str, str]
    expect_bytes: int | None = None  # response body size, when known, to catch wrong answers


def summarize(latencies_s: list[float]) -> dict[str, float]:
    if not latencies_s:
        return {"n": 0}
    ms = np.asarray(latencies_s) * 1e3
    return {
        "n": len(latencies_s),
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


class Client:
    def __init__(self, session: aiohttp.ClientSession, target: Target) -> None:
        self.session = session
        self.target = target
        self.errors: dict[str, int] = {}
        self.ok = 0  # every request answered correctly, warm-up included (for CPU/request)
        self.sizes: dict[int, int] = {}  # response body sizes seen: one size = one answer

    async def one(self) -> bool:
        """Send one request; True when it was answered 200 with the expected size."""
        t = self.target
        try:
            async with self.session.post(t.url, data=t.body, headers=t.headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    key = f"HTTP {resp.status}: {body[:120]!r}"
                elif t.expect_bytes is not None and len(body) != t.expect_bytes:
                    key = f"body of {len(body)} bytes, expected {t.expect_bytes}"
                else:
                    self.ok += 1
                    self.sizes[len(body)] = self.sizes.get(len(body), 0) + 1
                    return True
        except (aiohttp.ClientError, TimeoutError) as exc:
            key = f"{type(exc).__name__}: {exc}"[:160]
        self.errors[key] = self.errors.get(key, 0) + 1
        return False


async def sequential(client: Client, count: int, warmup: int, max_s: float) -> dict[str, Any]:
    for _ in range(warmup):
        await client.one()
    latencies: list[float] = []
    cpu0, start = time.process_time(), time.perf_counter()
    deadline = start + max_s
    for _ in range(count):
        t0 = time.perf_counter()
        if await client.one():
            latencies.append(time.perf_counter() - t0)
        if t0 > deadline:
            break
    wall = time.perf_counter() - start
    return {**summarize(latencies), "wall_s": wall, "client_cpu_s": time.process_time() - cpu0}


async def closed(
    client: Client, concurrency: int, duration_s: float, warmup_s: float, keep: bool = False
) -> dict[str, Any]:
    """`concurrency` loops for warmup + duration; only requests that *finish* inside the
    measured window count, so throughput is completions per second of the window."""
    start = time.perf_counter()
    t_begin, t_end = start + warmup_s, start + warmup_s + duration_s
    latencies: list[float] = []
    marks: dict[str, float] = {}

    async def loop() -> None:
        while (t0 := time.perf_counter()) < t_end:
            ok = await client.one()
            t1 = time.perf_counter()
            if ok and t_begin <= t1 < t_end:
                latencies.append(t1 - t0)

    async def mark() -> None:
        await asyncio.sleep(max(0.0, t_begin - time.perf_counter()))
        marks["cpu0"] = time.process_time()
        await asyncio.sleep(max(0.0, t_end - time.perf_counter()))
        marks["cpu1"] = time.process_time()

    await asyncio.wait_for(
        asyncio.gather(mark(), *(loop() for _ in range(concurrency))),
        warmup_s + duration_s + REQUEST_TIMEOUT_S + 5,
    )
    return {
        **summarize(latencies),
        "concurrency": concurrency,
        "window_s": duration_s,
        "rps": len(latencies) / duration_s,
        "client_cpu_s": marks["cpu1"] - marks["cpu0"],
        **({"latencies_s": latencies} if keep else {}),
    }


async def open_loop(client: Client, rate_rps: float, count: int, seed: int | list[int],
                    keep: bool = False) -> dict[str, Any]:  # fmt: skip
    """Poisson arrivals; latency = completion - scheduled arrival."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_rps, count)
    schedule = np.cumsum(gaps)
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    dropped = 0

    async def fire(at: float) -> None:
        if await client.one():
            latencies.append(time.perf_counter() - at)

    cpu0, start = time.process_time(), time.perf_counter()
    for offset in schedule:
        at = start + float(offset)
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= MAX_OPEN_INFLIGHT:
            dropped += 1
            continue
        task = asyncio.create_task(fire(at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    sent_s = time.perf_counter() - start
    if tasks:
        await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 5)
    wall = time.perf_counter() - start
    return {
        **summarize(latencies),
        "rate_rps": rate_rps,
        "offered_rps": count / sent_s if sent_s > 0 else 0.0,
        "achieved_rps": len(latencies) / wall if wall > 0 else 0.0,
        "dropped": dropped,
        "wall_s": wall,
        "client_cpu_s": time.process_time() - cpu0,
        **({"latencies_s": latencies} if keep else {}),
    }


def split_command(command: dict[str, Any], procs: int) -> list[dict[str, Any]]:
    """Each of `procs` generator processes' share of `command` (fewer shares when there
    is less to share than processes). A sequential command is not shared."""
    kind = command["kind"]
    if procs <= 1 or kind == "sequential":
        return [command]
    if kind == "closed":
        n = command["concurrency"]
        shares = [n // procs + (i < n % procs) for i in range(procs)]
        return [{**command, "concurrency": k, "keep_latencies": True} for k in shares if k]
    if kind == "open":
        count, rate = command["count"], command["rate_rps"]
        counts = [count // procs + (i < count % procs) for i in range(procs)]
        return [{**command, "count": c, "rate_rps": rate * c / count,
                 "seed": [command.get("seed", 0), i], "keep_latencies": True}
                for i, c in enumerate(counts) if c]  # fmt: skip
    raise ValueError(f"unknown command kind {kind!r}")


SUMMED = ("rps", "concurrency", "rate_rps", "offered_rps", "achieved_rps", "dropped",
          "client_cpu_s", "ok_total")  # fmt: skip


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer from the answers of the processes that shared a command: counts, rates
    and CPU summed, percentiles over every process's latencies, errors counted together."""
    failed = [r["failed"] for r in results if "failed" in r]
    if failed:
        return {"failed": "; ".join(failed)}
    if len(results) == 1:
        return {k: v for k, v in results[0].items() if k != "latencies_s"}
    latencies = [x for r in results for x in r.get("latencies_s", [])]
    merged: dict[str, Any] = {k: v for k, v in results[0].items() if k != "latencies_s"}
    merged.update(summarize(latencies))
    for key in SUMMED:
        if key in merged:
            merged[key] = sum(r[key] for r in results)
    for key in ("wall_s", "window_s"):
        if key in merged:
            merged[key] = max(r[key] for r in results)
    for key in ("errors", "response_sizes"):
        total: dict[str, int] = {}
        for r in results:
            for k, v in r.get(key, {}).items():
                total[k] = total.get(k, 0) + v
        merged[key] = total
    merged["client_procs"] = len(results)
    return merged


async def handle(command: dict[str, Any]) -> dict[str, Any]:
    """Run one command on fresh connections (a server may have been restarted since)."""
    target = Target(
        command["url"],
        Path(command["body_file"]).read_bytes(),
        command.get("headers", {}),
        command.get("expect_bytes"),
    )
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        client = Client(session, target)
        result = await _run(client, command)
    result["errors"] = client.errors
    result["ok_total"] = client.ok
    result["response_sizes"] = client.sizes
    return result


async def _run(client: Client, command: dict[str, Any]) -> dict[str, Any]:
    kind = command["kind"]
    keep = bool(command.get("keep_latencies"))  # for `merge_results` (several processes)
    if kind == "sequential":
        result = await sequential(client, command["count"], command.get("warmup", 20),
                                  command.get("max_s", 60.0))  # fmt: skip
    elif kind == "closed":
        result = await closed(client, command["concurrency"], command["duration_s"],
                              command.get("warmup_s", 0.5), keep)  # fmt: skip
    elif kind == "open":
        result = await open_loop(client, command["rate_rps"], command["count"],
                                 command.get("seed", 0), keep)  # fmt: skip
    else:
        raise ValueError(f"unknown command kind {kind!r}")
    return result


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        try:
            result = await handle(json.loads(line))
        except Exception as exc:  # report, keep serving the orchestrator
            result = {"failed": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
