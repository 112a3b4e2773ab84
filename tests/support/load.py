"""Load generators for end-to-end tests.

`KeepAliveLoad`: REST clients on keep-alive connections that never retry (threads in the
test process), for tests where every request must succeed while servers come and go.

`OpenLoopLoad`: an open-loop load generator: Poisson arrivals at a rate the test
changes while it runs, sent with the real `tritonclient` gRPC (asyncio) client, each
request's latency recorded by send time.

Open loop: a request is sent when its arrival time comes, whether or not earlier ones
have been answered, so a slow server builds a queue (and a tail) as real traffic would.
The sender runs in its own process (`python -m tests.support.load`), so the test
process's threads (the API emulator, the kubelet) never delay it; it reads `rate <rps>`
and `stop` lines on stdin and writes one `<sent at> <latency> <retries>` or `<sent at>
error <message>` line per answer (times on the shared monotonic clock).

An answer of UNAVAILABLE (a router that stopped admitting: 503 + Retry-After, or that
closed its port) is retried, as a client behind a Service does, with a backoff from
50 ms doubling to 1 s, `max_retries` times at most; each request records its retries
and its latency from the first attempt, so a test can tell where they happened.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class Sent:
    """One request: when it was sent (monotonic s), its latency (None if it failed), how
    often it was retried after UNAVAILABLE."""

    at_s: float
    latency_s: float | None
    error: str = ""
    retries: int = 0


class KeepAliveLoad:
    """`with KeepAliveLoad(address, path, body, valid) as load: ...`: `connections` threads,
    each holding one keep-alive connection to `address` (reopened only when the server
    answered `Connection: close` or closed it), POST `body` to `path` every `period_s`.
    Nothing is retried: every answer but a 200 whose body passes `valid` is a failure
    (`load.failures`, with the reason); `load.closes` counts answers that said
    `Connection: close`."""

    def __init__(
        self,
        address: tuple[str, int],
        path: str,
        body: bytes,
        valid: Callable[[bytes], bool],
        *,
        connections: int = 6,
        period_s: float = 0.2,
    ) -> None:
        self.address, self.path, self.body, self.valid = address, path, body, valid
        self.period_s = period_s
        self.ok = 0
        self.closes = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, daemon=True) for _ in range(connections)
        ]

    def _one(self, connection: http.client.HTTPConnection) -> str | None:
        """One request; the failure, if any."""
        try:
            connection.request("POST", self.path, self.body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            return repr(exc)
        if (response.getheader("connection") or "").lower() == "close":
            with self._lock:
                self.closes += 1
        if response.status != 200:
            return f"{response.status} {body[:200]!r}"
        return None if self.valid(body) else f"invalid answer {body[:200]!r}"

    def _run(self) -> None:
        connection = http.client.HTTPConnection(*self.address, timeout=30)
        next_s = time.monotonic()
        while not self._stop.is_set():
            failure = self._one(connection)
            with self._lock:
                if failure is None:
                    self.ok += 1
                else:
                    self.failures.append(failure)
            next_s += self.period_s
            self._stop.wait(max(0.0, next_s - time.monotonic()))
        connection.close()

    def __enter__(self) -> KeepAliveLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


class OpenLoopLoad:
    """`with OpenLoopLoad(url, model, "pixels", rows) as load: load.rate_rps = 100 ...`;
    request i sends row `i % len(rows)` (with a batch dimension of 1) as the model's
    input `input_name`. The answers so far are `load.sent`."""

    def __init__(
        self,
        url: str,
        model: str,
        input_name: str,
        rows: np.ndarray,
        *,
        seed: int = 0,
        timeout_ms: int = 30_000,
        max_retries: int = 10,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="load-")
        rows_file = Path(self._dir.name) / "rows.npy"
        np.save(rows_file, rows)
        config = {"url": url, "model": model, "input": input_name, "rows": str(rows_file),
                  "seed": seed, "timeout_ms": timeout_ms, "max_retries": max_retries}  # fmt: skip
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.load", json.dumps(config)],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._sent: list[Sent] = []
        self._connected = threading.Event()
        self._reader = threading.Thread(target=self._read, name="load-results", daemon=True)
        self._reader.start()
        self._rate = 0.0
        # Started, imported and connected before the first request: no start-up bunching.
        if not self._connected.wait(60):
            self.stop()
            raise RuntimeError(f"the load generator did not connect to {url}")

    @property
    def rate_rps(self) -> float:
        return self._rate

    @rate_rps.setter
    def rate_rps(self, rate: float) -> None:
        self._command(f"rate {rate}")
        self._rate = rate

    def _command(self, line: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line == "connected\n":
                self._connected.set()
                continue
            at, _, rest = line.rstrip("\n").partition(" ")
            if rest.startswith("error "):
                self._sent.append(Sent(float(at), None, rest[6:]))
            else:
                latency, retries = rest.split()
                self._sent.append(Sent(float(at), float(latency), retries=int(retries)))

    def __enter__(self) -> OpenLoopLoad:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> list[Sent]:
        """Stop sending, wait for the answers in flight, return every request."""
        if self._process.poll() is None:
            self._command("stop")
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(10)
        assert self._process.stderr is not None
        errors = self._process.stderr.read()
        self._process.stderr.close()
        self._dir.cleanup()
        if self._process.returncode != 0:
            raise RuntimeError(f"the load generator failed:\n{errors}")
        return self.sent

    @property
    def sent(self) -> list[Sent]:
        return list(self._sent)


def windows(
    sent: Sequence[Sent], start_s: float, end_s: float, width_s: float = 1.0
) -> list[tuple[float, int, float]]:
    """(window start, requests, P99 latency in s) per `width_s` window of send time in
    [start_s, end_s); a failed request counts as infinitely slow."""
    out = []
    for left in np.arange(start_s, end_s - width_s / 2, width_s):
        latencies = [
            math.inf if s.latency_s is None else s.latency_s
            for s in sent
            if left <= s.at_s < left + width_s
        ]
        p99 = float(np.percentile(latencies, 99, method="higher")) if latencies else 0.0
        out.append((float(left), len(latencies), p99))
    return out


# -- the sender process ---------------------------------------------------------------------


async def _send(config: dict[str, object]) -> None:
    import tritonclient.grpc.aio as grpcaio
    from tritonclient.utils import InferenceServerException

    rows = np.load(str(config["rows"])).astype(np.float32)
    rng = np.random.default_rng(int(str(config["seed"])))
    max_retries = int(str(config["max_retries"]))
    state = {"rate": 0.0, "stop": False}
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)

    async def read_commands() -> None:
        while line := (await commands.readline()).decode().split():
            if line[0] == "rate":
                state["rate"] = float(line[1])
            elif line[0] == "stop":
                break
        state["stop"] = True

    async def one(client: grpcaio.InferenceServerClient, index: int) -> None:
        pixels = grpcaio.InferInput(str(config["input"]), [1, *rows.shape[1:]], "FP32")
        pixels.set_data_from_numpy(rows[index % len(rows)][None])
        parameters = {"timeout_ms": int(str(config["timeout_ms"]))}
        sent, retries, backoff_s = time.monotonic(), 0, 0.05
        while True:
            try:
                await client.infer(str(config["model"]), [pixels], parameters=parameters)
                print(f"{sent:.6f} {time.monotonic() - sent:.6f} {retries}", flush=False)
                return
            except InferenceServerException as exc:
                if exc.status() != "StatusCode.UNAVAILABLE" or retries >= max_retries:
                    print(f"{sent:.6f} error {' '.join(str(exc).split())}", flush=False)
                    return
            retries += 1
            await asyncio.sleep(backoff_s)
            backoff_s = min(1.0, backoff_s * 2)

    async def flush() -> None:  # answers reach the test within 0.2 s
        while True:
            await asyncio.sleep(0.2)
            sys.stdout.flush()

    reader, flusher = asyncio.create_task(read_commands()), asyncio.create_task(flush())
    tasks: set[asyncio.Task[None]] = set()
    async with grpcaio.InferenceServerClient(str(config["url"])) as client:
        await client.is_server_live()
        print("connected", flush=True)
        index, next_s = 0, time.monotonic()
        while not state["stop"]:
            rate = float(state["rate"])
            if rate <= 0:
                await asyncio.sleep(0.02)
                next_s = time.monotonic()
                continue
            next_s += float(rng.exponential(1.0 / rate))
            await asyncio.sleep(max(0.0, next_s - time.monotonic()))
            task = asyncio.create_task(one(client, index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
        await asyncio.gather(*tasks)
    sys.stdout.flush()
    reader.cancel()
    flusher.cancel()


if __name__ == "__main__":
    asyncio.run(_send(json.loads(sys.argv[1])))
