"""The worker process: one stage's model, pulling batches from the pipeline's routers.

Start-up: load the pipeline file, load the stage's model with the replica's thread budget,
warm it up, then dial every router's worker port with the pipeline's worker token
(`serving/auth.py`) and say Hello (so a replica counts as ready only once it can serve).
Then: receive a batch, run it, return per-item results, repeat. One batch is in flight at
a time: the worker's one credit, which moves between its routers (`credit.py`). A router
that refuses the token (UNAUTHENTICATED) ends the worker with that reason: retrying
cannot fix it.

Routers: `--router` names host:port entries; each host is resolved (getaddrinfo, every
address it returns) every `resolve_s`, and the worker keeps one stream per address:
it connects to new ones and drops those gone from the answer.

SIGTERM/SIGINT: finish the batch in hand, tell the router it is leaving, exit 0 (within
`stop_timeout_s`, under Kubernetes' grace period, even if the router never answers). If
the router is unreachable, does not resolve yet or restarts, reconnect with capped,
jittered exponential backoff until stopped: on Kubernetes pods start in any order.

Optional health endpoint (`--health-port`, see `health.py`): `/live` from the start,
`/ready` once the model is loaded and the stream to the router is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import random
import signal
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import grpc

from sloline.model_server.credit import CreditLedger
from sloline.model_server.health import HealthServer, HealthState
from sloline.runtimes import StageRunner, load_pipeline_stage
from sloline.serving import auth, process, tracing, wire
from sloline.serving.peers import resolve
from sloline.serving.proto import worker_pb2 as pb
from sloline.spec import load_pipeline

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    pipeline_file: Path
    stage: str
    # host:port of the routers' worker ports; each host may resolve to several routers
    routers: tuple[str, ...]
    token: str | None = None  # the pipeline's worker token (sent as a bearer token)
    threads: int = 1
    cuda_device: int | None = None
    hardware: str = ""
    worker_id: str = ""
    reconnect_max_s: float = 5.0
    parent_pid: int | None = None  # exit with this process (set by the local backend)
    cpus: tuple[int, ...] = ()  # CPU affinity of the hardware class, if any
    nice: int = 0  # run this much below the priority it was started with
    health_host: str = "127.0.0.1"
    health_port: int | None = None  # serve /live and /ready here (Kubernetes probes)
    stop_timeout_s: float = 25.0  # after SIGTERM, give up on a silent router (grace 30 s)
    resolve_s: float = 2.0  # how often the router names are resolved again
    # On a CUDA device, one batch of every size up to this before serving (`warm_up`)
    warmup_max_batch: int = 32


def run_batch(
    runner: StageRunner,
    batch: pb.Batch,
    payload: memoryview,
    stage: str = "",
    worker: str = "",
    elsewhere_age: Callable[[], float | None] = lambda: None,
    idle_s: float | None = None,
) -> bytes:
    """Run one batch through the model and encode the reply; model errors become the
    batch's error text. Inputs are views of the received message, outputs are copied
    once, into the reply (`wire`). A batch that carries its requests' trace contexts is
    recorded as a span while this worker traces (`tracing.batch_span`). `elsewhere_age`
    is asked once the batch is done: the head age of older work at another router, if
    any (`credit.py`). `idle_s`, how long this worker sat idle before the batch (None on
    its first), goes back with the result."""
    items = wire.batch_arrays(batch, payload)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        outputs = runner.run(items)
    except Exception as exc:  # the model's failure is reported, never kills the worker
        log.exception("batch %d failed", batch.batch_id)
        outputs, error = [], f"{type(exc).__name__}: {exc}"
    else:
        error = ""
    service_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    if batch.traceparent and tracing.tracer is not None:
        tracing.batch_span(batch.traceparent, stage, worker, service_s, error)
    return wire.result_message(
        batch.batch_id,
        outputs,
        service_s,
        error,
        cpu_s=cpu_s,
        elsewhere_age_s=elsewhere_age(),
        idle_s=idle_s,
    )


class RouterSession:
    """The stream to one router address: its call and the lock its writes take turns on."""

    __slots__ = ("address", "call", "lock")

    def __init__(self, address: str, call: grpc.aio.StreamStreamCall[bytes, wire.Received]):
        self.address = address
        self.call = call
        self.lock = asyncio.Lock()

    async def write(self, message: bytes) -> None:
        async with self.lock:
            await self.call.write(message)


class Worker:
    """Serves one stage to every router its `--router` names resolve to, with one
    credit across them all (`credit.py`)."""

    def __init__(
        self,
        settings: WorkerSettings,
        runner: StageRunner,
        pipeline: str,
        health: HealthState | None = None,
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.pipeline = pipeline
        self.health = health or HealthState()
        self.stopping = asyncio.Event()
        self.worker_id = settings.worker_id or f"pid-{os.getpid()}"
        self.credit = CreditLedger()
        self.sessions: dict[str, RouterSession] = {}  # connected router addresses
        self._followers: dict[str, asyncio.Task[None]] = {}  # a task per router address
        self._wanted: set[str] = set()  # the addresses the names resolve to now
        self._fatal: str | None = None
        self._idle_since: float | None = None  # when the last batch, from any router, ended

    def stop(self) -> None:
        """Begin a graceful stop (the SIGTERM handler)."""
        self.health.stopping = True
        self.credit.stopping = True
        self.stopping.set()

    def hello(self, *, standby: bool = False) -> bytes:
        s = self.settings
        message = pb.WorkerMessage(
            hello=pb.Hello(
                pipeline=self.pipeline,
                stage=s.stage,
                worker_id=self.worker_id,
                pid=os.getpid(),
                hardware=s.hardware,
                standby=standby,
            )
        )
        return wire.encode(message, ())

    async def serve(self) -> None:
        """Follow every router the names resolve to, re-resolving every `resolve_s`,
        until stopped and every stream has said goodbye."""
        loop = asyncio.get_running_loop()
        unresolved: list[str] = []
        while not self.stopping.is_set():
            addresses, failed = await resolve(self.settings.routers)
            if failed != unresolved:  # say so when it starts, changes or ends
                for entry in failed:
                    log.warning("router %s; retrying every %.1fs", entry, self.settings.resolve_s)
                if unresolved and not failed:
                    log.info("router names resolve again: %s", ", ".join(sorted(addresses or ())))
                unresolved = failed
            for address in [a for a, task in self._followers.items() if task.done()]:
                del self._followers[address]
            if addresses is not None:
                self._wanted = addresses
                for address in addresses - self._followers.keys():
                    self._followers[address] = loop.create_task(self._follow(address))
                for address in self._followers.keys() - addresses:
                    # A router leaving the answer (scaled down, or terminating and so no
                    # longer ready) may still hold requests: serve it until it closes the
                    # stream, only do not dial it again.
                    if address not in self.sessions:
                        self._followers.pop(address).cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.resolve_s)
        if self._followers:
            await asyncio.wait(self._followers.values())
        if self._fatal is not None:
            raise SystemExit(self._fatal)

    async def _follow(self, address: str) -> None:
        """Connect to one router, serve, reconnect after failures with jittered backoff,
        as long as the names resolve to it."""
        backoff = 0.05
        while not self.stopping.is_set():
            if address not in self._wanted:
                log.info("router %s is gone from %s", address, ",".join(self.settings.routers))
                return
            try:
                await self._session(address)
                backoff = 0.05
            except (grpc.aio.AioRpcError, ConnectionError) as exc:
                if self.stopping.is_set():
                    break
                if (
                    isinstance(exc, grpc.aio.AioRpcError)
                    and exc.code() == grpc.StatusCode.UNAUTHENTICATED
                ):
                    self._fail(
                        f"router {address} refused this worker's token "
                        f"(UNAUTHENTICATED): give the pipeline's worker token in "
                        f"${auth.WORKER_TOKEN_ENV} or --token-file"
                    )
                    return
                reason = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                log.warning("router %s: %s; retrying within %.2fs", address, reason, backoff)
            except _Refused as exc:
                self._fail(str(exc))
                return
            if self.stopping.is_set():
                break
            # Jitter spreads the reconnects of many workers after a router restart.
            delay_s = backoff * random.uniform(0.5, 1.0)
            try:
                await asyncio.wait_for(self.stopping.wait(), delay_s)
            except TimeoutError:
                backoff = min(backoff * 2, self.settings.reconnect_max_s)

    def _fail(self, reason: str) -> None:
        """A router refused this worker: retrying cannot fix it, so stop."""
        if self._fatal is None:
            self._fatal = reason
        self.stop()

    async def _session(self, address: str) -> None:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            connect = channel.stream_stream(
                wire.CONNECT,
                request_serializer=wire.identity,
                response_deserializer=wire.decode_router_message,
            )
            call = connect(metadata=auth.bearer_metadata(self.settings.token))
            session = RouterSession(address, call)
            standby = self.credit.join(address)
            try:
                await call.write(self.hello(standby=standby))
                first = await call.read()
                if first is grpc.aio.EOF or not first[0].HasField("welcome"):
                    raise ConnectionError("router closed the stream before welcoming this worker")
                if first[0].welcome.error:
                    raise _Refused(f"router refused this worker: {first[0].welcome.error}")
                # The local backend reads this line to tell a crash after start-up from a
                # start-up crash loop (backends/local.py, `_connected`): keep its wording.
                log.info("stage %s connected to %s", self.settings.stage, address)
                self.sessions[address] = session
                self.health.connected = True
                await self._perform(self.credit.welcomed(address))
                await self._loop(session)
            finally:
                self.sessions.pop(address, None)
                self.health.connected = bool(self.sessions)
                await self._perform(self.credit.leave(address))

    async def _perform(self, actions: list[tuple[Hashable, bool]]) -> None:
        """Send the credit moves the ledger asked for, in order."""
        for router, grant in actions:
            session = self.sessions.get(str(router))
            if session is None:  # it went away meanwhile: its `leave` places the credit
                continue
            with contextlib.suppress(*_WRITE_FAILED):
                await session.write(wire.credit_message(grant=grant))

    async def _loop(self, session: RouterSession) -> None:
        """Serve batches until the router closes the stream. Stopping writes Leaving
        (under the write lock, never inside a result write) and keeps serving whatever the
        router already sent, so no batch is stranded on the wire."""
        call, address, credit = session.call, session.address, self.credit

        async def announce_leaving() -> None:
            await self.stopping.wait()
            await session.write(wire.encode(pb.WorkerMessage(leaving=pb.Leaving()), ()))

        leaving = asyncio.create_task(announce_leaving())
        try:
            while (received := await call.read()) is not grpc.aio.EOF:
                message, payload = received
                if message.HasField("batch"):
                    credit.batch(address)
                    since = self._idle_since
                    result = run_batch(
                        self.runner,
                        message.batch,
                        payload,
                        self.settings.stage,
                        self.worker_id,
                        lambda: credit.elsewhere_age(address, time.monotonic()),
                        None if since is None else time.perf_counter() - since,
                    )
                    self._idle_since = time.perf_counter()
                    await session.write(result)
                elif message.HasField("backlog"):
                    backlog = message.backlog
                    await self._perform(
                        credit.backlog(
                            address,
                            backlog.head_age_s if backlog.queued else None,
                            backlog.released,
                            time.monotonic(),
                        )
                    )
        finally:
            leaving.cancel()
        if not self.stopping.is_set():
            raise ConnectionError("router closed the stream")
        await call.done_writing()


# A write to a stream that broke: its session's end places the credit again.
_WRITE_FAILED = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


class _Refused(Exception):
    """The router refused this worker (its Welcome carried an error)."""


def die_with_parent(parent_pid: int | None) -> None:
    """Get SIGTERM when the supervising process dies (Linux), so no worker is orphaned."""
    if parent_pid is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        raise SystemExit(f"supervisor pid {parent_pid} is gone")


def _exit_now(_signum: int, _frame: object) -> None:
    """SIGTERM before serving (while loading): nothing to finish, so exit 0 at once."""
    raise SystemExit(0)


def warm_up(runner: StageRunner, settings: WorkerSettings) -> None:
    """Run a batch of one before serving, so lazy initialisation happens now. On a CUDA
    device, a batch of every size up to ``warmup_max_batch`` too: the GPU libraries
    choose their kernels per input shape on first use (cuDNN's convolutions: 12-60 ms a
    size for image-ensemble's `large` on an H100, about 0.8 s over sizes 1-32, against
    1 ms a batch once warm), which in service would stall the first batch of every new
    size while requests queue behind it."""
    runner.warmup()
    if settings.cuda_device is None:
        return
    started = time.perf_counter()
    for size in range(2, settings.warmup_max_batch + 1):
        runner.warmup(batch_size=size)
    log.info(
        "warmed up batch sizes 1-%d on CUDA device %d in %.2f s",
        settings.warmup_max_batch,
        settings.cuda_device,
        time.perf_counter() - started,
    )


def main(settings: WorkerSettings) -> int:
    """Entry point of `sloline worker`: load, warm up, serve; return the exit code."""
    die_with_parent(settings.parent_pid)
    process.lower_priority(settings.nice)
    signal.signal(signal.SIGTERM, _exit_now)
    if settings.cpus:
        os.sched_setaffinity(0, settings.cpus)
    health = HealthState()
    server = None
    if settings.health_port is not None:
        server = HealthServer(health, settings.health_host, settings.health_port)
        server.start()
        log.info("health probes on %s:%d (/live, /ready)", settings.health_host, server.port)
    try:
        loaded = load_pipeline(settings.pipeline_file)
        runner = load_pipeline_stage(
            loaded, settings.stage, threads=settings.threads, cuda_device=settings.cuda_device
        )
        warm_up(runner, settings)
        health.loaded = True
        worker = Worker(settings, runner, loaded.name, health)
        process.freeze_startup_heap()
        process.run(_serve(worker))
    finally:
        if server is not None:
            server.stop()
    return 0


async def _serve(worker: Worker) -> None:
    """Serve until stopped; after a stop, wait at most `stop_timeout_s` for the goodbye."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    serving = asyncio.create_task(worker.serve())
    stopped = asyncio.create_task(worker.stopping.wait())
    await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    done, _ = await asyncio.wait({serving}, timeout=worker.settings.stop_timeout_s)
    if not done:
        log.warning(
            "the router did not close the stream within %.0fs of the stop; exiting",
            worker.settings.stop_timeout_s,
        )
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return
    await serving  # re-raises what ended it, e.g. the router refusing this worker
