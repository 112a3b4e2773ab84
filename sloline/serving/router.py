"""The pipeline router: the data plane behind the REST and gRPC front doors.

One router serves one pipeline. For each request it validates the inputs against the
spec, walks the DAG (`DagRun`), and puts each ready stage's work into that stage's
centralized batched queue (`StageQueue`). Workers dial in over `WorkerService.Connect`
and pull batches with one credit each; results flow back, downstream stages become
ready, and the output stage's values are the response.

Failure rules (docs/architecture.md): a request past its deadline is failed with 504
and its queued work is dropped rather than occupying a worker; a worker that dies
mid-batch has that batch re-queued once at the head; if workers die holding it again it
is split until the request that kills them is alone, and only that one fails; a full
stage queue or too many requests in flight answer 503 with a retry hint; every request
is answered exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry

from sloline.common.tensors import (
    DeadlineExceeded,
    InferenceError,
    InferRequest,
    InferResponse,
    InvalidInput,
    ModelMetadata,
    ModelNotFound,
    Overloaded,
    StageFailed,
    Tensor,
    TensorMetadata,
)
from sloline.serving import wire
from sloline.serving.admission import Admission
from sloline.serving.dag import DagRun, DagShape, ReadyStage
from sloline.serving.metrics import RouterMetrics, StateCollector
from sloline.serving.proto import worker_pb2 as pb
from sloline.serving.queue import QueueFull, StageQueue, Step, WorkItem
from sloline.serving.stats import RouterStats
from sloline.spec import PipelineGraph

log = logging.getLogger(__name__)

_FLOATS = frozenset(("FP16", "FP32", "FP64"))


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """Router behaviour; the CLI parses these once from flags."""

    queue_capacity: int = 1024  # items per stage queue before shedding (503)
    max_inflight: int = 4096  # requests in the router at once before shedding (503)
    deadline_factor: float = 2.0  # default deadline = factor x SLO latency
    max_attempts: int = 2  # worker deaths per item before its batch is split (queue.py)
    retry_after_s: float = 0.1  # hint sent with 503s
    expiry_interval_s: float = 0.01  # how often queued work is checked for deadlines
    # timeout_ms may be at most the larger of factor x SLO latency and max_timeout_s
    max_timeout_factor: float = 60.0
    max_timeout_s: float = 600.0
    # Deadline-aware admission (`admission.py`): refuse at once (503) a request whose
    # estimated finish is past its budget: its timeout_ms when given, else
    # admission_factor x SLO (not the default deadline: admitting work that can only
    # finish late keeps the queue at the deadline, and every answer late, under overload).
    admission: bool = True
    admission_factor: float = 1.0
    # Readiness turns false when requests are in flight and nothing has moved for this
    # long (no request left the router, answered or failed, and no batch came back),
    # liveness after `unlive_after_s`; None = the larger of 30 s and 10 x SLO, and 3 x that.
    unready_after_s: float | None = None
    unlive_after_s: float | None = None


@dataclass(slots=True, eq=False)
class _Request:
    run: DagRun
    future: asyncio.Future[dict[str, Tensor]]
    arrival: float
    deadline: float
    estimate: float = math.nan  # admission's estimate of its latency (NaN: none)
    items: list[WorkItem] = field(default_factory=list)

    def fail(self, error: InferenceError) -> None:
        if not self.future.done():
            self.future.set_exception(error)
        self.abandon()

    def abandon(self) -> None:
        """Nobody waits for the answer any more: drop the work still queued."""
        self.future.cancel()
        for item in self.items:
            item.cancelled = True


class WorkerConn:
    """One connected worker process and its stream.

    The router sends a batch by handing its encoded message to `send`; the stream's
    handler (`WorkerService.Connect`) writes it in `write_until_closed`. That is one
    future and one task step per batch, and gRPC gets one write at a time.
    """

    __slots__ = ("_closing", "_pending", "_wake", "dispatched_at", "hardware", "id", "pid", "stage")

    def __init__(self, id: str, stage: str, pid: int, hardware: str) -> None:
        self.id = id
        self.stage = stage
        self.pid = pid
        self.hardware = hardware
        self.dispatched_at = 0.0  # when its batch in flight (one at most) was dispatched
        self._pending: deque[bytes] = deque()
        self._closing = False
        self._wake: asyncio.Future[None] | None = None

    def send(self, message: bytes) -> None:
        self._pending.append(message)
        self._notify()

    def close(self, *, flush: bool = True) -> None:
        """End the stream once everything sent so far is written (`flush`), or at once:
        a detached worker's batch is back in the queue and must not reach it too."""
        if not flush:
            self._pending.clear()
        self._closing = True
        self._notify()

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def write_until_closed(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        pending = self._pending
        loop = asyncio.get_running_loop()
        while True:
            while pending:
                await context.write(pending.popleft())
            if self._closing:
                return
            self._wake = loop.create_future()
            await self._wake


class Router:
    """Implements `DataPlane` for one pipeline and `WorkerService` for its workers."""

    def __init__(
        self,
        graph: PipelineGraph,
        *,
        max_batch: Mapping[str, int] | None = None,
        settings: RouterSettings | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        desired_replicas: Callable[[], Mapping[str, int]] | None = None,
        cost_per_hour: Callable[[], Mapping[str, float]] | None = None,
        on_arrival: Callable[[float], None] | None = None,
        envelope: Callable[[], Mapping[float, float]] | None = None,
    ) -> None:
        self.graph = graph
        self._dag = DagShape.of(graph)
        self.name = graph.name
        self.settings = settings or RouterSettings()
        self.clock = clock
        spec = graph.pipeline.spec
        self.slo_s = spec.slo.latency_ms / 1000.0
        batches = dict(max_batch or {})
        self.queues = {
            name: StageQueue(
                name,
                max_batch=batches.get(name, node.spec.max_batch or 1),
                capacity=self.settings.queue_capacity,
                max_attempts=self.settings.max_attempts,
            )
            for name, node in graph.stages.items()
        }
        self.workers: dict[str, WorkerConn] = {}
        self._inflight = 0
        self._worker_ids = count(1)
        self._on_arrival = on_arrival
        self._desired: Callable[[], Mapping[str, int]] = desired_replicas or (lambda: {})
        self.metrics = RouterMetrics(
            self.name, graph.stages, registry or CollectorRegistry(), slo_s=self.slo_s
        )
        self.stats = RouterStats(list(graph.stages))
        self.draining = False
        # Told the pid of each worker that connects (embedded: the local backend's restart
        # policy restarts a worker that had connected at once).
        self.on_attach: Callable[[int], None] | None = None
        if registry is not None:
            registry.register(
                StateCollector(
                    self.name,
                    lambda: {n: len(q) for n, q in self.queues.items()},
                    self.ready_replicas,
                    self._desired,
                    cost_per_hour or (lambda: {}),
                    envelope or (lambda: {}),
                )
            )
        self._inputs = {t.name: t for t in spec.inputs}
        self._outputs = frozenset(t.name for t in graph.output.spec.outputs)
        self._expiry_task: asyncio.Task[None] | None = None
        s = self.settings
        self._default_timeout_s = s.deadline_factor * self.slo_s
        self._default_budget_s = min(self._default_timeout_s, s.admission_factor * self.slo_s)
        self._max_timeout_ms = max(s.max_timeout_factor * self.slo_s, s.max_timeout_s) * 1000.0
        stall_s = max(30.0, 10.0 * self.slo_s)
        self.unready_after_s = stall_s if s.unready_after_s is None else s.unready_after_s
        self.unlive_after_s = (
            3.0 * self.unready_after_s if s.unlive_after_s is None else s.unlive_after_s
        )
        self._progress_at = clock()  # when a request last left or a batch came back
        self._admission = Admission(graph, self.queues) if s.admission else None

    # ----------------------------------------------------------------- DataPlane
    def live(self) -> bool:
        """False once the router looks wedged for long (see `ready`): a restart is due."""
        return self.stalled_s() <= self.unlive_after_s

    def ready(self) -> bool:
        """Every stage has a connected worker, the router is not shutting down, and it is
        not wedged: requests in flight and nothing moving (no request leaving, no batch
        coming back) for `unready_after_s` (a lost timer, a leaked in-flight slot, every
        worker on the path stuck)."""
        return (
            not self.draining
            and all(q.workers > 0 for q in self.queues.values())
            and self.stalled_s() <= self.unready_after_s
        )

    def model_ready(self, name: str) -> bool:
        self._check_name(name)
        return self.ready()

    def model_metadata(self, name: str) -> ModelMetadata:
        self._check_name(name)
        out = self.graph.output.spec.outputs
        return ModelMetadata(
            name=self.name,
            platform="sloline_pipeline",
            versions=("1",),
            inputs=tuple(
                TensorMetadata(t.name, t.datatype, (-1, *t.shape)) for t in self.graph.inputs
            ),
            outputs=tuple(TensorMetadata(t.name, t.datatype, (-1, *t.shape)) for t in out),
        )

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, admit, run the DAG, answer.

        Everything a request carries is validated before it counts as an arrival (the
        envelope the tuner reads, the re-planner's arrivals): invalid traffic is not
        demand, while requests shed for overload are. The in-flight count goes up only
        inside the ``try`` whose ``finally`` takes it down again, so no failure at any
        step can leak a slot; an `InferenceError` reaches the front door as its status,
        anything else propagates (the front door logs it and answers 500), and either
        way the request's queued work is dropped.
        """
        self._check_name(request.model_name)
        inputs, batched = self._validate(request.inputs)
        timeout_s = self._timeout(request.parameters)
        _check_priority(request.parameters)
        if request.outputs is not None:
            self._check_outputs(request.outputs)
        now = self.clock()
        if (arrivals := self.stats.arrivals) is not None:
            arrivals.add(now, now)
        if self._on_arrival is not None:
            self._on_arrival(now)
        self._admit(timeout_s, request.parameters)
        state: _Request | None = None
        timer: asyncio.TimerHandle | None = None
        if self._inflight == 0:
            self._progress_at = now  # the stall clock starts with the first request
        self._inflight += 1
        try:
            loop = asyncio.get_running_loop()
            state = _Request(DagRun(self._dag, inputs), loop.create_future(), now, now + timeout_s)
            if self._admission is not None:
                state.estimate = self._admission.last_s
            timer = loop.call_later(timeout_s, self._expire_request, state)
            self._submit(state, state.run.start())
            outputs = await state.future
        except BaseException as exc:
            if state is not None:
                state.abandon()
            if isinstance(exc, InferenceError):
                self.metrics.answered(exc.status, None, self.slo_s)
                self.stats.errors.add(self.clock(), 1.0)
            elif isinstance(exc, Exception):
                self.metrics.answered(500, None, self.slo_s)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._inflight -= 1
            self._progress_at = self.clock()
        assert state is not None
        end = self._progress_at
        latency_s = end - state.arrival
        self.metrics.answered(200, latency_s, self.slo_s)
        self.stats.latency.add(end, latency_s)
        if state.estimate == state.estimate:  # not NaN: admission estimated it
            self._admission.error.observe(latency_s - state.estimate)  # type: ignore[union-attr]
        return InferResponse(
            self.name, self._shape_outputs(outputs, request, batched), id=request.id
        )

    def _admit(self, timeout_s: float, parameters: Mapping[str, Any]) -> None:
        """Shed (503) what the router cannot take or cannot finish in time."""
        settings = self.settings
        if self.draining:
            self._reject("draining")
            raise Overloaded("the router is shutting down", retry_after_s=1.0)
        if self._inflight >= settings.max_inflight:
            self._reject("inflight")
            raise Overloaded(
                f"{self._inflight} requests in flight (limit {settings.max_inflight}); retry later",
                retry_after_s=settings.retry_after_s,
            )
        if self._admission is not None:
            budget_s = timeout_s if "timeout_ms" in parameters else self._default_budget_s
            estimate_s = self._admission.refuse(budget_s, timeout_s)
            if estimate_s is not None:
                self._reject("deadline")
                raise Overloaded(
                    f"the pipeline cannot finish this request in time: the work queued "
                    f"ahead would take ~{estimate_s * 1000:.0f} ms, over its "
                    f"{budget_s * 1000:.0f} ms budget; retry later",
                    retry_after_s=max(settings.retry_after_s, estimate_s - budget_s),
                )

    def _reject(self, reason: str) -> None:
        self.metrics.answered(503, None, self.slo_s)
        self.metrics.rejected(reason)

    def stalled_s(self) -> float:
        """How long requests have been in flight with none leaving the router and no
        batch coming back (0 when none is in flight)."""
        return self.clock() - self._progress_at if self._inflight else 0.0

    # ------------------------------------------------------------ request flow
    def _check_name(self, name: str) -> None:
        if name != self.name:
            raise ModelNotFound(f"unknown model {name!r}; this router serves {self.name!r}")

    def _validate(self, given: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], bool]:
        """Check names, datatypes and shapes; strip a leading batch dim of 1 if present."""
        unknown = sorted(set(given) - set(self._inputs))
        if unknown:
            raise InvalidInput(f"unknown input(s) {unknown}; expected {sorted(self._inputs)}")
        inputs: dict[str, Tensor] = {}
        batched: set[bool] = set()
        for name, spec in self._inputs.items():
            tensor = given.get(name)
            if tensor is None:
                raise InvalidInput(f"missing input {name!r} ({spec.datatype} {spec.shape})")
            if tensor.datatype != spec.datatype:
                raise InvalidInput(
                    f"input {name!r} has datatype {tensor.datatype}, expected {spec.datatype}"
                )
            shape = tensor.shape
            if len(shape) == len(spec.shape) + 1 and shape[0] == 1:
                shape, lead = shape[1:], True
            else:
                lead = False
            if len(shape) != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, shape, strict=True)
            ):
                raise InvalidInput(
                    f"input {name!r} has shape {list(tensor.shape)}, expected {spec.shape} "
                    f"or [1, {', '.join(map(str, spec.shape))}] (-1 = any size)"
                )
            batched.add(lead)
            inputs[name] = Tensor(tensor.datatype, shape, tensor.data) if lead else tensor
        if len(batched) > 1:
            raise InvalidInput("inputs mix shapes with and without a leading batch dim of 1")
        return inputs, batched.pop()

    def _timeout(self, parameters: Mapping[str, Any]) -> float:
        """The request's deadline in seconds: `timeout_ms`, a finite number of
        milliseconds in (0, max(max_timeout_factor x SLO, max_timeout_s)], else the
        default."""
        value = parameters.get("timeout_ms")
        if value is None:
            return self._default_timeout_s
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(
                f"parameter timeout_ms must be a number of milliseconds, got {value!r} "
                f"({type(value).__name__})"
            )
        # NaN fails both comparisons, inf and 1e300 the second.
        if not 0 < value <= self._max_timeout_ms:
            raise InvalidInput(
                f"parameter timeout_ms must be above 0 and at most {self._max_timeout_ms:g} "
                f"(the larger of {self.settings.max_timeout_factor:g} x the pipeline's "
                f"{self.slo_s * 1000:g} ms SLO and {self.settings.max_timeout_s:g} s), "
                f"got {value!r}"
            )
        return float(value) / 1000.0

    def _check_outputs(self, requested: tuple[str, ...]) -> None:
        unknown = sorted(set(requested) - self._outputs)
        if unknown:
            raise InvalidInput(f"unknown output(s) {unknown}; available {sorted(self._outputs)}")

    def _shape_outputs(
        self, outputs: dict[str, Tensor], request: InferRequest, batched: bool
    ) -> dict[str, Tensor]:
        if request.outputs is not None:
            missing = sorted(set(request.outputs) - set(outputs))
            if missing:
                raise InvalidInput(f"unknown output(s) {missing}; available {sorted(outputs)}")
            outputs = {name: outputs[name] for name in request.outputs}
        if batched:
            outputs = {n: Tensor(t.datatype, (1, *t.shape), t.data) for n, t in outputs.items()}
        return outputs

    def _submit(self, state: _Request, ready: list[ReadyStage]) -> None:
        now = self.clock()
        for stage in ready:
            item = WorkItem(state, stage.inputs, state.deadline)
            queue = self.queues[stage.name]
            try:
                step = queue.push(item, now)
            except QueueFull as exc:
                self.metrics.rejected("queue_full")
                state.fail(
                    Overloaded(f"{exc}; retry later", retry_after_s=self.settings.retry_after_s)
                )
                return
            state.items.append(item)
            self._perform(queue, step, now)

    @property
    def inflight(self) -> int:
        return self._inflight

    def _expire_request(self, state: _Request) -> None:
        state.fail(
            DeadlineExceeded(
                f"request did not finish within its deadline of "
                f"{(state.deadline - state.arrival) * 1000:.0f} ms (pipeline SLO "
                f"{self.slo_s * 1000:.0f} ms); the pipeline is overloaded or under-provisioned"
            )
        )

    def _perform(self, queue: StageQueue, step: Step, now: float) -> None:
        # `now` comes from the caller: nothing that can fail runs between the queue
        # handing a batch out and the batch reaching its worker's stream.
        for dispatch in step.dispatches:
            conn = self.workers.get(str(dispatch.worker))
            if conn is None:  # pragma: no cover - the queue only knows connected workers
                raise RuntimeError(f"dispatch to unknown worker {dispatch.worker}")
            conn.dispatched_at = now
            conn.send(
                wire.batch_message(dispatch.batch_id, [item.inputs for item in dispatch.items])
            )
            self.metrics.batch(queue.stage, len(dispatch.items))
        for item in step.expired:
            item.request.fail(
                DeadlineExceeded(f"deadline passed while queued at stage {queue.stage!r}")
            )
        for item in step.failed:
            self.metrics.stage_errors.labels(self.name, queue.stage, "worker_lost").inc()
            item.request.fail(
                StageFailed(
                    f"stage {queue.stage!r}: this request killed its worker {item.attempts} "
                    "times; it was isolated (alone in its batch) and failed"
                )
            )

    # ----------------------------------------------------------------- workers
    def replicas(self) -> dict[str, tuple[int, int]]:
        """(desired, ready) per stage; desired is the ready count where nobody set one."""
        desired = self._desired()
        return {n: (desired.get(n, q.workers), q.workers) for n, q in self.queues.items()}

    def ready_replicas(self) -> dict[str, int]:
        """Connected workers per stage."""
        return {n: q.workers for n, q in self.queues.items()}

    def attach(self, hello: pb.Hello) -> WorkerConn:
        if hello.pipeline != self.name:
            raise ValueError(f"this router serves pipeline {self.name!r}, not {hello.pipeline!r}")
        if hello.stage not in self.queues:
            raise ValueError(f"pipeline {self.name!r} has no stage {hello.stage!r}")
        conn = WorkerConn(
            f"{hello.stage}/{next(self._worker_ids)}", hello.stage, hello.pid, hello.hardware
        )
        self.workers[conn.id] = conn
        queue = self.queues[conn.stage]
        now = self.clock()
        self._perform(queue, queue.add_worker(conn.id, now), now)
        if self.on_attach is not None:
            self.on_attach(conn.pid)
        # DEBUG: `sloline run`'s status table and `sloline_stage_replicas` show who is
        # connected, and the profiler's stand-in workers are no business of the user's.
        log.debug("worker %s (pid %d) joined stage %s", conn.id, conn.pid, conn.stage)
        return conn

    def detach(self, conn: WorkerConn) -> None:
        if self.workers.pop(conn.id, None) is None:
            return
        queue = self.queues[conn.stage]
        busy = queue.in_flight()
        step = queue.remove_worker(conn.id, self.clock())
        requeued = busy - queue.in_flight() - len(step.failed) - len(step.expired)
        if requeued:
            self.metrics.requeued.labels(self.name, conn.stage).inc(requeued)
            log.warning("worker %s left holding %d item(s); re-queued", conn.id, requeued)
        self._perform(queue, step, self.clock())
        conn.close(flush=False)

    def leaving(self, conn: WorkerConn) -> None:
        if self.queues[conn.stage].drain_worker(conn.id):
            conn.close()

    def on_result(self, conn: WorkerConn, result: pb.Result, payload: memoryview) -> None:
        """A worker returned a batch: answer or advance its requests, dispatch more."""
        stage = conn.stage
        queue = self.queues[stage]
        now = self.clock()
        step = queue.worker_done(conn.id, result.batch_id, now)
        self._progress_at = now
        self.metrics.service_time(stage, result.service_s)
        items = step.completed
        self.stats.stage_batch[stage].add(now, len(items))
        self.stats.stage_service[stage].add(now, result.service_s)
        self.stats.stage_cpu[stage].add(now, result.cpu_s)
        roundtrip_s = now - conn.dispatched_at
        self.stats.stage_roundtrip[stage].add(now, roundtrip_s)
        if self._admission is not None:
            self._admission.models[stage].observe(len(items), roundtrip_s)
        visits = self.stats.stage_latency[stage]
        for item in items:
            visits.add(now, now - item.enqueued_at)
        if result.error or len(result.items) != len(items):
            reason = result.error or (
                f"worker returned {len(result.items)} results for {len(items)} items"
            )
            self.metrics.stage_errors.labels(self.name, stage, "model_error").inc(len(items))
            for item in items:
                item.request.fail(StageFailed(f"stage {stage!r} failed: {reason}"))
        else:
            outputs = wire.result_tensors(result, payload)
            for item, out, values in zip(items, result.items, outputs, strict=True):
                state: _Request = item.request
                if item.cancelled or state.future.done():
                    continue
                if out.error:
                    self.metrics.stage_errors.labels(self.name, stage, "model_error").inc()
                    state.fail(StageFailed(f"stage {stage!r} failed: {out.error}"))
                    continue
                self._advance(state, stage, values)
        self._perform(queue, step, now)
        if queue.draining(conn.id):
            conn.close()

    def _advance(self, state: _Request, stage: str, values: dict[str, Tensor]) -> None:
        """`stage` finished for one request: answer it or submit its next stages. Whatever
        goes wrong fails this request alone (500), never the batch or the worker's stream."""
        try:
            ready = state.run.complete(stage, values)
            if state.run.finished:
                state.future.set_result(self._finite(state.run.output()))
            else:
                self._submit(state, ready)
        except InferenceError as exc:
            state.fail(exc)
        except Exception as exc:
            log.error("stage %r: advancing a request failed", stage, exc_info=True)
            state.fail(
                StageFailed(f"the router failed after stage {stage!r}: {type(exc).__name__}: {exc}")
            )

    def _finite(self, outputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """A pipeline output with NaN or infinities is the model's failure, answered 500 on
        both doors alike (JSON cannot carry them; a binary answer would differ)."""
        for name, tensor in outputs.items():
            if tensor.datatype in _FLOATS and not np.isfinite(tensor.array()).all():
                stage = self.graph.pipeline.spec.output
                self.metrics.stage_errors.labels(self.name, stage, "model_error").inc()
                raise StageFailed(
                    f"stage {stage!r} returned pipeline output {name!r} with NaN or infinite "
                    "values; outputs must be finite"
                )
        return outputs

    async def expire_queued(self) -> None:
        """Periodically drop queued work whose deadline passed (runs for the router's life).

        Each wake-up also measures how late the event loop ran it
        (`sloline_event_loop_lag_seconds`): the wait everything on the loop sees,
        requests the front doors have not handed to the router yet included.
        """
        loop = asyncio.get_running_loop()
        interval_s = self.settings.expiry_interval_s
        lag = self.metrics.loop_lag
        while True:
            slept = loop.time()
            await asyncio.sleep(interval_s)
            lag.observe(max(0.0, loop.time() - slept - interval_s))
            now = self.clock()
            for queue in self.queues.values():
                if len(queue):
                    self._perform(queue, queue.cancel_expired(now), now)


def _check_priority(parameters: Mapping[str, Any]) -> None:
    """Triton's `priority` (an unsigned integer, 0 = the default level) is accepted for its
    clients' sake and not used: every stage queue is one FIFO, which the estimator
    simulates. A value Triton would refuse is refused here too."""
    value = parameters.get("priority")
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64
    ):
        raise InvalidInput(
            f"parameter priority must be an integer in [0, 2^64), got {value!r} "
            "(sloline accepts it for Triton's clients and serves every request in FIFO order)"
        )


class WorkerService:
    """gRPC endpoint workers dial: Hello, then results up and batches down.

    Registered with `wire`'s (de)serialisers (`add_worker_service`): messages arrive as
    (message, payload) pairs and leave as encoded bytes.
    """

    def __init__(self, router: Router) -> None:
        self.router = router

    async def Connect(  # noqa: N802 - gRPC method name
        self,
        _requests: AsyncIterator[wire.Sent],
        context: grpc.aio.ServicerContext[wire.Sent, bytes],
    ) -> None:
        first = await context.read()
        if first is grpc.aio.EOF or not first[0].HasField("hello"):
            await context.write(wire.welcome_message("first message must be Hello"))
            return
        try:
            conn = self.router.attach(first[0].hello)
        except ValueError as exc:
            await context.write(wire.welcome_message(str(exc)))
            return
        await context.write(wire.welcome_message())
        reader = asyncio.create_task(self._read(conn, context))
        try:
            await conn.write_until_closed(context)
        finally:
            reader.cancel()
            self.router.detach(conn)

    async def _read(
        self, conn: WorkerConn, context: grpc.aio.ServicerContext[wire.Sent, bytes]
    ) -> None:
        try:
            while (received := await context.read()) is not grpc.aio.EOF:
                message, payload = received
                if message.HasField("result"):
                    self.router.on_result(conn, message.result, payload)
                elif message.HasField("leaving"):
                    self.router.leaving(conn)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("worker %s sent a message the router could not handle", conn.id)
        finally:
            self.router.detach(conn)


def add_worker_service(server: grpc.aio.Server, router: Router) -> None:
    """Register `WorkerService.Connect` for `router` on a `grpc.aio.Server` (before start)."""
    handler = grpc.stream_stream_rpc_method_handler(
        WorkerService(router).Connect,
        request_deserializer=wire.decode_worker_message,
        response_serializer=wire.identity,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(wire.SERVICE, {"Connect": handler}),)
    )
