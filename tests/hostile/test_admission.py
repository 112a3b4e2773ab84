"""Hostile traffic against the router's admission: every parameter it reads is validated
(NaN, inf, 1e300, negative, strings and bools for `timeout_ms` are 400 on REST and gRPC
and leak no in-flight slot), a failure at any step of `Router.infer` leaves the in-flight
count at 0, readiness turns false when the router is wedged, deadline-aware admission
refuses at once what cannot finish in time and admits what can, and the tuner's arrival
count ignores invalid requests.

The router-level tests drive a real `Router` on the test's event loop with a fake clock
and fake workers (batches are answered by hand), so they are deterministic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from sloline.common.tensors import (
    InferenceError,
    InferRequest,
    InvalidInput,
    Overloaded,
    Tensor,
)
from sloline.serving import grpc_codec, wire
from sloline.serving.admission import MIN_SAMPLES, Admission, ErrorQuantile, StageModel
from sloline.serving.dag import DagRun
from sloline.serving.proto import grpc_service_pb2_grpc as grpc_pb
from sloline.serving.proto import worker_pb2 as pb
from sloline.serving.router import Router, RouterSettings
from sloline.serving.stats import Ring
from sloline.serving.workers import WorkerConn
from sloline.spec import load_pipeline
from tests.support.serve import NOOP, BackgroundPipeline

BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, 1e300, -5, 0, 0.0, "100", True, False, [100]]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_router(
    clock: Clock | None = None, max_batch: dict[str, int] | None = None, **settings: Any
) -> Router:
    settings.setdefault("deadline_factor", 50.0)  # 5 s of real time for the loop's timers
    settings.setdefault("admission_factor", 1.0)  # budget without timeout_ms: the SLO
    return Router(
        load_pipeline(NOOP).graph,
        max_batch=max_batch or {"s1": 1, "s2": 1, "s3": 1},
        settings=RouterSettings(**settings),
        registry=CollectorRegistry(),
        clock=clock or Clock(),
    )


def request(timeout_ms: object = None, x: float = 1.0) -> InferRequest:
    params = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    tensor = Tensor.from_array(np.full(4, x, dtype=np.float32))
    return InferRequest("noop", {"x": tensor}, parameters=params)


class Workers:
    """One fake worker per stage of the noop chain, answering batches by hand."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.conns: dict[str, WorkerConn] = {}
        for stage in router.queues:
            hello = pb.Hello(pipeline="noop", stage=stage, pid=1, hardware="cpu-1")
            self.conns[stage] = router.attach(hello)

    def pending(self, stage: str) -> int:
        """Batches sent to the stage's worker and not answered yet. Backlog notices (the
        router tells a worker it shares with other routers about queued work) are read
        and dropped: the fake worker moves its credit only when a test says so."""
        pending = self.conns[stage]._pending
        batches = [m for m in pending if wire.decode_router_message(m)[0].HasField("batch")]
        pending.clear()
        pending.extend(batches)
        return len(batches)

    def answer(self, stage: str, elsewhere_age_s: float | None = None) -> None:
        """Answer the stage's oldest batch with its inputs (identity); `elsewhere_age_s`:
        the worker knows of older work at another router (it leaves for it)."""
        conn = self.conns[stage]
        self.pending(stage)
        message, payload = wire.decode_router_message(conn._pending.popleft())
        outputs = wire.batch_arrays(message.batch, payload)
        raw = wire.result_message(
            message.batch.batch_id, outputs, service_s=0.001, elsewhere_age_s=elsewhere_age_s
        )
        result, result_payload = wire.decode_worker_message(raw)
        try:
            self.router.on_result(conn, result.result, result_payload)
        except Exception:
            # What the worker stream does (`WorkerService._read`): log, drop the worker;
            # its batch goes back to the queue. The worker process then reconnects.
            self.router.detach(conn)
            hello = pb.Hello(pipeline="noop", stage=stage, pid=1, hardware="cpu-1")
            self.conns[stage] = self.router.attach(hello)
            raise

    def answer_all(self) -> None:
        while any(self.pending(s) for s in self.conns):
            for stage in self.conns:
                while self.pending(stage):
                    self.answer(stage)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("value", BAD_TIMEOUTS, ids=repr)
async def test_bad_timeout_ms_is_400_naming_it(value: object) -> None:
    router = make_router()
    Workers(router)
    with pytest.raises(InvalidInput, match="timeout_ms"):
        await router.infer(request(value))
    assert router.inflight == 0


async def test_timeout_ms_limit_is_60_slos_or_10_min_and_in_range_values_pass() -> None:
    router = make_router()
    workers = Workers(router)
    with pytest.raises(InvalidInput, match=r"at most 600000 \(the larger of 60 x the pipeline's"):
        await router.infer(request(600000.5))
    slow = make_router(max_timeout_s=1.0)
    with pytest.raises(InvalidInput, match=r"at most 6000 \("):
        await slow.infer(request(6001))
    for ok in (600000, 1, 0.5, 250.0):
        task = asyncio.create_task(router.infer(request(ok)))
        await settle()
        workers.answer_all()
        assert (await task).outputs["x"].shape == (4,)
    assert router.inflight == 0


@pytest.mark.parametrize("value", [-1, 2**64, 1.5, math.nan, math.inf, "1", True], ids=repr)
async def test_absurd_priority_is_400_and_a_valid_one_is_served(value: object) -> None:
    router = make_router()
    workers = Workers(router)
    bad = InferRequest("noop", request().inputs, parameters={"priority": value})
    with pytest.raises(InvalidInput, match="priority"):
        await router.infer(bad)
    good = InferRequest("noop", request().inputs, parameters={"priority": 2**64 - 1})
    task = asyncio.create_task(router.infer(good))
    await settle()
    workers.answer_all()
    assert (await task).outputs["x"].shape == (4,)
    assert router.inflight == 0


async def test_unknown_requested_output_is_400_before_any_work() -> None:
    router = make_router()
    workers = Workers(router)
    bad = InferRequest("noop", request().inputs, outputs=("nope",))
    with pytest.raises(InvalidInput, match="unknown output"):
        await router.infer(bad)
    assert not any(workers.pending(s) for s in router.queues)


async def test_a_nan_flood_leaks_no_slot() -> None:
    router = make_router(max_inflight=8)
    workers = Workers(router)
    for _ in range(4200):
        with pytest.raises(InvalidInput):
            await router.infer(request(math.nan))
    assert router.inflight == 0 and router.ready()
    task = asyncio.create_task(router.infer(request()))
    await settle()
    workers.answer_all()
    assert (await task).outputs["x"].shape == (4,)


# ------------------------------------------------------------------ accounting


class Broken:
    """A ring or a histogram (anything with `add` or `observe`) that fails."""

    def add(self, *_: object) -> None:
        raise RuntimeError("injected")

    observe = add


def _injections() -> Iterator[tuple[str, Callable[[Router, Workers, pytest.MonkeyPatch], None]]]:
    def boom(*_: object, **__: object) -> Any:
        raise RuntimeError("injected")

    def nth_clock_call(n: int) -> Callable[[Router, Workers, pytest.MonkeyPatch], None]:
        def inject(router: Router, _w: Workers, mp: pytest.MonkeyPatch) -> None:
            calls = [0]
            real = router.clock

            def clock() -> float:
                calls[0] += 1
                if calls[0] == n:
                    raise RuntimeError("injected")
                return real()

            mp.setattr(router, "clock", clock)

        return inject

    for n in range(1, 12):
        yield f"clock call {n}", nth_clock_call(n)
    yield "arrivals ring", lambda r, _w, mp: mp.setattr(r.stats, "arrivals", Broken())
    yield "on_arrival", lambda r, _w, mp: mp.setattr(r, "_on_arrival", boom)
    yield (
        "admission estimate",
        lambda _r, _w, mp: mp.setattr(Admission, "estimate_s", boom),
    )
    yield "DagRun", lambda _r, _w, mp: mp.setattr("sloline.serving.router.DagRun", boom)
    yield "DagRun.start", lambda _r, _w, mp: mp.setattr(DagRun, "start", boom)
    yield (
        "loop.call_later",
        lambda _r, _w, mp: mp.setattr(asyncio.get_running_loop(), "call_later", boom),
    )
    yield "_submit", lambda r, _w, mp: mp.setattr(r, "_submit", boom)
    yield "queue.push", lambda r, _w, mp: mp.setattr(r.queues["s1"], "push", boom)
    yield "queue.push s2", lambda r, _w, mp: mp.setattr(r.queues["s2"], "push", boom)
    yield "metrics.answered", lambda r, _w, mp: mp.setattr(r.metrics, "answered", boom)
    yield "metrics.batch_size", lambda r, _w, mp: mp.setitem(r.metrics.batch_size, "s1", Broken())
    yield "batch encoding", lambda _r, _w, mp: mp.setattr(wire, "batch_message", boom)
    yield "latency ring", lambda r, _w, mp: mp.setattr(r.stats, "latency", Broken())
    yield "errors ring", lambda r, _w, mp: mp.setattr(r.stats, "errors", Broken())
    yield "stage rings", lambda r, _w, mp: mp.setitem(r.stats.stage_batch, "s1", Broken())
    yield "shape outputs", lambda r, _w, mp: mp.setattr(r.checks, "shape_outputs", boom)
    yield "DagRun.complete", lambda _r, _w, mp: mp.setattr(DagRun, "complete", boom)


# Failures between the queue handing out a batch and the batch reaching its worker.
DISPATCH_STEPS = {"batch encoding"}


@pytest.mark.parametrize(("where", "inject"), list(_injections()), ids=str)
async def test_a_failure_at_any_step_of_infer_leaks_no_slot(
    where: str, inject: Callable[[Router, Workers, pytest.MonkeyPatch], None]
) -> None:
    router = make_router()
    router.stats.arrivals = Ring(16)
    router._on_arrival = lambda _now: None
    workers = Workers(router)
    with pytest.MonkeyPatch.context() as mp:
        inject(router, workers, mp)
        task = asyncio.create_task(router.infer(request()))
        await settle()
        with contextlib.suppress(RuntimeError):  # it hit the result path (on_result)
            workers.answer_all()
        await settle()
        if not task.done():
            # The failure hit the result path: in the router, the worker's stream logs
            # it and the request waits for its deadline (here: its caller gives up).
            task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        if isinstance(outcome, BaseException):  # a clean error, or the injected one
            expected = (InferenceError, asyncio.CancelledError)
            assert isinstance(outcome, expected) or "injected" in str(outcome), outcome
    assert router.inflight == 0, where
    assert all(item.cancelled for q in router.queues.values() for item in q._items), where
    if where in DISPATCH_STEPS:
        return  # the batch was taken from the queue but never sent: that worker is stuck
    # The router still serves once the failure is gone.
    task = asyncio.create_task(router.infer(request()))
    await settle()
    workers.answer_all()
    assert (await task).outputs["x"].shape == (4,)
    assert router.inflight == 0


async def test_a_cancelled_request_frees_its_slot_and_drops_its_queued_work() -> None:
    router = make_router()
    workers = Workers(router)
    first = asyncio.create_task(router.infer(request()))
    second = asyncio.create_task(router.infer(request()))
    await settle()
    assert router.inflight == 2 and len(router.queues["s1"]) == 1
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert router.inflight == 1
    workers.answer_all()
    await first
    assert router.inflight == 0 and not any(len(q) for q in router.queues.values())


# ------------------------------------------------------------------ readiness


async def test_readiness_and_liveness_turn_false_when_nothing_leaves() -> None:
    clock = Clock()
    router = make_router(clock)
    workers = Workers(router)
    assert router.ready() and router.live()
    assert router.unready_after_s == 30.0  # the larger of 30 s and 10 x the 100 ms SLO
    task = asyncio.create_task(router.infer(request(timeout_ms=600_000)))
    await settle()
    clock.now += router.unready_after_s - 0.1
    assert router.ready()
    workers.answer("s1")  # a batch back is progress too
    clock.now += router.unready_after_s - 0.1
    assert router.ready()
    clock.now += 0.2
    assert not router.ready() and router.live()
    clock.now += 2 * router.unready_after_s
    assert not router.live()
    workers.answer_all()  # the workers answer at last
    await task
    assert router.inflight == 0 and router.ready() and router.live()


async def test_an_idle_router_stays_ready() -> None:
    clock = Clock()
    router = make_router(clock)
    workers = Workers(router)
    clock.now += 1e6
    assert router.ready() and router.live()
    task = asyncio.create_task(router.infer(request()))  # the first request after a lull
    await settle()
    assert router.ready()
    workers.answer_all()
    await task


# ------------------------------------------------------------------ admission


def test_stage_model_fits_fixed_plus_per_item_and_ignores_garbage() -> None:
    model = StageModel()
    for size in [1, 2, 4, 8] * 10:
        model.observe(size, 0.010 + 0.002 * size)
    assert model.seconds(8) == pytest.approx(0.026, rel=1e-6)
    assert model.seconds(1) == pytest.approx(0.012, rel=1e-6)
    before = model.seconds(8)
    for garbage in (math.nan, -1.0, math.inf):
        model.observe(4, garbage)
    model.observe(0, 0.5)
    assert model.seconds(8) == before
    flat = StageModel()
    for _ in range(10):
        flat.observe(4, 0.020)
    assert flat.seconds(4) == pytest.approx(0.020)
    assert flat.seconds(8) == pytest.approx(0.040)  # proportional beyond what it saw


def test_error_margin_settles_at_the_quantile_and_stays_bounded() -> None:
    errors = np.random.default_rng(0).exponential(0.010, 20000)  # p99 = 46 ms
    margin = ErrorQuantile(0.99, step_s=0.001, cap_s=0.05)
    for error in errors:
        margin.observe(float(error))
    assert margin.margin_s == pytest.approx(0.046, abs=0.008)
    for _ in range(1000):
        margin.observe(10.0)
    assert margin.margin_s == 0.05
    for _ in range(100_000):
        margin.observe(-1.0)
    assert margin.margin_s == 0.0


async def test_admission_learns_the_margin_its_estimates_miss_by() -> None:
    clock = Clock()
    router = make_router(clock)
    workers = Workers(router)
    await warm_up(router, workers, clock, 0.010)
    assert router._admission is not None
    error = router._admission.error
    assert error.margin_s == 0.0
    task = asyncio.create_task(router.infer(request()))  # estimated 30 ms, takes 50
    await settle()
    clock.now += 0.030
    workers.answer("s1")
    for stage in ("s2", "s3"):
        clock.now += 0.010
        workers.answer(stage)
    await task
    assert error.margin_s == pytest.approx(error.step_s * 0.99)
    # The margin counts against the budget: 4 queued at s1 (85 ms estimated) fit the
    # 100 ms budget with no margin, not with 20 ms.
    error.margin_s = 0.020
    admitted = [asyncio.create_task(router.infer(request())) for _ in range(5)]
    await settle()
    assert len(router.queues["s1"]) == 4
    with pytest.raises(Overloaded):
        await router.infer(request())
    error.margin_s = 0.0
    extra = asyncio.create_task(router.infer(request()))
    await settle()
    assert not extra.done()
    workers.answer_all()
    await asyncio.gather(*admitted, extra)


async def warm_up(router: Router, workers: Workers, clock: Clock, stage_s: float) -> None:
    """Serve requests one by one, each stage's batch taking `stage_s` of fake time."""
    for _ in range(MIN_SAMPLES):
        task = asyncio.create_task(router.infer(request()))
        await settle()
        for stage in ("s1", "s2", "s3"):
            clock.now += stage_s
            workers.answer(stage)
        await task


async def test_admission_refuses_at_once_what_cannot_finish_and_admits_what_can() -> None:
    clock = Clock()
    router = make_router(clock)
    workers = Workers(router)
    await warm_up(router, workers, clock, 0.010)
    # s1's worker is busy and its queue grows; s2 and s3 are idle. A new request's
    # estimate: 10 ms x (queued + 1 + 0.5) at s1, then 10 ms more at s2 and at s3 (the
    # items ahead pass them at the same pace); the budget without timeout_ms is the
    # 100 ms SLO, so 6 queued still fit (95 ms), 7 do not (105 ms).
    admitted = [asyncio.create_task(router.infer(request())) for _ in range(8)]
    await settle()
    assert len(router.queues["s1"]) == 7 and router.inflight == 8
    refused = asyncio.create_task(router.infer(request()))
    await asyncio.sleep(0)
    assert refused.done(), "refused at once, not queued"
    with pytest.raises(Overloaded, match="cannot finish this request in time") as exc:
        refused.result()
    assert exc.value.retry_after_s is not None and exc.value.retry_after_s > 0
    assert len(router.queues["s1"]) == 7
    assert router.metrics.rejections["deadline"] == 1 and router.metrics.codes[503] == 1
    # A caller that allows more time is admitted behind the same queue.
    patient = asyncio.create_task(router.infer(request(timeout_ms=1000)))
    await settle()
    assert not patient.done() and len(router.queues["s1"]) == 8
    # As the queue drains, requests are admitted again.
    for _ in range(4):
        clock.now += 0.010
        workers.answer("s1")
    await settle()
    assert len(router.queues["s1"]) == 4
    # s1 (busy, 4 queued): 10 ms x (4 + 1 + 0.5) = 55 ms. s2 (busy, 3 queued, and s1's
    # 5 items reach it first): 10 x (8 + 1 + 0.5) = 95. s3 (idle, 9 items ahead
    # upstream): max(95 + 10, 10 x (9 + 1)) = 105.
    assert router._admission is not None
    assert router._admission.estimate_s() == pytest.approx(0.105)
    workers.answer_all()
    for task in [*admitted, patient]:
        assert (await task).outputs["x"].shape == (4,)
    again = asyncio.create_task(router.infer(request()))
    await settle()
    assert not again.done() and router.inflight == 1
    workers.answer_all()
    assert (await again).outputs["x"].shape == (4,)


async def test_admission_counts_the_worker_time_other_routers_take() -> None:
    """s1's worker also serves another router: after each batch here it serves one there
    (its result names older work elsewhere, so it leaves on standby, then grants its
    credit back). Admission learns that the worker is here half the time while work waits
    here, counts each round ahead twice, and refuses a request that would fit if the
    worker were all this router's (with one router nothing changes: the share stays 1)."""
    clock = Clock()
    # Long deadlines (real-time timers): a slow machine must not expire the queued ones.
    router = make_router(clock, deadline_factor=600.0, max_timeout_factor=600.0)
    workers = Workers(router)
    await warm_up(router, workers, clock, 0.010)
    admission = router._admission
    assert admission is not None and admission.shares == [1.0, 1.0, 1.0]
    s1 = workers.conns["s1"]
    patient: list[asyncio.Task[Any]] = []

    def arrive() -> None:  # admitted whatever the estimate: it samples the share
        patient.append(asyncio.create_task(router.infer(request(timeout_ms=60_000))))

    async def work_off() -> None:  # every batch takes 10 ms, the worker stays
        while not all(t.done() for t in patient):
            for stage in ("s1", "s2", "s3"):
                while workers.pending(stage):
                    clock.now += 0.010
                    workers.answer(stage)
            await settle()

    for _ in range(3):
        arrive()
    await settle()
    for _ in range(30):
        clock.now += 0.010
        workers.answer("s1", elsewhere_age_s=60.0)  # older work elsewhere: it leaves
        await settle()
        arrive()  # the worker is away: none of it is ours
        await settle()
        clock.now += 0.010  # its batch at the other router
        router.on_credit(s1, pb.Credit(grant=True))  # back, with the credit
        arrive()  # the worker is here, busy with our batch
        await settle()
        for stage in ("s2", "s3"):
            while workers.pending(stage):
                workers.answer(stage)
        await settle()
    assert admission.shares[0] == pytest.approx(0.5, abs=0.05)
    assert admission.shares[1:] == [1.0, 1.0]  # never on standby
    # Work it off (the worker stays), then 4 queued at s1 while the worker is away.
    await work_off()
    arrive()
    await settle()
    workers.answer("s1", elsewhere_age_s=60.0)
    for _ in range(4):
        arrive()
    await settle()
    assert len(router.queues["s1"]) == 4 and router.queues["s1"].standby_workers == 1
    admission.error.margin_s = 0.0  # the estimate alone decides
    with pytest.raises(Overloaded, match="cannot finish this request in time"):
        await asyncio.wait_for(router.infer(request()), 5.0)  # refused at once
    shared_s = admission.estimate_s()
    saved, admission.shares[0] = admission.shares[0], 1.0
    alone_s = admission.estimate_s()  # the worker counted as all this router's
    admission.shares[0] = saved
    assert alone_s < router.slo_s < shared_s, (alone_s, shared_s)
    router.on_credit(s1, pb.Credit(grant=True))
    await work_off()
    for task in patient:
        assert (await task).outputs["x"].shape == (4,)


async def test_a_pipeline_slower_than_its_slo_is_still_served_when_idle() -> None:
    clock = Clock()
    router = make_router(clock, deadline_factor=2.0)  # deadline 200 ms
    workers = Workers(router)
    await warm_up(router, workers, clock, 0.060)  # idle: 180 ms, over the 100 ms budget
    assert router._admission is not None
    assert router._admission.idle_s() == pytest.approx(0.180)
    task = asyncio.create_task(router.infer(request()))
    await settle()
    assert not task.done(), "an idle router admits whatever its model says"
    # Late anyway: now the limit is the 200 ms deadline (60 x 2.5 + 60 + 60 > 200).
    with pytest.raises(Overloaded, match="in time"):
        await router.infer(request())
    clock.now += 0.18
    workers.answer_all()
    await task


async def test_a_large_max_batch_is_not_assumed_full_under_light_load() -> None:
    clock = Clock()
    router = make_router(clock, max_batch={"s1": 32, "s2": 1, "s3": 1})
    workers = Workers(router)
    await warm_up(router, workers, clock, 0.010)  # batches of 1 only: 10 ms per item
    first = asyncio.create_task(router.infer(request()))
    await settle()
    assert router._admission is not None
    # s1 busy with one item: half of its 10 ms batch, then the request's batch of 1
    # (15 ms); s2 and s3 one batch each after it: 15 + 10 + 10. Not a batch of 32
    # (320 ms at the 10 ms per item the model learned from batches of 1).
    assert router._admission.estimate_s() == pytest.approx(0.035)
    second = asyncio.create_task(router.infer(request()))
    await settle()
    assert not second.done()
    workers.answer_all()
    await asyncio.gather(first, second)


async def test_a_cold_router_admits_until_it_has_measurements() -> None:
    router = make_router()
    workers = Workers(router)
    tasks = [asyncio.create_task(router.infer(request())) for _ in range(50)]
    await settle()
    assert router.inflight == 50
    workers.answer_all()
    await asyncio.gather(*tasks)


async def test_admission_off_queues_to_the_deadline() -> None:
    clock = Clock()
    router = make_router(clock, admission=False)
    workers = Workers(router)
    await warm_up(router, workers, clock, 0.010)
    tasks = [asyncio.create_task(router.infer(request())) for _ in range(20)]
    await settle()
    assert router.inflight == 20
    workers.answer_all()
    await asyncio.gather(*tasks)


# ------------------------------------------------------------------ tuner arrivals


async def test_arrivals_count_valid_requests_including_shed_ones_but_not_invalid_ones() -> None:
    router = make_router(max_inflight=1)
    seen: list[float] = []
    router._on_arrival = seen.append
    router.stats.arrivals = Ring(64)
    workers = Workers(router)
    for bad in (math.nan, math.inf, "x", True):
        with pytest.raises(InvalidInput):
            await router.infer(request(bad))
    wrong_shape = InferRequest("noop", {"x": Tensor.from_array(np.zeros((2, 2, 2), np.float32))})
    with pytest.raises(InvalidInput):
        await router.infer(wrong_shape)
    assert seen == [] and len(router.stats.arrivals.since(0.0)) == 0
    first = asyncio.create_task(router.infer(request()))
    await settle()
    with pytest.raises(Overloaded):  # shed for overload: still demand for the tuner
        await router.infer(request())
    assert len(seen) == 2 and len(router.stats.arrivals.since(0.0)) == 2
    workers.answer_all()
    await first


# ------------------------------------------------------------------ front doors


def post(url: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(doc).encode(), method="POST", headers={"Content-Type": JSON}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


JSON = "application/json"


@pytest.fixture(scope="module")
def served() -> Iterator[BackgroundPipeline]:
    with BackgroundPipeline(NOOP, router=RouterSettings(max_inflight=8, deadline_factor=50)) as s:
        yield s


@pytest.mark.parametrize("value", [-5, 0, 1e300, "100", True, [1], {"a": 1}], ids=repr)
def test_rest_bad_timeout_ms_is_400(served: BackgroundPipeline, value: object) -> None:
    url = f"http://{served.http_url}/v2/models/noop/infer"
    doc = {
        "parameters": {"timeout_ms": value},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}],
    }
    code, body = post(url, doc)
    assert code == 400 and "timeout_ms" in body["error"], body
    assert served.p.router.inflight == 0


def test_grpc_nan_flood_is_invalid_argument_and_leaks_no_slot(served: BackgroundPipeline) -> None:
    async def flood() -> tuple[set[grpc.StatusCode], str]:
        codes: set[grpc.StatusCode] = set()
        async with grpc.aio.insecure_channel(served.grpc_url) as channel:
            stub = grpc_pb.GRPCInferenceServiceStub(channel)

            async def one(value: float) -> None:
                message = grpc_codec.request_to_proto(request(value))
                try:
                    await stub.ModelInfer(message)
                    codes.add(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as exc:
                    codes.add(exc.code())

            values = [math.nan, math.inf, -math.inf, 1e300, -1.0]
            for start in range(0, 4200, 300):
                await asyncio.gather(*(one(values[i % 5]) for i in range(start, start + 300)))
            ok = await stub.ModelInfer(grpc_codec.request_to_proto(request(250)))
            return codes, str(ok.outputs[0].name)

    codes, name = asyncio.run(flood())
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    assert name == "x"
    assert served.p.router.inflight == 0
    ready = urllib.request.urlopen(f"http://{served.http_url}/v2/health/ready", timeout=10)
    assert ready.status == 200
