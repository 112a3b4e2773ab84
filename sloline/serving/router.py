"""The pipeline router: the data plane behind the REST and gRPC front doors.

One router serves one pipeline. For each request it checks the model, the inputs, the
parameters and the requested outputs (`checks.py`, the one place they are checked),
admits it or sheds it (`admission.py`), walks the DAG (`DagRun`), and puts each ready
stage's work into that stage's centralized batched queue (`StageQueue`). Workers dial in
over `WorkerService.Connect` (`workers.py`) and pull batches with one credit each;
results flow back, downstream stages become ready, and the output stage's values are the
response.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from sloline.common.tensors import (
    DeadlineExceeded,
    InferenceError,
    InferRequest,
    InferResponse,
    ModelMetadata,
    Overloaded,
    StageFailed,
    Tensor,
    TensorMetadata,
)
from sloline.serving import tracing, wire
from sloline.serving.admission import Admission
from sloline.serving.checks import VERSIONS, RequestChecks
from sloline.serving.dag import DagRun, DagShape, ReadyStage
from sloline.serving.metrics import RouterMetrics, StateCollector
from sloline.serving.proto import worker_pb2 as pb
from sloline.serving.queue import QueueFull, StageQueue, Step, WorkItem
from sloline.serving.stats import RouterStats
from sloline.serving.triton_stats import TritonStats
from sloline.serving.workers import WorkerConn
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
    # rows (leading batch dimension) one request may carry; each row is a queue item
    max_rows: int = 64
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
    trace: Any = None  # its trace context while tracing is on (tracing.py)
    traceparent: str = ""  # and that context's W3C traceparent, for its workers

    def fail(self, error: InferenceError) -> None:
        if not self.future.done():
            self.future.set_exception(error)
        self.abandon()

    def abandon(self) -> None:
        """Nobody waits for the answer any more: drop the work still queued."""
        self.future.cancel()
        for item in self.items:
            item.cancelled = True


class Router:
    """Implements `DataPlane` for one pipeline and the bookkeeping behind `WorkerService`
    (`workers.py`) for its workers."""

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
        self.triton_stats = TritonStats(self.metrics.queue_wait, self.settings.max_rows)
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
        self._expiry_task: asyncio.Task[None] | None = None
        s = self.settings
        default_timeout_s = s.deadline_factor * self.slo_s
        self._default_budget_s = min(default_timeout_s, s.admission_factor * self.slo_s)
        self.checks = RequestChecks(
            graph,
            default_timeout_s=default_timeout_s,
            max_timeout_factor=s.max_timeout_factor,
            max_timeout_s=s.max_timeout_s,
            max_rows=s.max_rows,
        )
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

    def check_model(self, name: str, version: str = "") -> None:
        """404 unless this router serves `name` (at `version`, when given): the front doors
        ask before reading a request's body, so an unknown model is 404 whatever it sent."""
        self.checks.model(name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        self.checks.model(name, version)
        return self.ready()

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        self.checks.model(name, version)
        out = self.graph.output.spec.outputs
        return ModelMetadata(
            name=self.name,
            platform="sloline_pipeline",
            versions=VERSIONS,
            inputs=tuple(
                TensorMetadata(t.name, t.datatype, (-1, *t.shape)) for t in self.graph.inputs
            ),
            outputs=tuple(TensorMetadata(t.name, t.datatype, (-1, *t.shape)) for t in out),
        )

    async def infer(self, request: InferRequest) -> InferResponse:
        """Check, admit, run the DAG, answer.

        Everything a request carries is checked (`RequestChecks`: model name and version,
        inputs, parameters, requested outputs) before it counts as an arrival (the
        envelope the tuner reads, the re-planner's arrivals): invalid traffic is not
        demand, while requests shed for overload are. The in-flight count goes up only
        inside the ``try`` whose ``finally`` takes it down again, so no failure at any
        step can leak a slot; an `InferenceError` reaches the front door as its status,
        anything else propagates (the front door logs it and answers 500), and either
        way the request's queued work is dropped.
        """
        received = self.clock()
        checks = self.checks
        checks.model(request.model_name, request.model_version)
        rows, count = checks.inputs(request.inputs)
        timeout_s = checks.timeout(request.parameters)
        checks.priority(request.parameters)
        checks.outputs(request.outputs)
        now = self.clock()
        if (arrivals := self.stats.arrivals) is not None:
            arrivals.add(now, now)
        if self._on_arrival is not None:
            self._on_arrival(now)
        self._admit(timeout_s, request.parameters)
        self.metrics.admission.observe(self.clock() - received)
        states: list[_Request] = []
        timer: asyncio.TimerHandle | None = None
        if self._inflight == 0:
            self._progress_at = now  # the stall clock starts with the first request
        self._inflight += 1
        try:
            loop = asyncio.get_running_loop()
            states = self._row_states(loop, rows, now, timeout_s)
            state = states[0]
            timer = loop.call_later(timeout_s, self._expire_request, *states)
            outputs = await self._run_rows(states)
        except BaseException as exc:
            for row_state in states:
                row_state.abandon()
            self.triton_stats.fail(self.clock() - now)
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
        end = self._progress_at
        latency_s = end - state.arrival
        self.metrics.answered(200, latency_s, self.slo_s)
        self.stats.latency.add(end, latency_s)
        self.triton_stats.success(latency_s, len(states))
        if state.estimate == state.estimate:  # not NaN: admission estimated it
            self._admission.error.observe(latency_s - state.estimate)  # type: ignore[union-attr]
        return InferResponse(
            self.name, checks.shape_outputs(outputs, request.outputs, count), id=request.id
        )

    def _row_states(
        self,
        loop: asyncio.AbstractEventLoop,
        rows: list[dict[str, Tensor]],
        now: float,
        timeout_s: float,
    ) -> list[_Request]:
        """One request per row, queued together (batchable) and answered together; the
        first carries the admission estimate, all carry the trace context."""
        states = [
            _Request(DagRun(self._dag, row), loop.create_future(), now, now + timeout_s)
            for row in rows
        ]
        if self._admission is not None:
            states[0].estimate = self._admission.last_s
        if tracing.tracer is not None:
            context = tracing.current_context()
            traceparent = tracing.traceparent(context)
            for state in states:
                state.trace = context
                state.traceparent = traceparent
        return states

    async def _run_rows(self, states: list[_Request]) -> list[dict[str, Tensor]]:
        """Submit each row's request (in order, so rows can share batches) and wait for
        all: the first failure fails the request."""
        for state in states:
            self._submit(state, state.run.start())
        if len(states) == 1:
            return [await states[0].future]
        return list(await asyncio.gather(*(state.future for state in states)))

    def _admit(self, timeout_s: float, parameters: Mapping[str, Any]) -> None:
        """Shed (503) what the router cannot take or cannot finish in time."""
        settings = self.settings
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

    def _expire_request(self, *states: _Request) -> None:
        for state in states:
            state.fail(
                DeadlineExceeded(
                    f"request did not finish within its deadline of "
                    f"{(state.deadline - state.arrival) * 1000:.0f} ms (pipeline SLO "
                    f"{self.slo_s * 1000:.0f} ms); the pipeline is overloaded or "
                    "under-provisioned"
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
            traceparents = (
                [item.request.traceparent for item in dispatch.items]
                if tracing.tracer is not None
                else ()
            )
            conn.send(
                wire.batch_message(
                    dispatch.batch_id, [item.inputs for item in dispatch.items], traceparents
                )
            )
            self.metrics.batch_size[queue.stage].observe(len(dispatch.items))
            waits = self.metrics.queue_wait[queue.stage]
            for item in dispatch.items:
                waits.observe(now - item.enqueued_at)
        if step.released or step.notify:
            self._tell_backlog(queue, step, now)
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

    def _tell_backlog(self, queue: StageQueue, step: Step, now: float) -> None:
        """Tell workers serving several routers what is queued here (queue.py, "Many
        routers"): released ones that their credit is back with them, standby ones that
        work is waiting."""
        head_age_s = queue.head_age(now)
        counted = self.metrics.credit_messages
        for worker in step.released:
            if (conn := self.workers.get(str(worker))) is not None:
                conn.send(wire.backlog_message(head_age_s, released=True))
                counted[queue.stage, "released"].inc()
        if head_age_s is None:
            return
        message = wire.backlog_message(head_age_s)
        for worker in step.notify:
            if worker not in step.released and (conn := self.workers.get(str(worker))):
                conn.send(message)
                counted[queue.stage, "backlog"].inc()

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
        self._perform(queue, queue.add_worker(conn.id, now, standby=hello.standby), now)
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

    def on_credit(self, conn: WorkerConn, credit: pb.Credit) -> None:
        """A worker serving several routers grants us its credit or withdraws it."""
        queue = self.queues[conn.stage]
        now = self.clock()
        step = queue.grant(conn.id, now) if credit.grant else queue.withdraw(conn.id)
        self.metrics.credit_messages[conn.stage, "grant" if credit.grant else "withdraw"].inc()
        self._perform(queue, step, now)

    def on_result(self, conn: WorkerConn, result: pb.Result, payload: memoryview) -> None:
        """A worker returned a batch: answer or advance its requests, dispatch more."""
        stage = conn.stage
        queue = self.queues[stage]
        now = self.clock()
        elsewhere_s = result.elsewhere_age_s if result.HasField("elsewhere_age_s") else None
        step = queue.worker_done(conn.id, result.batch_id, now, elsewhere_s)
        self._progress_at = now
        self.metrics.service_time(stage, result.service_s)
        items = step.completed
        self.triton_stats.batch(stage, len(items), result.service_s)
        self.stats.stage_batch[stage].add(now, len(items))
        self.stats.stage_service[stage].add(now, result.service_s)
        self.stats.stage_cpu[stage].add(now, result.cpu_s)
        self.stats.stage_idle[stage].add(
            now, result.idle_s if result.HasField("idle_s") else math.nan
        )
        roundtrip_s = now - conn.dispatched_at
        self.stats.stage_roundtrip[stage].add(now, roundtrip_s)
        if self._admission is not None:
            self._admission.models[stage].observe(len(items), roundtrip_s)
        visits = self.stats.stage_latency[stage]
        for item in items:
            visits.add(now, now - item.enqueued_at)
        if tracing.tracer is not None:
            self._trace_visits(conn, items, result.service_s, now)
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

    def _trace_visits(
        self, conn: WorkerConn, items: list[WorkItem], service_s: float, now: float
    ) -> None:
        for item in items:
            if item.request.trace is not None:
                tracing.stage_span(
                    item.request.trace,
                    conn.stage,
                    item.enqueued_at,
                    conn.dispatched_at,
                    now,
                    **{
                        "sloline.batch_size": len(items),
                        "sloline.worker": conn.id,
                        "sloline.service_s": service_s,
                    },
                )

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
