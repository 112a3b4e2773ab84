"""`sloline calibrate`: serve a plan on this machine under its own planning load and
measure what the profile misses (docs/planner.md, "Calibrating a plan with what serving
measured"). :func:`calibrate_plan` is the whole workflow; the command only parses its flags.

The plan is served embedded (router, front doors, one worker process per replica, the
tuner off so the plan is what is measured), and a client in its own process sends the
pipeline's sample requests through the gRPC front door at the planning trace's arrival
times (request i carries sample i mod n, so a cascade branches as it was profiled). After
a short warm-up that is not measured, the router's per-batch records and the client's
latencies give a :class:`~sloline.planner.calibration.Calibration` with all three parts:
each stage's extra model time per batch, the in-situ hop, and the request path outside the
router — the part ``sloline run --calibration-out`` cannot see, because real clients are
not sloline's.

The client is open-loop: it sends at the scheduled times whatever the answers do, and its
latencies are measured from each send. It stops sending beyond MAX_OUTSTANDING requests
in flight and waits at most DRAIN_S for the last answers, so an overloaded plan ends the
run with errors rather than with unbounded memory.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from selectors import SelectSelector
from typing import Any, TypeVar

import numpy as np

from sloline.common.tensors import Arrays
from sloline.measure.profiler import ProfilerSettings, load_samples
from sloline.measure.session import PlanningSession, plan_pipeline
from sloline.planner.calibration import Calibration
from sloline.planner.estimator import Estimate
from sloline.planner.evaluator import Evaluator
from sloline.planner.plan import Plan
from sloline.planner.planner import InfeasibleError
from sloline.planner.problem import PlanningProblem
from sloline.planner.profile import PipelineProfile
from sloline.planner.topology import Topology
from sloline.spec import LoadedPipeline
from sloline.spec.hardware import HardwareCatalog

__all__ = [
    "InSituRun",
    "calibrate_plan",
    "measure_in_situ",
    "replay",
    "run_client",
]

T = TypeVar("T")

WARMUP_S = 3.0  # the trace's first seconds, sent once before the measured run
MAX_OUTSTANDING = 2_000  # the client stops sending beyond this many requests in flight
DRAIN_S = 30.0  # after the last send, wait at most this long for the answers
REQUEST_TIMEOUT_S = 30.0
SPIN_S = 0.0003  # sleep until this close to a send time, then poll the loop: waking from
# a sleep takes 0.1-0.4 ms here, and polling costs CPU the estimator does not simulate


def run_client(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a loop whose timers are precise to the microsecond, for the
    load generators that :func:`replay` paces.

    asyncio's default loop waits in epoll, whose timeout is whole milliseconds, rounded
    up: a sleep until a send time ends up to 1 ms late, and polling the loop for that
    last millisecond before every send costs CPU beside the pipeline that the estimator
    does not simulate (docs/benchmarks.md, "Micro-benchmarks behind design choices"). select(2)
    takes its timeout in microseconds (the client has a handful of descriptors, far below
    its limit), so the client sleeps until 0.3 ms before each send and polls only that."""
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(SelectSelector())) as r:
        return r.run(main)


async def replay(
    infer: Callable[[int], Awaitable[Any]],
    arrivals_s: np.ndarray,
    errors_type: type[Exception],
    *,
    max_outstanding: int = MAX_OUTSTANDING,
    drain_s: float = DRAIN_S,
) -> dict[str, Any]:
    """Call ``infer(i)`` at ``start + arrivals_s[i]`` without waiting for earlier answers.

    Returns ``start``, per request ``sent`` and ``done`` (``perf_counter``, i.e.
    CLOCK_MONOTONIC as the router's ``time.monotonic``; NaN where there was no answer) and
    ``errors`` (message -> count). Bounded: nothing more is sent beyond ``max_outstanding``
    requests in flight, and answers are awaited at most ``drain_s`` after the last send.
    Run it under :func:`run_client`: on asyncio's default loop the sleep before a send
    ends up to 1 ms late."""
    n = arrivals_s.size
    sent = np.full(n, math.nan)
    done = np.full(n, math.nan)
    errors: dict[str, int] = {}
    outstanding = 0

    async def one(i: int) -> None:
        nonlocal outstanding
        sent[i] = time.perf_counter()
        try:
            await infer(i)
            done[i] = time.perf_counter()
        except errors_type as exc:
            key = str(exc)[:160]
            errors[key] = errors.get(key, 0) + 1
        finally:
            outstanding -= 1

    tasks = []
    start = time.perf_counter() + 0.05
    for i, at in enumerate(arrivals_s):
        target = start + float(at)
        delay = target - time.perf_counter() - SPIN_S
        if delay > 0.0:
            await asyncio.sleep(delay)
        while time.perf_counter() < target:
            await asyncio.sleep(0)  # one loop iteration: answers keep being read
        if outstanding >= max_outstanding:
            errors["not sent: too many requests outstanding"] = n - i
            break
        outstanding += 1
        tasks.append(asyncio.create_task(one(i)))
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in pending:
        task.cancel()
    if pending:
        errors["no answer within the drain time"] = len(pending)
    return {"start": start, "sent": sent, "done": done, "errors": errors}


def client_process(
    conn: Connection, url: str, model: str, payloads: list[Arrays], ids: int = 0
) -> None:
    """The client (a :class:`ChildProcess` target): replays each array of arrival times it
    receives through the gRPC front door, request i with sample i mod len(payloads), until
    None. In its own session, so it competes for the cores like another tenant. With
    ``ids`` > 0, request i < ids carries ``str(i)`` as its id (for matching it on the
    server's side)."""
    os.setsid()
    run_client(_client_main(conn, url, model, payloads, ids))


async def _client_main(
    conn: Connection, url: str, model: str, payloads: list[Arrays], ids: int
) -> None:
    import grpc

    from sloline.common.tensors import datatype_of
    from sloline.serving.proto import grpc_service_pb2 as pb
    from sloline.serving.proto import grpc_service_pb2_grpc as pb_grpc

    requests = []
    for i in range(ids or len(payloads)):
        request = pb.ModelInferRequest(model_name=model, id=str(i) if ids else "")
        for name, value in payloads[i % len(payloads)].items():
            request.inputs.add(name=name, datatype=datatype_of(value), shape=list(value.shape))
            request.raw_input_contents.append(np.ascontiguousarray(value).tobytes())
        requests.append(request)
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def infer(i: int) -> None:
            await stub.ModelInfer(requests[i % len(requests)], timeout=REQUEST_TIMEOUT_S)

        while (arrivals := await loop.run_in_executor(None, conn.recv)) is not None:
            conn.send(await replay(infer, np.asarray(arrivals), grpc.aio.AioRpcError))


@dataclass(frozen=True, slots=True)
class InSituRun:
    """What one calibration run measured: the calibration, and the client's view."""

    calibration: Calibration
    latencies_s: np.ndarray  # per answered request, from its send
    sent: int
    errors: dict[str, int]
    slo_s: float
    router_cpu_s: float  # this process's CPU (the router's) while the arrivals were served

    @property
    def attainment(self) -> float:
        """Share of the sent requests answered within the SLO (errors count as misses)."""
        return float(np.count_nonzero(self.latencies_s <= self.slo_s)) / max(1, self.sent)


async def measure_in_situ(
    loaded: LoadedPipeline,
    plan: Plan,
    profile: PipelineProfile,
    arrivals_s: np.ndarray,
    payloads: list[Arrays],
    catalog: HardwareCatalog,
    *,
    warmup_s: float = WARMUP_S,
) -> InSituRun:
    """Serve ``plan`` embedded on ``catalog``'s classes (ephemeral ports, tuner off), send
    ``arrivals_s`` through the gRPC front door after ``warmup_s`` of the same trace
    unmeasured, and measure."""
    from sloline.embedded import EmbeddedPipeline, EmbeddedSettings, stage_configs
    from sloline.serving import process
    from sloline.serving.server import ServerSettings

    settings = EmbeddedSettings(
        server=ServerSettings(http_port=0, grpc_port=0), catalog=catalog, tuner=False
    )
    configs = stage_configs(loaded, settings, plan)
    async with EmbeddedPipeline(loaded, settings, configs=configs, plan=plan) as served:
        await served.wait_ready(180.0)
        process.freeze_startup_heap()  # as `sloline run` serves
        client = process.ChildProcess(
            "calibration client", client_process, served.grpc_url, loaded.name, payloads
        )

        async def send(arrivals: np.ndarray) -> dict[str, Any]:
            """The client's :func:`replay` of ``arrivals``, awaited at most until its drain
            time has passed by a minute."""
            limit_s = float(arrivals[-1]) + DRAIN_S + 60.0 if arrivals.size else 60.0
            result: dict[str, Any] = await client.call_async(arrivals, limit_s)
            return result

        try:
            await send(arrivals_s[arrivals_s < warmup_s])
            since, cpu0 = served.router.clock(), time.process_time()
            result = await send(arrivals_s)
            until, cpu1 = served.router.clock(), time.process_time()
        finally:
            client.close()
        done = result["done"]
        client_latency = (done - result["sent"])[np.isfinite(done)]
        calibration = served.calibration(profile, since, until, client_latency_s=client_latency)
        return InSituRun(
            calibration,
            client_latency,
            int(arrivals_s.size),
            result["errors"],
            served.router.slo_s,
            cpu1 - cpu0,
        )


def calibrate_plan(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    session: PlanningSession,
    trace: np.ndarray,
    *,
    duration_s: float,
    rounds: int,
    out: Path,
    pipeline_file: str,
    report: Callable[[str], None],
) -> None:
    """`sloline calibrate`: serve ``session``'s plan on the arrivals of the planning
    ``trace`` before ``duration_s``, write the calibration to ``out`` and plan again with
    it; while that plan differs from the one served, serve it in turn, at most ``rounds``
    plans in all. What it does and measured goes to ``report``, a line at a time."""
    arrivals = trace[trace < duration_s]
    payloads = load_samples(loaded, ProfilerSettings().samples)
    plan = session.plan
    report(plan.to_table())
    for round_ in range(1, rounds + 1):
        counted = f" (round {round_} of {rounds})" if rounds > 1 else ""
        report(
            f"serving this plan for {duration_s:g} s under its planning load "
            f"({arrivals.size} requests, {arrivals.size / duration_s:.1f} rps){counted} ..."
        )
        calibrated = _calibration_round(
            loaded, catalog, session.profile, plan, trace, arrivals, payloads, out, report
        )
        report(
            f"planning again with this calibration "
            f"(`sloline plan {pipeline_file} --calibration {out}`):"
        )
        try:
            replanned = plan_pipeline(loaded, catalog, profile=calibrated).plan
        except InfeasibleError as exc:  # the calibration is still what was measured
            report(f"no plan meets the SLO with this calibration: {exc}")
            return
        report(replanned.to_table())
        if replanned.config == plan.config:
            if rounds > 1:
                report("settled: the plan made with this calibration is the one it was measured on")
            return
        plan = replanned
    if rounds > 1:
        report(
            f"not settled after {rounds} rounds: the last plan was made with a calibration "
            "of another configuration and has not been served (more --rounds serve it)"
        )


def _calibration_round(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    profile: PipelineProfile,
    plan: Plan,
    trace: np.ndarray,
    arrivals: np.ndarray,
    payloads: list[Arrays],
    out: Path,
    report: Callable[[str], None],
) -> PipelineProfile:
    """Serve ``plan`` on ``arrivals`` with the sample ``payloads``, write the calibration
    to ``out``, report what was measured beside the estimates with and without it, and
    return ``profile`` calibrated."""
    from sloline.serving import process

    q = loaded.pipeline.spec.slo.percentile
    run = process.run(measure_in_situ(loaded, plan, profile, arrivals, payloads, catalog))
    # The router's CPU against the estimator's on the same arrivals, everything else
    # calibrated: the scale of the profile's router costs.
    calibration = run.calibration.with_router_cpu_on(
        run.router_cpu_s, Topology.from_graph(loaded.graph), profile, plan.config, arrivals
    )
    calibration.save(out)
    report(f"{calibration.summary()}\ncalibration written to {out}")
    calibrated = calibration.apply(profile)
    measured = np.percentile(run.latencies_s, q) * 1e3 if run.latencies_s.size else math.nan
    errors = sum(run.errors.values())
    report(
        f"measured: P{q:g} {measured:.1f} ms, attainment {run.attainment:.2%} of {run.sent} "
        f"requests" + (f", {errors} errors: {run.errors}" if errors else "")
    )
    tails = [
        _estimate_on(loaded, catalog, p, plan, times).percentile_s(q) * 1e3
        for p, times in (
            (profile, arrivals),
            (calibrated, arrivals),
            (profile, trace),
            (calibrated, trace),
        )
    ]
    report(
        f"estimated P{q:g} of this plan: on the same arrivals {tails[0]:.1f} ms from the "
        f"profile, {tails[1]:.1f} ms calibrated; on the whole planning trace "
        f"{tails[2]:.1f} and {tails[3]:.1f} ms"
    )
    return calibrated


def _estimate_on(
    loaded: LoadedPipeline,
    catalog: HardwareCatalog,
    profile: PipelineProfile,
    plan: Plan,
    arrivals_s: np.ndarray,
) -> Estimate:
    """The estimator's latencies of ``plan`` on ``arrivals_s`` with ``profile``."""
    problem = PlanningProblem.from_graph(loaded.graph, profile, catalog, arrivals_s)
    return Evaluator(problem).estimate(plan.config)  # both in topology order
